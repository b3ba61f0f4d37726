"""What hooks receive: the connection, the request or response, and ways to act on them.

A request and its response share their per-request notes: what an interceptor's ``kanal_request``
puts in ``ctx.notes`` its ``kanal_response`` finds in ``ctx.notes`` for the same request (each
interceptor has notes of its own), so no plugin keeps a map keyed by correlation id.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kanal.api.services import TopicNames
    from kanal.protocol.records import RecordSet

__all__ = ["Connection", "Notes", "RecordsContext", "RequestContext", "ResponseContext", "Sender"]

Sender = Callable[[Any], Awaitable[Any]]


@dataclass(slots=True, eq=False)
class Connection:
    """One client connection. Owned by one task: plugins may keep per-connection state in
    ``state`` without locks."""

    id: int
    client_address: str
    listener_address: str
    node_id: int
    principal: str | None = None
    groups: tuple[str, ...] = ()
    vcluster: str | None = None
    client_id: str | None = None
    state: dict[str, Any] = field(default_factory=dict)


class Notes:
    """The notes of one request, one dict per interceptor (created when first asked for)."""

    __slots__ = ("_by_position",)

    def __init__(self) -> None:
        self._by_position: dict[int, dict[str, Any]] = {}

    def of(self, position: int) -> dict[str, Any]:
        notes = self._by_position.get(position)
        if notes is None:
            notes = self._by_position[position] = {}
        return notes


async def _no_sender(request: Any) -> Any:
    raise RuntimeError("send_request is not available here")


@dataclass(slots=True, eq=False)
class RequestContext:
    """A decoded request on its way upstream. Hooks may replace ``request`` (kio messages are
    frozen: use ``dataclasses.replace``) and ``client_id`` (the request header's: the request goes
    upstream with it); the core re-encodes the request only if either changed."""

    connection: Connection
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    request: Any
    topic_names: TopicNames
    response_wanted: bool = False
    _notes: Notes | None = None
    _position: int = 0
    _sender: Sender = _no_sender

    def want_response(self) -> None:
        """Asks for this request's response to be decoded and given to the response hooks (for
        interceptors with ``responses_on_demand``; others see every response they declared)."""
        self.response_wanted = True

    @property
    def notes(self) -> dict[str, Any]:
        """This interceptor's notes on this request; its ``kanal_response`` sees the same dict."""
        if self._notes is None:
            self._notes = Notes()
        return self._notes.of(self._position)

    async def send_request(self, request: Any) -> Any:
        """Sends a kio request of your own on this client's upstream connection (so it sees what
        the client's requests see: the same broker, its credentials, its order) and returns the
        decoded response. The client never sees either. Its API version is the request class's."""
        return await self._sender(request)


@dataclass(slots=True, eq=False)
class ResponseContext:
    """A decoded response on its way to the client; ``request`` is the decoded request when the
    request was decoded too, else None. ``response`` may be replaced."""

    connection: Connection
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    request: Any
    response: Any
    topic_names: TopicNames
    _notes: Notes | None = None
    _position: int = 0
    _sender: Sender = _no_sender

    @property
    def notes(self) -> dict[str, Any]:
        """The notes this interceptor's ``kanal_request`` left on this request (empty if none)."""
        if self._notes is None:
            self._notes = Notes()
        return self._notes.of(self._position)

    async def send_request(self, request: Any) -> Any:
        """Sends a kio request of your own to the broker this client's connection goes to, on the
        gateway's own connection to it (the client's connection is busy delivering responses in
        order), and returns the decoded response."""
        return await self._sender(request)


@dataclass(slots=True, eq=False)
class RecordsContext:
    """The records of one topic-partition of a Produce request or a Fetch response. Change them
    through ``records`` (see RecordSet); untouched batches are forwarded byte for byte."""

    connection: Connection
    api_key: int
    api_version: int
    client_id: str | None
    topic: str
    partition: int
    records: RecordSet
    #: The name the cluster stores ``topic`` under (see ``TopicNames.stored``); ``topic`` when not given.
    stored_topic: str = ""

    def __post_init__(self) -> None:
        if not self.stored_topic:
            self.stored_topic = self.topic
