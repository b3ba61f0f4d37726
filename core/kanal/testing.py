"""Testing interceptors without a gateway: a harness that runs a chain with the core's exact semantics.

The harness drives the same dispatcher the gateway's connections use (:mod:`kanal.pipeline.dispatch`):
onion order, short-circuits back through earlier response hooks, per-request notes, the hook
deadline, records hooks per partition, partition errors merged into the Produce response. There is
no socket and no broker: the test says what "upstream" answers. Changed requests and responses are
encoded as the gateway would send them, so a change the wire cannot carry fails the test.

    services = FakeServices(settings={"MY_PLUGIN_LIMIT": "3"})
    harness = Harness(services=services)
    harness.add(MyInterceptor, {"maxPartitions": 3})
    exchange = await harness.request(create_topics_request, upstream=lambda request: ok_response)
    assert exchange.forwarded is None and exchange.response.topics[0].error_code == ErrorCode.policy_violation

:class:`FakeServices` is a :class:`~kanal.api.GatewayServices` without a gateway: in-memory state logs,
a Kafka client that answers with a function you give, settings from a dict, installs recorded, and a
:class:`FakeFleet` whose leader the test chooses:

    fleet = FakeFleet(members=["node-1", "node-2"], leader="node-2")  # this node is "node-1"
    services = FakeServices(fleet=fleet)
    ...
    fleet.rebalance(leader="node-1")  # a new generation: this node leads; fleet.changed() returns
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import trio
from prometheus_client import CollectorRegistry

from kanal.api.context import Connection, RecordsContext, RequestContext, ResponseContext
from kanal.api.errors import LogError, UpstreamError
from kanal.api.interceptor import Interceptor, InterceptorSpec, validate_config
from kanal.api.results import PartitionError
from kanal.api.services import (
    Fleet,
    FleetMember,
    GatewayAcls,
    Identities,
    KafkaClient,
    LogRecord,
    Principal,
    StateLog,
)
from kanal.net.upstream import own_request_class
from kanal.pipeline.chain import Configured, build_chain, configured
from kanal.pipeline.dispatch import Dispatcher, PartitionFailure
from kanal.protocol.api import ApiKey
from kanal.protocol.entities import build, nested
from kanal.protocol.headers import parse_request_header
from kanal.protocol.messages import decode_request_body, decode_response, encode_request, encode_response
from kanal.protocol.records import RecordSet

__all__ = [
    "Exchange",
    "FakeFleet",
    "FakeIdentities",
    "FakeKafka",
    "FakeServices",
    "Harness",
    "MemoryStateLog",
    "fleet_member",
]

Answer = Callable[[Any], Any]  # a request -> its response (or an awaitable of it)


async def _answer(answer: Answer, request: Any) -> Any:
    result = answer(request)
    if inspect.isawaitable(result):
        result = await result
    return result


class FakeTopicNames:
    """Topic ids and names from a dict; ``resolve`` answers the id as text when it is not there;
    ``stored`` names a topic ``prefix + name`` (a virtual cluster's prefix; empty: the name)."""

    def __init__(self, names: Mapping[uuid.UUID, str] | None = None, *, prefix: str = "") -> None:
        self.names = dict(names or {})
        self.prefix = prefix

    def stored(self, name: str) -> str:
        return self.prefix + name

    def name(self, topic_id: uuid.UUID) -> str | None:
        return self.names.get(topic_id)

    def id(self, name: str) -> uuid.UUID | None:
        return next((topic_id for topic_id, known in self.names.items() if known == name), None)

    async def resolve(self, topic_id: uuid.UUID) -> str:
        return self.names.get(topic_id, str(topic_id))


class FakeKafka(KafkaClient):
    """A Kafka client whose cluster is a function: ``answer(request)`` returns the response (raise
    ``UpstreamError`` to fail). Without one every call fails. ``calls`` records (node id, request)."""

    def __init__(self, answer: Answer | None = None) -> None:
        self.answer = answer
        self.calls: list[tuple[int | None, Any]] = []

    def request_class(self, api_key: int) -> Any:
        return own_request_class(api_key, {})

    async def call(self, request: Any, *, node_id: int | None = None, timeout: float | None = None) -> Any:
        self.calls.append((node_id, request))
        if self.answer is None:
            raise UpstreamError("no upstream in this test")
        return await _answer(self.answer, request)

    async def metadata(self, topics: Sequence[str] | None = None) -> Any:
        cls = self.request_class(ApiKey.METADATA)
        requested = None if topics is None else tuple(build(nested(cls, "topics"), name=t) for t in topics)
        return await self.call(build(cls, topics=requested, allow_auto_topic_creation=False))

    async def aclose(self) -> None:
        return None


class MemoryStateLog(StateLog):
    """A state log in memory (``read`` waits for records like a long poll)."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.records: list[LogRecord] = []
        self.created = False
        self.closed = False
        self._changed = trio.Event()

    async def ensure_topic(self) -> None:
        self.created = True

    async def append(self, key: bytes, value: bytes | None) -> int:
        return await self.append_many([(key, value)])

    async def append_many(self, items: Sequence[tuple[bytes, bytes | None]]) -> int:
        if self.closed:
            raise LogError(f"state log {self.topic} is closed")
        for key, value in items:
            self.records.append(LogRecord(len(self.records), key, value, 0))
        self._changed.set()
        self._changed = trio.Event()
        return len(self.records) - 1

    async def end_offset(self) -> int:
        return len(self.records)

    async def read(self, offset: int, max_wait: float = 0.5) -> tuple[list[LogRecord], int]:
        if offset >= len(self.records):
            with trio.move_on_after(max_wait):
                await self._changed.wait()
        found = self.records[offset:]
        return found, offset + len(found)

    async def aclose(self) -> None:
        self.closed = True


class FakeIdentities:
    """:class:`~kanal.api.Identities` with a fixed table of (username, token) logins."""

    def __init__(self, logins: Mapping[tuple[str, str], Principal] | None = None) -> None:
        self.logins = dict(logins or {})

    def verify_token(self, username: str, token: str) -> Principal | None:
        return self.logins.get((username, token))


_KEEP: Any = object()


def fleet_member(node_id: str, *, leader: bool = False, index: int = 0) -> FleetMember:
    """A :class:`~kanal.api.FleetMember` with made-up addresses (node ``index`` of a fleet on one host)."""
    first = 6969 + 10 * index
    return FleetMember(
        node_id=node_id,
        host="127.0.0.1",
        first_port=first,
        last_port=first + 2,
        http_port=8888 + index,
        rack=None,
        version="0.0.0",
        start_time_ms=1_700_000_000_000 + index,
        leader=leader,
    )


class FakeFleet(Fleet):
    """:class:`~kanal.api.Fleet` for tests: the members and the leader are what the test says.

    ``FakeFleet()`` is a fleet of one that this node leads (a gateway alone). ``members`` are node ids
    (made-up addresses) or :class:`~kanal.api.FleetMember` objects, this node's included (added when
    missing); ``leader`` is the leading node's id, or None for no leader (a fleet still joining).
    :meth:`rebalance` makes a new generation and wakes the tasks waiting in :meth:`changed`."""

    def __init__(
        self,
        *,
        node_id: str = "node-1",
        members: Sequence[str | FleetMember] | None = None,
        leader: str | None = _KEEP,
    ) -> None:
        self._node_id = node_id
        self._members: tuple[FleetMember, ...] = ()
        self._leader: str | None = None
        self._generation = 0
        self._changed = trio.Event()
        self.rebalance(
            members=members if members is not None else [node_id], leader=node_id if leader is _KEEP else leader
        )

    def rebalance(self, *, members: Sequence[str | FleetMember] = _KEEP, leader: str | None = _KEEP) -> None:
        """A new generation of the group: ``members`` and ``leader`` as given (unchanged when left
        out); the generation goes up by one and :meth:`changed` returns in every waiting task."""
        if members is not _KEEP:
            listed = [m if isinstance(m, FleetMember) else fleet_member(m, index=i) for i, m in enumerate(members)]
            if not any(m.node_id == self._node_id for m in listed):
                listed.append(fleet_member(self._node_id, index=len(listed)))
            self._members = tuple(listed)
        if leader is not _KEEP:
            self._leader = leader
        self._generation += 1
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def lead(self) -> None:
        """A new generation that this node leads."""
        self.rebalance(leader=self._node_id)

    def follow(self, leader: str) -> None:
        """A new generation led by node ``leader`` (added to the members when missing)."""
        if not any(m.node_id == leader for m in self._members):
            self.rebalance(members=[*self._members, leader], leader=leader)
        else:
            self.rebalance(leader=leader)

    @property
    def node_id(self) -> str:
        return self._node_id

    @property
    def members(self) -> tuple[FleetMember, ...]:
        return tuple(replace(m, leader=m.node_id == self._leader) for m in self._members)

    @property
    def leader(self) -> FleetMember | None:
        return next((m for m in self.members if m.leader), None)

    @property
    def is_leader(self) -> bool:
        return self._leader == self._node_id

    @property
    def generation(self) -> int:
        return self._generation

    async def changed(self) -> None:
        await self._changed.wait()


class FakeServices:
    """:class:`~kanal.api.GatewayServices` for tests, with what a plugin did kept for assertions:
    ``installed`` (the specs of every ``install`` call), ``logs`` (state logs by topic), ``tasks``
    (started with ``start_soon``; :meth:`run_tasks` runs them), ``audited`` (the ``audit`` calls:
    event type, connection, event data). ``fleet`` is a :class:`FakeFleet` (alone and leading unless
    the test gives another)."""

    def __init__(
        self,
        *,
        cluster_id: str = "test",
        settings: Mapping[str, str] | None = None,
        kafka: KafkaClient | None = None,
        topic_names: Mapping[uuid.UUID, str] | FakeTopicNames | None = None,
        identities: Identities | None = None,
        acls: GatewayAcls | None = None,
        hook_timeout: float = 10.0,
        fleet: Fleet | None = None,
    ) -> None:
        self._cluster_id = cluster_id
        self._fleet = fleet if fleet is not None else FakeFleet()
        self._hook_timeout = hook_timeout
        self._acls = acls
        self._identities = identities if identities is not None else FakeIdentities()
        self.environ = dict(settings or {})
        self._metrics = CollectorRegistry()
        self._topic_names = topic_names if isinstance(topic_names, FakeTopicNames) else FakeTopicNames(topic_names)
        self._kafka = kafka if kafka is not None else FakeKafka()
        self._shared: dict[str, Any] = {}
        self.installed: list[list[InterceptorSpec]] = []
        self.logs: dict[str, MemoryStateLog] = {}
        self.tasks: list[tuple[Callable[..., Awaitable[Any]], tuple[Any, ...]]] = []
        self.connected: list[Mapping[str, str]] = []
        self.audited: list[tuple[str, Connection | None, Any]] = []

    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    @property
    def metrics(self) -> CollectorRegistry:
        return self._metrics

    @property
    def topic_names(self) -> FakeTopicNames:
        return self._topic_names

    @property
    def kafka(self) -> KafkaClient:
        return self._kafka

    @property
    def shared(self) -> dict[str, Any]:
        return self._shared

    @property
    def identities(self) -> Identities:
        return self._identities

    @property
    def hook_timeout(self) -> float:
        return self._hook_timeout

    @property
    def fleet(self) -> Fleet:
        return self._fleet

    @property
    def acls(self) -> GatewayAcls | None:
        return self._acls

    def settings(self, prefix: str) -> Mapping[str, str]:
        return {key: value for key, value in self.environ.items() if key.startswith(prefix)}

    def feature(self, name: str, default: bool = False) -> bool:
        raw = self.environ.get("GATEWAY_FEATURE_FLAGS_" + name.upper())
        if raw is None:
            return default
        return raw.strip().lower() in ("true", "1", "yes", "on")

    def install(self, specs: Sequence[InterceptorSpec]) -> None:
        self.installed.append(list(specs))

    def state_log(self, topic: str, *, compacted: bool = True, retention_ms: int | None = None) -> StateLog:
        log = self.logs.get(topic)
        if log is None or log.closed:
            log = self.logs[topic] = MemoryStateLog(topic)
        return log

    def connect(self, properties: Mapping[str, str]) -> KafkaClient:
        self.connected.append(dict(properties))
        return FakeKafka()

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str | None = None) -> None:
        self.tasks.append((fn, args))

    def audit(self, event_type: str, connection: Connection | None, event_data: Any) -> None:
        self.audited.append((event_type, connection, event_data))

    async def run_tasks(self) -> None:
        """Runs the tasks started so far, concurrently, until they all return."""
        async with trio.open_nursery() as nursery:
            for fn, args in self.tasks:
                nursery.start_soon(fn, *args)


@dataclass(slots=True)
class Exchange:
    """What one request did: ``forwarded`` is the request the broker got (None when an interceptor
    answered), ``response`` what the client got (None for acks=0), ``upstream_calls`` the requests
    the interceptors sent themselves (``ctx.send_request``), ``client_id`` the client id in the
    header of the forwarded request."""

    forwarded: Any
    response: Any
    failures: list[PartitionFailure] = field(default_factory=list)
    upstream_calls: list[Any] = field(default_factory=list)
    client_id: str | None = None


class Harness:
    """A chain of interceptors, run as the gateway runs it, with no sockets."""

    def __init__(
        self,
        *,
        services: FakeServices | None = None,
        connection: Connection | None = None,
        hook_timeout: float = 10.0,
    ) -> None:
        self.services = services if services is not None else FakeServices(hook_timeout=hook_timeout)
        self.connection = connection or Connection(1, "127.0.0.1:50000", "127.0.0.1:6969", 0, client_id="test")
        self.hook_timeout = hook_timeout
        self._items: list[Configured] = []
        self._dispatcher: Dispatcher | None = None

    def add(
        self, cls: type[Interceptor], config: Mapping[str, Any] | None = None, *, name: str | None = None
    ) -> Interceptor:
        """Validates ``config`` as the core does (an ``InterceptorConfigError`` naming the field when it
        is bad), constructs the interceptor with the harness's services and appends it to the chain
        (innermost); returns it."""
        spec = InterceptorSpec(name or f"{cls.plugin_name or cls.__name__}-{len(self._items) + 1}", cls.plugin_name)
        instance = cls(validate_config(cls, dict(config or {})), self.services)
        return self.append(instance, spec.name)

    def append(self, instance: Interceptor, name: str | None = None) -> Interceptor:
        """Appends an interceptor built by the test (innermost)."""
        spec = InterceptorSpec(name or f"{type(instance).__name__}-{len(self._items) + 1}", type(instance).plugin_name)
        self._items.append(configured(spec, instance))
        self._dispatcher = None
        return instance

    @property
    def dispatcher(self) -> Dispatcher:
        if self._dispatcher is None:
            chain = build_chain(self._items)
            self._dispatcher = Dispatcher(chain, self.services.topic_names, self.hook_timeout)
        return self._dispatcher

    async def open(self) -> None:
        """Runs the ``kanal_connection_opened`` hooks."""
        await self.dispatcher.opened(self.connection)

    async def close(self) -> None:
        """Runs the ``kanal_connection_closed`` hooks, then closes every interceptor (``aclose``)."""
        await self.dispatcher.closed(self.connection)
        for item in self._items:
            await item.instance.aclose()

    async def request(
        self,
        request: Any,
        upstream: Answer | None = None,
        *,
        correlation_id: int = 1,
        client_id: str | None = "test",
    ) -> Exchange:
        """Sends ``request`` (a kio request) through the chain. ``upstream(request)`` is the broker:
        it gets what the chain forwards (decoded from the bytes the gateway would send) and returns
        the response, or the response to a request an interceptor sent itself."""
        api_key, version = int(request.__api_key__), int(request.__version__)
        calls: list[Any] = []

        async def send_own(own: Any) -> Any:
            calls.append(own)
            if upstream is None:
                raise UpstreamError("no upstream in this test")
            return await _answer(upstream, own)

        self.connection.client_id = client_id
        ctx = RequestContext(
            self.connection,
            api_key,
            version,
            correlation_id,
            client_id,
            request,
            self.services.topic_names,
            _sender=send_own,
        )
        expects = api_key != ApiKey.PRODUCE or request.acks != 0
        outcome = await self.dispatcher.request(ctx, expects)
        if outcome.request is None:
            return Exchange(None, _wire_response(outcome.answer, correlation_id), outcome.failures, calls)
        forwarded = outcome.request
        sent_as = ctx.client_id
        if forwarded is not request or sent_as != client_id:
            frame = encode_request(forwarded, correlation_id, sent_as)
            forwarded = decode_request_body(api_key, version, frame, _body_offset(frame))
        expects = api_key != ApiKey.PRODUCE or forwarded.acks != 0
        if upstream is None or not expects:
            return Exchange(forwarded, None, outcome.failures, calls, sent_as)
        body = await _answer(upstream, forwarded)
        response = ResponseContext(
            self.connection,
            api_key,
            version,
            correlation_id,
            client_id,
            forwarded,
            body,
            self.services.topic_names,
            outcome.notes,
            _sender=send_own,
        )
        result = await self.dispatcher.response(response, failures=outcome.failures)
        if result is body:  # unchanged: the gateway forwards the broker's bytes
            return Exchange(forwarded, body, outcome.failures, calls, sent_as)
        return Exchange(forwarded, _wire_response(result, correlation_id), outcome.failures, calls, sent_as)

    async def records(
        self,
        topic: str,
        partition: int,
        records: bytes | RecordSet,
        *,
        fetch: bool = False,
        api_version: int | None = None,
    ) -> tuple[RecordSet, PartitionError | None]:
        """Runs the produce (or, with ``fetch``, the fetch) records hooks over one partition's
        records; returns the records as the hooks left them and the partition error, if any."""
        record_set = records if isinstance(records, RecordSet) else RecordSet.parse(records)
        api_key = ApiKey.FETCH if fetch else ApiKey.PRODUCE
        ctx = RecordsContext(
            self.connection,
            api_key,
            api_version if api_version is not None else (16 if fetch else 9),
            self.connection.client_id,
            topic,
            partition,
            record_set,
            self.services.topic_names.stored(topic),
        )
        chain = self.dispatcher.chain
        entries = chain.fetch_records if fetch else chain.produce_records
        stage = "fetch_records" if fetch else "produce_records"
        error = await self.dispatcher.records(entries, ctx, stage, api_key)
        return record_set, error


def _body_offset(frame: bytearray) -> int:
    return parse_request_header(frame).body_offset


def _wire_response(body: Any, correlation_id: int) -> Any:
    """The response as the client decodes it from the bytes the gateway sends."""
    if body is None:
        return None
    frame = encode_response(body, correlation_id)
    return decode_response(int(body.__api_key__), int(body.__version__), frame)
