"""``fetch-policy`` and KIP-227 incremental fetch sessions: every Fetch of a session is checked
against the topics the session fetches, not only those the Fetch lists.

The unit tests run the policy in :class:`~kanal.testing.Harness` with a broker that opens sessions.
The end-to-end tests need such a broker too, and Tansu is not one: it answers session id 0 to every
Fetch, so kafka-python (which uses sessions; librdkafka does not) keeps sending full fetches to it.
The gateway there gets an innermost test interceptor, :class:`SessionBroker`, that plays the
broker's part of KIP-227 in front of Tansu: it keeps each session's partitions, sends Tansu a full
sessionless Fetch of them and answers with the session id. The policy, in front of it, sees
exactly what a client sends a broker that supports sessions. Those gateways run with
GATEWAY_FEATURE_FLAGS_INCREMENTAL_FETCH_SESSIONS_ENABLED=true; with it false the only difference is
that the cache may run, and it sends the session-opening Fetch sessionless (tested too).
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import kafka
import kanal_safeguards.plugin
import pytest
import trio
from confluent_kafka import Producer
from kanal_safeguards.caching.cache import SESSIONS_VARIABLE, Cache
from kanal_safeguards.policies import fetch_sessions
from kanal_safeguards.policies.fetch_policy import FetchPolicy
from kanal_safeguards.policies.fetch_sessions import FetchSessions, SessionTopic
from safeguard_clients import (
    audit_events,
    bootstrap_of,
    create_topics,
    direct,
    inprocess_gateway,
    spec,
    wait_for,
)
from wire import WireClient

from kanal.api import (
    ApiKey,
    ErrorCode,
    Interceptor,
    RequestContext,
    RequestResult,
    Respond,
    ResponseContext,
    ResponseResult,
    build,
    hookimpl,
    nested,
    require_request_class,
    response_class,
)
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway
from kanal.testing import Exchange, FakeServices, Harness

Topics = Mapping[str | uuid.UUID, Sequence[int]]  # topic name (or id, Fetch v13+) -> partitions

READ_COMMITTED, READ_UNCOMMITTED = 1, 0
BLOCK_UNCOMMITTED = {"topic": "orders-.*", "isolationLevel": {"value": "read_committed"}}
INFO_UNCOMMITTED = {"topic": "orders-.*", "isolationLevel": {"value": "read_committed", "action": "INFO"}}


def fetch_request(
    session: tuple[int, int],
    topics: Topics | None = None,
    forgotten: Topics | None = None,
    *,
    isolation: int = READ_COMMITTED,
    version: int = 12,
) -> Any:
    """A Fetch of ``session`` (session id, epoch) listing ``topics`` and forgetting ``forgotten``."""
    topics, forgotten = topics or {}, forgotten or {}
    cls = require_request_class(ApiKey.FETCH, version)
    topic_cls, forgotten_cls = nested(cls, "topics"), nested(cls, "forgotten_topics_data")
    part_cls = nested(topic_cls, "partitions")

    def named(key: str | uuid.UUID) -> dict[str, Any]:
        return {"topic_id": key} if isinstance(key, uuid.UUID) else {"topic": key}

    def part(index: int) -> Any:
        return build(part_cls, partition=index, current_leader_epoch=-1, fetch_offset=0, partition_max_bytes=1 << 20)

    return build(
        cls,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=50),
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=isolation,
        session_id=session[0],
        session_epoch=session[1],
        topics=tuple(build(topic_cls, **named(k), partitions=tuple(part(p) for p in ps)) for k, ps in topics.items()),
        forgotten_topics_data=tuple(
            build(forgotten_cls, **named(k), partitions=tuple(ps)) for k, ps in forgotten.items()
        ),
    )


def broker(session_id: int, error: ErrorCode = ErrorCode.none) -> Callable[[Any], Any]:
    """A broker answering every Fetch with ``session_id`` (what it opened or continued) and an
    empty answer for each partition it was asked."""

    def answer(request: Any) -> Any:
        cls = response_class(ApiKey.FETCH, int(request.__version__))
        assert cls is not None
        topic_cls = nested(cls, "responses")
        part_cls = nested(topic_cls, "partitions")
        topics = tuple(
            build(
                topic_cls,
                **{k: getattr(t, k) for k in ("topic", "topic_id") if hasattr(t, k)},
                partitions=tuple(build(part_cls, partition_index=p.partition) for p in t.partitions),
            )
            for t in request.topics
        )
        return build(cls, error_code=error, session_id=session_id, responses=topics)

    return answer


ORDERS_ID = uuid.UUID("00000000-0000-0000-0000-0000000000a1")  # the id of orders-1 (Fetch v13+)


class Client:
    """One client connection to a chain in a harness (a fetch-policy of ``config`` by default)."""

    def __init__(self, config: Mapping[str, Any] | None = None, harness: Harness | None = None) -> None:
        self.harness = harness or Harness(services=FakeServices(topic_names={ORDERS_ID: "orders-1"}))
        if config is not None:
            self.policy = self.harness.add(FetchPolicy, dict(config))
        self.correlation = itertools.count(1)

    def send(self, request: Any, upstream: Callable[[Any], Any]) -> Exchange:
        """``request`` through the chain; ``upstream`` answers what reaches the broker."""
        exchange: Exchange = trio.run(self._send, request, upstream)
        return exchange

    async def _send(self, request: Any, upstream: Callable[[Any], Any]) -> Exchange:
        return await self.harness.request(request, upstream, correlation_id=next(self.correlation))

    def events(self) -> list[dict[str, Any]]:
        """The policy's audit events so far (their event data)."""
        return [data for kind, _, data in self.harness.services.audited if kind == "SAFEGUARD"]


def refused(exchange: Exchange) -> bool:
    """The policy answered the Fetch with POLICY_VIOLATION (the broker never saw it)."""
    return exchange.forwarded is None and exchange.response.error_code == ErrorCode.policy_violation


# -- unit: the policy keeps the sessions of a connection ----------------------------------------


def test_an_incremental_fetch_listing_nothing_is_checked_against_its_session() -> None:
    client = Client(BLOCK_UNCOMMITTED)
    opened = client.send(fetch_request((0, 0), {"orders-1": [0]}), broker(42))
    assert opened.forwarded is not None and opened.response.session_id == 42
    assert client.send(fetch_request((42, 1)), broker(42)).response.error_code == ErrorCode.none

    # the consumer's later Fetch lists no topic, yet fetches orders-1: read_uncommitted is refused
    later = client.send(fetch_request((42, 2), isolation=READ_UNCOMMITTED), broker(42))
    assert refused(later)
    [event] = client.events()
    assert event["action"] == "BLOCK" and event["topics"] == ["orders-1"]
    assert event["reasons"] == ["isolationLevel is 'read_uncommitted', must be 'read_committed'"]


def test_incremental_fetches_add_and_forget_partitions() -> None:
    client = Client(INFO_UNCOMMITTED)
    session = broker(7)
    client.send(fetch_request((0, 0), {"logs": [0]}, isolation=READ_UNCOMMITTED), session)
    steps: list[tuple[Topics, Topics]] = [
        ({}, {}),  # 1: the session holds logs only
        ({"orders-1": [0, 1]}, {}),  # 2: orders-1 joins the session
        ({}, {}),  # 3: lists nothing, fetches logs and orders-1
        ({}, {"orders-1": [0]}),  # 4: orders-1/1 is still fetched
        ({}, {"orders-1": [1]}),  # 5: orders-1 has left the session
        ({}, {}),  # 6
    ]
    audited = []
    for epoch, (listed, forgotten) in enumerate(steps, start=1):
        before = len(client.events())
        exchange = client.send(fetch_request((7, epoch), listed, forgotten, isolation=READ_UNCOMMITTED), session)
        assert exchange.forwarded is not None  # INFO lets every Fetch through
        if len(client.events()) > before:
            audited.append(epoch)
    assert audited == [2, 3, 4]
    assert all(event["topics"] == ["orders-1"] for event in client.events())


def test_full_fetches_close_the_session_they_name() -> None:
    client = Client(BLOCK_UNCOMMITTED)
    client.send(fetch_request((0, 0), {"orders-1": [0]}), broker(42))
    # epoch 0 with the session's id: the broker closes 42 and opens 43 for what this Fetch lists
    client.send(fetch_request((42, 0), {"logs": [0]}), broker(43))
    assert not refused(client.send(fetch_request((43, 1), isolation=READ_UNCOMMITTED), broker(43)))
    assert refused(client.send(fetch_request((43, 2), {"orders-1": [0]}, isolation=READ_UNCOMMITTED), broker(43)))
    # epoch -1 closes the session and opens none
    client.send(fetch_request((43, -1), {"logs": [0]}), broker(0))
    gone = client.send(fetch_request((43, 3), isolation=READ_UNCOMMITTED), broker(43))
    assert gone.forwarded is None and gone.response.error_code == ErrorCode.fetch_session_id_not_found


def test_a_session_the_policy_did_not_see_open_starts_over() -> None:
    """An incremental Fetch of an unknown session (opened before the policy applied to the
    connection) is answered as a broker that lost it would: the client then sends a full Fetch."""
    client = Client(BLOCK_UNCOMMITTED)
    unknown = client.send(fetch_request((99, 5), isolation=READ_UNCOMMITTED), broker(99))
    assert unknown.forwarded is None
    response = unknown.response
    assert response.error_code == ErrorCode.fetch_session_id_not_found
    assert response.session_id == 0 and response.responses == ()
    assert client.events() == []
    # the client's full Fetch that follows is checked, and opens a session the policy knows
    assert refused(client.send(fetch_request((0, 0), {"orders-1": [0]}, isolation=READ_UNCOMMITTED), broker(5)))
    client.send(fetch_request((0, 0), {"orders-1": [0]}), broker(5))
    assert refused(client.send(fetch_request((5, 1), isolation=READ_UNCOMMITTED), broker(5)))


@pytest.mark.parametrize(
    ("answer", "why"),
    [(broker(0), "no session (Tansu, or the cache)"), (broker(42, ErrorCode.unknown_server_error), "an error")],
)
def test_no_session_is_recorded_when_the_broker_opens_none(answer: Callable[[Any], Any], why: str) -> None:
    client = Client(BLOCK_UNCOMMITTED)
    client.send(fetch_request((0, 0), {"orders-1": [0]}), answer)
    stale = client.send(fetch_request((42, 1), isolation=READ_UNCOMMITTED), broker(42))
    assert stale.response.error_code == ErrorCode.fetch_session_id_not_found, why


def test_sessions_of_topic_ids() -> None:
    """Fetch v13+ names topics by id, in the session and in ``forgotten_topics_data``."""
    client = Client(INFO_UNCOMMITTED)
    client.send(fetch_request((0, 0), {ORDERS_ID: [0]}, version=13), broker(8))
    client.send(fetch_request((8, 1), isolation=READ_UNCOMMITTED, version=13), broker(8))
    assert [event["topics"] for event in client.events()] == [["orders-1"]]
    client.send(fetch_request((8, 2), {}, {ORDERS_ID: [0]}, isolation=READ_UNCOMMITTED, version=13), broker(8))
    client.send(fetch_request((8, 3), isolation=READ_UNCOMMITTED, version=13), broker(8))
    assert len(client.events()) == 1


def test_throttle_applies_to_incremental_fetches() -> None:
    config = {"topic": "orders-.*", "isolationLevel": {"value": "read_committed", "action": "THROTTLE"}}
    client = Client(config)
    client.send(fetch_request((0, 0), {"orders-1": [0]}), broker(3))
    slowed = client.send(fetch_request((3, 1), isolation=READ_UNCOMMITTED), broker(3))
    assert slowed.response.throttle_time == datetime.timedelta(milliseconds=100)
    assert slowed.response.session_id == 3


def test_sessions_are_per_connection_and_dropped_when_it_closes() -> None:
    first = Client(BLOCK_UNCOMMITTED)
    first.send(fetch_request((0, 0), {"orders-1": [0]}), broker(42))
    second = Client(harness=Harness(services=first.harness.services))
    second.harness.append(first.policy)  # the same interceptor, on another connection
    elsewhere = second.send(fetch_request((42, 1), isolation=READ_UNCOMMITTED), broker(42))
    assert elsewhere.response.error_code == ErrorCode.fetch_session_id_not_found

    assert any(key.startswith("fetch-policy.sessions") for key in first.harness.connection.state)
    trio.run(first.harness.close)
    assert not any(key.startswith("fetch-policy.sessions") for key in first.harness.connection.state)


def test_a_connection_keeps_a_bounded_number_of_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    sessions = FetchSessions()
    for session_id in range(1, fetch_sessions.MAX_SESSIONS + 2):
        sessions.open(session_id, {"t": SessionTopic("t", {0})})
    assert len(sessions) == fetch_sessions.MAX_SESSIONS and 1 not in sessions  # the oldest went first
    assert sessions.incremental(2, {}, {}) is not None  # used: now the most recent
    sessions.open(100, {"t": SessionTopic("t", {0})})
    assert 2 in sessions and 3 not in sessions

    monkeypatch.setattr(fetch_sessions, "MAX_PARTITIONS", 3)
    sessions.open(200, {"t": SessionTopic("t", {0, 1, 2, 3})})
    assert 200 not in sessions  # too big to keep: its incremental fetches start over
    sessions.open(201, {"t": SessionTopic("t", {0, 1})})
    assert sessions.incremental(201, {"u": SessionTopic("u", {0, 1})}, {}) is None and 201 not in sessions


def test_the_cache_makes_fetches_sessionless_before_the_broker() -> None:
    """With the flag off the cache may run: it sends the session-opening Fetch sessionless, the
    broker opens nothing, and the client keeps sending full fetches, each checked as it is."""
    services = FakeServices(topic_names={}, settings={SESSIONS_VARIABLE: "false"})
    client = Client(BLOCK_UNCOMMITTED, Harness(services=services))
    client.harness.add(Cache, {})  # innermost, where the cache belongs

    def opens_sessions(request: Any) -> Any:
        return broker(42 if request.session_epoch == 0 else 0)(request)

    opening = client.send(fetch_request((0, 0), {"orders-1": [0]}), opens_sessions)
    assert opening.forwarded.session_epoch == -1 and opening.response.session_id == 0
    assert refused(client.send(fetch_request((0, 0), {"orders-1": [0]}, isolation=READ_UNCOMMITTED), opens_sessions))
    stale = client.send(fetch_request((42, 1), isolation=READ_UNCOMMITTED), opens_sessions)
    assert stale.response.error_code == ErrorCode.fetch_session_id_not_found


# -- end to end: a gateway in front of Tansu -----------------------------------------------------


@dataclasses.dataclass
class _Session:
    epoch: int  # the epoch of the session's next Fetch
    partitions: dict[tuple[Any, int], tuple[Any, Any]]  # (topic key, partition) -> (topic entry, partition entry)


class SessionBroker(Interceptor):
    """The broker's side of KIP-227 for a broker without it (Tansu): sessions per connection,
    each Fetch of a session sent upstream as a full sessionless Fetch of the session's partitions,
    the response carrying the session's id. ``seen`` is every Fetch it got: (session id, epoch,
    partitions listed)."""

    plugin_name: ClassVar[str] = "test-kip227-broker"
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.FETCH})
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.FETCH})
    responses_on_demand: ClassVar[bool] = True
    seen: ClassVar[list[tuple[int, int, int]]] = []
    ids: ClassVar[itertools.count[int]] = itertools.count(1000)

    def __init__(self, config: Any, services: Any) -> None:
        super().__init__(config, services)
        self.sessions: dict[tuple[int, int], _Session] = {}  # by (connection id, session id)

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> RequestResult:
        request = ctx.request
        session_id, epoch = int(request.session_id), int(request.session_epoch)
        SessionBroker.seen.append((session_id, epoch, sum(len(t.partitions) for t in request.topics)))
        conn = ctx.connection.id
        listed = {(_key(t), int(p.partition)): (t, p) for t in request.topics for p in t.partitions}
        if epoch > 0:
            session = self.sessions.get((conn, session_id))
            if session is None or session.epoch != epoch:
                code = (
                    ErrorCode.fetch_session_id_not_found if session is None else ErrorCode.invalid_fetch_session_epoch
                )
                cls = response_class(ApiKey.FETCH, ctx.api_version)
                return Respond(build(cls, error_code=code, session_id=0, responses=()))
            session.partitions.update(listed)
            for topic in request.forgotten_topics_data:
                for index in topic.partitions:
                    session.partitions.pop((_key(topic), int(index)), None)
            session.epoch += 1
            listed = session.partitions
        else:
            self.sessions.pop((conn, session_id), None)
            if epoch == 0:
                session_id = next(SessionBroker.ids)
                self.sessions[(conn, session_id)] = _Session(1, dict(listed))
        topics: dict[Any, Any] = {}
        for (key, _), (topic, part) in listed.items():
            topics.setdefault(key, (topic, []))[1].append(part)
        ctx.request = dataclasses.replace(
            request,
            session_id=0,
            session_epoch=-1,
            forgotten_topics_data=(),
            topics=tuple(dataclasses.replace(topic, partitions=tuple(parts)) for topic, parts in topics.values()),
        )
        if epoch >= 0:
            ctx.notes["session"] = session_id
            ctx.want_response()
        return None

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> ResponseResult:
        if "session" in ctx.notes and ctx.response.error_code == ErrorCode.none:
            ctx.response = dataclasses.replace(ctx.response, session_id=ctx.notes["session"])
        return None


def _key(topic: Any) -> Any:
    return getattr(topic, "topic_id", None) or topic.topic


class SessionBrokerPlugin:
    @hookimpl
    def kanal_interceptor_types(self) -> list[type[Interceptor]]:
        return [SessionBroker]


@contextmanager
def session_gateway(tansu: TansuBroker, policy: Mapping[str, Any], *, cache: bool = False) -> Iterator[Gateway]:
    """A gateway whose cluster has fetch sessions: ``policy`` (a fetch-policy) outermost, the session
    broker innermost. Sessions: the flag on; ``cache``: the flag off and the cache before the
    session broker, which then never gets a session-opening Fetch."""
    interceptors = [spec("fetch", "fetch-policy", policy), spec("kip227", "test-kip227-broker", {}, priority=1000)]
    if cache:
        interceptors.append(spec("cache", "cache", {}, priority=900))
    env = {SESSIONS_VARIABLE: "false" if cache else "true"}
    plugins = {"safeguards": kanal_safeguards.plugin, "kip227": SessionBrokerPlugin()}
    SessionBroker.seen.clear()
    with inprocess_gateway(tansu, plugins, interceptors, env=env) as gateway:
        yield gateway


def policy_events(gateway: Gateway) -> list[dict[str, Any]]:
    return [e["eventData"] for e in audit_events(gateway) if e["eventData"].get("plugin") == "fetch-policy"]


def events_at_least(gateway: Gateway, count: int) -> list[dict[str, Any]]:
    """The fetch-policy events, once there are ``count`` of them (audit events are written in the
    background)."""

    def found() -> list[dict[str, Any]] | None:
        events = policy_events(gateway)
        return events if len(events) >= count else None

    events: list[dict[str, Any]] = wait_for(found, what=f"{count} fetch-policy events")
    return events


def produce(tansu: TansuBroker, topic: str, values: Sequence[bytes]) -> None:
    producer = Producer({**direct(tansu), "linger.ms": 0})
    for value in values:
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0


@pytest.mark.integration
@pytest.mark.parametrize("cache", [False, True], ids=["sessions", "cache-no-sessions"])
def test_kafka_python_fetches_are_each_checked(tansu: TansuBroker, cache: bool) -> None:
    """kafka-python opens a session and then mostly sends Fetches that list nothing; with an INFO
    rule every one of them is audited. Through the cache (flag off) it never gets a session and
    keeps sending full fetches, audited too."""
    topic = f"orders-{uuid.uuid4().hex[:10]}"
    create_topics(tansu, topic)
    produce(tansu, topic, [b"one", b"two"])
    with session_gateway(tansu, INFO_UNCOMMITTED, cache=cache) as gw:
        consumer = kafka.KafkaConsumer(
            bootstrap_servers=bootstrap_of(gw),
            enable_auto_commit=False,
            isolation_level="read_uncommitted",
            fetch_max_wait_ms=50,
        )
        values: list[bytes] = []

        def fetched_enough() -> bool:
            for records in consumer.poll(timeout_ms=100).values():
                values.extend(record.value for record in records)
            seen = SessionBroker.seen
            if cache:
                return len(values) == 2 and sum(1 for s in seen if s[1] == -1) >= 4
            return len(values) == 2 and sum(1 for s in seen if s[1] > 0 and s[2] == 0) >= 3

        try:
            consumer.assign([kafka.TopicPartition(topic, 0)])
            consumer.seek_to_beginning()
            wait_for(fetched_enough, what="fetches of the session")
        finally:
            consumer.close()
        events = events_at_least(gw, len(SessionBroker.seen))
    assert values == [b"one", b"two"]
    assert {event["action"] for event in events} == {"INFO"}
    assert all(event["topics"] == [topic] for event in events)
    if cache:
        assert all(epoch == -1 for _, epoch, _ in SessionBroker.seen)
    else:
        assert SessionBroker.seen[0][:2] == (0, 0)
        assert any(epoch > 0 and listed == 0 for _, epoch, listed in SessionBroker.seen)


def _raw(client: WireClient, request: Any, correlation: itertools.count[int]) -> Any:
    return client.call(request, next(correlation))


@pytest.mark.integration
def test_a_raw_session_is_checked_on_every_fetch(tansu: TansuBroker) -> None:
    """What a client sends, request by request, on one connection: the session's later Fetches are
    refused when they break the rule although they list no guarded topic."""
    orders, logs = f"orders-{uuid.uuid4().hex[:10]}", f"logs-{uuid.uuid4().hex[:10]}"
    create_topics(tansu, orders, logs)
    produce(tansu, orders, [b"kept"])
    with session_gateway(tansu, BLOCK_UNCOMMITTED) as gw:
        client = WireClient(bootstrap_of(gw))
        ids = itertools.count(1)
        try:
            opened = _raw(client, fetch_request((0, 0), {orders: [0]}), ids)
            session = opened.session_id
            assert opened.error_code == ErrorCode.none and session != 0
            assert opened.responses[0].partitions[0].records
            assert _raw(client, fetch_request((session, 1)), ids).error_code == ErrorCode.none
            later = _raw(client, fetch_request((session, 2), isolation=READ_UNCOMMITTED), ids)
            assert later.error_code == ErrorCode.policy_violation and later.responses == ()
            [event] = events_at_least(gw, 1)
            assert event["topics"] == [orders] and event["action"] == "BLOCK"

            # refused, the client starts over: a full Fetch closing the session, then forgets orders
            reopened = _raw(client, fetch_request((session, 0), {orders: [0], logs: [0]}), ids)
            session = reopened.session_id
            assert reopened.error_code == ErrorCode.none and session != 0
            forgot = _raw(client, fetch_request((session, 1), {}, {orders: [0]}, isolation=READ_UNCOMMITTED), ids)
            assert forgot.error_code == ErrorCode.none
            assert _raw(client, fetch_request((session, 2), isolation=READ_UNCOMMITTED), ids).error_code == 0
            back = _raw(client, fetch_request((session, 3), {orders: [0]}, isolation=READ_UNCOMMITTED), ids)
            assert back.responses[0].partitions[0].error_code == ErrorCode.policy_violation

            # a session the policy never saw open: the client is told to start over
            seen = len(SessionBroker.seen)
            lost = _raw(client, fetch_request((424242, 1), isolation=READ_UNCOMMITTED), ids)
            assert lost.error_code == ErrorCode.fetch_session_id_not_found
            assert len(SessionBroker.seen) == seen  # answered by the policy
        finally:
            client.close()
        assert len(events_at_least(gw, 2)) == 2
