"""What hooks receive: the connection, the request or response, and gateway services."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kanal.protocol.records import RecordSet
    from kanal.protocol.topic_names import TopicNames


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


@dataclass(slots=True, eq=False)
class RequestContext:
    """A decoded request on its way upstream. Hooks may replace ``request`` (kio messages are
    frozen: use ``dataclasses.replace``); the core re-encodes it only if it changed."""

    connection: Connection
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    request: Any
    topic_names: TopicNames
    response_wanted: bool = False

    def want_response(self) -> None:
        """Asks for this request's response to be decoded and given to the response hooks (for
        interceptors with ``responses_on_demand``; others see every response they declared)."""
        self.response_wanted = True


@dataclass(slots=True, eq=False)
class ResponseContext:
    """A decoded response on its way to the client; ``request`` is the decoded request when the
    request was decoded too, else None."""

    connection: Connection
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    request: Any
    response: Any
    topic_names: TopicNames


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
