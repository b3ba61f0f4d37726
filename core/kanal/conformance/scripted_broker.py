"""A Kafka endpoint that answers from a capture, for replays without a live broker.

Each upstream connection the gateway opens for a client is *bound* to one captured connection: the
replayer announces which captured connection it is about to open (:meth:`ScriptedBroker.expect`)
and connects; the gateway opens its upstream connection on the client's first request, and the next
connection the broker accepts is bound to it. The gateway's own control connection (opened before
the replay starts) stays unbound.

On a bound connection a request is matched to the captured requests of that connection by api key
and version, in order: the first unanswered captured request with an identical body wins, else the
first unanswered one with the same key and version. The broker answers with the captured response,
its correlation id set to the request's (the gateway's own). When the gateway forwarded a Produce
that differs from the captured one (an interceptor failed some partitions), the captured response
is limited to the partitions the forwarded request holds. A captured request without a response
(a Fetch pending when the client closed, a Produce with acks=0) is held unanswered. A request that
matches nothing is a problem of the replay; the connection is closed.

Broker addresses in the answers (Metadata, DescribeCluster, FindCoordinator, Produce/Fetch leader
hints) are rewritten from the captured broker addresses to the broker's own, so that every
connection the gateway opens comes back here. On the unbound control connection, ApiVersions and
Metadata at any version are synthesized from the capture (the first ApiVersions response; brokers
and topics of the Metadata responses); other requests get the first captured answer of the same
key and version.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any, Union, get_args, get_origin

import trio

from kanal.conformance.frames import Capture, Exchange, Frame
from kanal.protocol.api import ApiKey, api_name, response_class
from kanal.protocol.entities import build, hints
from kanal.protocol.framing import FrameReader
from kanal.protocol.headers import InvalidHeader, parse_request_header, produce_acks, set_response_correlation_id
from kanal.protocol.messages import decode_request, decode_response, encode_response
from kanal.protocol.rewrite import carries_addresses

log = logging.getLogger(__name__)

Address = tuple[str, int]


# -- capture facts ------------------------------------------------------------------------------


def _decode(frame: Frame) -> Any | None:
    if frame.api_key is None or frame.api_version is None or response_class(frame.api_key, frame.api_version) is None:
        return None
    try:
        return decode_response(frame.api_key, frame.api_version, frame.data)
    except Exception:
        return None


def _walk_addresses(value: Any, found: dict[Address, int]) -> None:
    if is_dataclass(value) and not isinstance(value, type):
        host, port = getattr(value, "host", None), getattr(value, "port", None)
        node = getattr(value, "node_id", getattr(value, "broker_id", None))
        if isinstance(host, str) and isinstance(port, int) and isinstance(node, int) and node >= 0:
            found.setdefault((host, port), node)
        for f in fields(value):
            child = getattr(value, f.name)
            if isinstance(child, tuple) or (is_dataclass(child) and not isinstance(child, type)):
                _walk_addresses(child, found)
    elif isinstance(value, tuple):
        for item in value:
            if is_dataclass(item) and not isinstance(item, type):
                _walk_addresses(item, found)


def broker_addresses(frames: list[Frame]) -> dict[Address, int]:
    """The broker addresses the responses announce, with their broker ids."""
    found: dict[Address, int] = {}
    for frame in frames:
        key, version = frame.api_key, frame.api_version
        if key is not None and version is not None and carries_addresses(key, version):
            body = _decode(frame)
            if body is not None:
                _walk_addresses(body, found)
    return found


def convert(value: Any, cls: type) -> Any:
    """A kio entity re-expressed as another version's class: shared fields copied (nested
    entities converted), new fields neutral."""
    types = hints(cls)
    values: dict[str, Any] = {}
    for f in fields(cls):
        if not hasattr(value, f.name):
            continue
        item = getattr(value, f.name)
        kind = types[f.name]
        args = get_args(kind)
        nullable = type(None) in args and (get_origin(kind) is Union or type(kind).__name__ == "UnionType")
        if item is None:
            if nullable:
                values[f.name] = None
            continue
        if get_origin(kind) is tuple and args and isinstance(args[0], type) and is_dataclass(args[0]):
            values[f.name] = tuple(convert(x, args[0]) for x in item)
        elif isinstance(kind, type) and is_dataclass(kind):
            values[f.name] = convert(item, kind)
        elif nullable and any(isinstance(a, type) and is_dataclass(a) for a in args):
            inner = next(a for a in args if isinstance(a, type) and is_dataclass(a))
            values[f.name] = convert(item, inner)
        else:
            values[f.name] = item
    return build(cls, **values)


def retarget(value: Any, addresses: dict[Address, int], target: Address) -> Any:
    """``value`` with every broker address of ``addresses`` replaced by ``target`` (same object
    when nothing changed)."""
    if isinstance(value, tuple):
        new = tuple(retarget(v, addresses, target) for v in value)
        return value if all(a is b for a, b in zip(value, new, strict=True)) else new
    if not (is_dataclass(value) and not isinstance(value, type)):
        return value
    changes: dict[str, Any] = {}
    host, port = getattr(value, "host", None), getattr(value, "port", None)
    if isinstance(host, str) and isinstance(port, int) and (host, port) in addresses and (host, port) != target:
        changes["host"], changes["port"] = target
    for f in fields(value):
        child = getattr(value, f.name)
        if isinstance(child, tuple) or (is_dataclass(child) and not isinstance(child, type)):
            new_child = retarget(child, addresses, target)
            if new_child is not child:
                changes[f.name] = new_child
    return replace(value, **changes) if changes else value


# -- the broker ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Received:
    """A request the gateway sent upstream, and the captured exchange it was matched to."""

    conn: int | None
    data: bytes
    exchange: Exchange | None
    t: float


@dataclass
class _Session:
    conn: int
    exchanges: list[Exchange]
    used: list[bool]
    stream: trio.SocketStream | None = None
    held: int = 0
    closed: trio.Event = field(default_factory=trio.Event)
    arrived: int = 0


class ScriptedBroker:
    """Serves one capture; see the module docstring."""

    def __init__(self, capture: Capture, host: str = "127.0.0.1") -> None:
        self.capture = capture
        self.host = host
        self.address: Address = (host, 0)
        self.captured_brokers = broker_addresses(capture.upstream_responses())
        self.problems: list[str] = []
        self.received: list[Received] = []
        self._sessions: dict[int, _Session] = {}
        self._binding: tuple[int, trio.Event] | None = None
        self._answers: dict[int, bytes] = {}
        self._listeners: list[trio.SocketListener] = []
        self._changed = trio.Condition()

    # -- control by the replayer ----------------------------------------------------------------

    def expect(self, conn: int) -> trio.Event:
        """The next accepted connection stands for captured connection ``conn``; the event is set
        when it has been accepted."""
        event = trio.Event()
        self._binding = (conn, event)
        return event

    def expect_nothing(self) -> None:
        """Withdraws an :meth:`expect` that no connection answered."""
        self._binding = None

    def arrived(self, conn: int) -> int:
        """How many requests the bound connection of ``conn`` received so far."""
        session = self._sessions.get(conn)
        return 0 if session is None else session.arrived

    async def wait_arrived(self, conn: int, count: int) -> None:
        """Waits until the upstream connection of ``conn`` has received ``count`` requests."""
        async with self._changed:
            while self.arrived(conn) < count:
                await self._changed.wait()

    async def release(self, conn: int) -> None:
        """The client of ``conn`` is gone: close its upstream connection (as a broker does when a
        client closes with a request pending)."""
        session = self._sessions.get(conn)
        if session is not None and session.stream is not None:
            with trio.CancelScope(shield=True):
                await session.stream.aclose()

    # -- serving --------------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host=self.host)
        self._listeners = listeners
        sockname = listeners[0].socket.getsockname()
        self.address = (str(sockname[0]), int(sockname[1]))
        await trio.serve_listeners(self._handle, listeners, task_status=_Started(task_status, self.address))

    async def _handle(self, stream: trio.SocketStream) -> None:
        binding, self._binding = self._binding, None
        session: _Session | None = None
        if binding is not None:
            conn, event = binding
            exchanges = self.capture.upstream.get(conn, [])
            session = _Session(conn, exchanges, [False] * len(exchanges), stream)
            self._sessions[conn] = session
            event.set()
        try:
            await self._serve_connection(stream, session)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            if session is not None:
                session.closed.set()
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _serve_connection(self, stream: trio.SocketStream, session: _Session | None) -> None:
        reader = FrameReader()
        while True:
            data = await stream.receive_some(1 << 20)
            if not data:
                return
            for frame in reader.feed(data):
                try:
                    answer = await self._answer(bytes(frame), session)
                except _Close:
                    return
                if answer is None:
                    continue
                await stream.send_all(len(answer).to_bytes(4, "big") + answer)

    async def _answer(self, data: bytes, session: _Session | None) -> bytes | None:
        try:
            header = parse_request_header(data)
        except InvalidHeader as exc:
            self.problems.append(f"upstream received an unreadable request: {exc}")
            raise _Close from None
        key, version, corr = header.api_key, header.api_version, header.correlation_id
        where = f"conn {session.conn}" if session is not None else "the gateway's control connection"
        answer: bytes | None
        if session is None:
            exchange = None
            answer = self._synthesize(key, version)
            if answer is None:
                exchange = self._any_exchange(key, version)
                answer = self._rewritten(exchange.response) if exchange and exchange.response else None
            self.received.append(Received(None, data, exchange, time.time()))
            if answer is None:
                self.problems.append(f"{api_name(key)} v{version} request on {where}: the capture has no answer for it")
                raise _Close
        else:
            exchange = self._match(session, key, version, data, header.body_offset)
            self.received.append(Received(session.conn, data, exchange, time.time()))
            session.arrived += 1
            async with self._changed:
                self._changed.notify_all()
            if exchange is None:
                self.problems.append(
                    f"{api_name(key)} v{version} request upstream on {where}: no captured {api_name(key)} v{version} "
                    "request of this connection is left to answer it (closing the upstream connection)"
                )
                raise _Close
            if exchange.response is None:
                if not (key == ApiKey.PRODUCE and produce_acks(data, header) == 0):
                    session.held += 1  # a request the broker had not answered when the client left
                return None
            if session.held:
                self.problems.append(
                    f"{api_name(key)} v{version} request upstream on {where} came after a request the capture left "
                    "unanswered; answering it would break response order (closing the upstream connection)"
                )
                raise _Close
            answer = self._rewritten(exchange.response)
            if key == ApiKey.PRODUCE and data[8:] != exchange.request.data[8:]:
                answer = _produce_for(answer, exchange.response, data)
        out = bytearray(answer)
        set_response_correlation_id(out, corr)
        return bytes(out)

    def _match(self, session: _Session, key: int, version: int, data: bytes, body_offset: int) -> Exchange | None:
        candidates = [
            i
            for i, ex in enumerate(session.exchanges)
            if not session.used[i] and ex.request.api_key == key and ex.request.api_version == version
        ]
        if not candidates:
            return None
        chosen = candidates[0]
        body = data[8:]
        for i in candidates:
            if session.exchanges[i].request.data[8:] == body:
                chosen = i
                break
        session.used[chosen] = True
        return session.exchanges[chosen]

    def _any_exchange(self, key: int, version: int) -> Exchange | None:
        for exchanges in self.capture.upstream.values():
            for ex in exchanges:
                if ex.request.api_key == key and ex.request.api_version == version and ex.response is not None:
                    return ex
        return None

    def _rewritten(self, frame: Frame) -> bytes:
        """The captured response with the captured broker addresses replaced by ours."""
        cached = self._answers.get(id(frame))
        if cached is not None:
            return cached
        answer = frame.data
        if (
            frame.api_key is not None
            and frame.api_version is not None
            and carries_addresses(frame.api_key, frame.api_version)
            and self.captured_brokers
        ):
            body = _decode(frame)
            if body is not None:
                new = retarget(body, self.captured_brokers, self.address)
                if new is not body:
                    answer = bytes(encode_response(new, frame.correlation_id or 0))
        self._answers[id(frame)] = answer
        return answer

    # -- synthesized answers for the gateway's own calls ------------------------------------------

    def _synthesize(self, key: int, version: int) -> bytes | None:
        if key == ApiKey.API_VERSIONS:
            body = self._api_versions(version)
        elif key == ApiKey.METADATA:
            body = self._metadata(version)
        else:
            return None
        return None if body is None else bytes(encode_response(body, 0))

    def _responses(self, key: int) -> list[Any]:
        return [b for f in self.capture.upstream_responses() if f.api_key == key and (b := _decode(f)) is not None]

    def _api_versions(self, version: int) -> Any | None:
        cls = response_class(ApiKey.API_VERSIONS, version)
        if cls is None:
            return None
        for body in self._responses(ApiKey.API_VERSIONS):
            if int(body.error_code) == 0 and body.api_keys:
                return convert(body, cls)
        seen: dict[int, tuple[int, int]] = {}
        for exchanges in self.capture.upstream.values():
            for ex in exchanges:
                k, v = ex.request.api_key, ex.request.api_version
                if k is not None and v is not None:
                    low, high = seen.get(k, (v, v))
                    seen[k] = (min(low, v), max(high, v))
        seen.setdefault(ApiKey.API_VERSIONS, (0, 3))
        key_cls = hints(cls)["api_keys"].__args__[0]
        entries = tuple(
            build(key_cls, api_key=k, min_version=lo, max_version=hi) for k, (lo, hi) in sorted(seen.items())
        )
        return build(cls, api_keys=entries)

    def _metadata(self, version: int) -> Any | None:
        cls = response_class(ApiKey.METADATA, version)
        if cls is None:
            return None
        bodies = self._responses(ApiKey.METADATA)
        base = next((b for b in reversed(bodies) if b.brokers), None)
        topics: dict[str, Any] = {}
        for body in bodies:
            for topic in body.topics:
                if topic.name and int(topic.error_code) == 0:
                    topics[str(topic.name)] = topic
        if base is None:  # no Metadata captured: announce the brokers the frames name, here
            broker_cls = hints(cls)["brokers"].__args__[0]
            nodes = sorted({f.node for f in self.capture.frames if f.node is not None})
            brokers = tuple(build(broker_cls, node_id=n, host=self.address[0], port=self.address[1]) for n in nodes)
            return build(cls, brokers=brokers, controller_id=nodes[0] if nodes else -1)
        merged = replace(base, topics=tuple(topics.values()))
        return retarget(convert(merged, cls), self.captured_brokers, self.address)

    async def aclose(self) -> None:
        for listener in self._listeners:
            await listener.aclose()


def _produce_for(answer: bytes, captured: Frame, request: bytes) -> bytes:
    """A captured Produce response limited to the partitions of the request the gateway forwarded
    (an interceptor may have failed some partitions before forwarding)."""
    try:
        _, body = decode_request(request)
        response = decode_response(0, int(body.__version__), answer)
    except Exception:
        return answer
    wanted = {(_topic_key(t), int(p.index)) for t in body.topic_data for p in t.partition_data}
    topics = []
    for topic in response.responses:
        parts = tuple(p for p in topic.partition_responses if (_topic_key(topic), int(p.index)) in wanted)
        if parts:
            topics.append(replace(topic, partition_responses=parts))
    kept = sum(len(t.partition_responses) for t in topics)
    if kept == sum(len(t.partition_responses) for t in response.responses):
        return answer
    return bytes(encode_response(replace(response, responses=tuple(topics)), captured.correlation_id or 0))


def _topic_key(topic: Any) -> Any:
    name = getattr(topic, "name", None)
    return name if name else getattr(topic, "topic_id", None)


class _Close(Exception):
    """Ends the connection being served (after a problem was recorded)."""


class _Started:
    """Reports the broker's address (not the listeners) to the task that started it."""

    def __init__(self, status: trio.TaskStatus[Address], address: Address) -> None:
        self._status = status
        self._address = address

    def started(self, value: Any = None) -> None:
        self._status.started(self._address)
