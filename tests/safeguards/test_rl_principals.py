"""``producer-rate-limiting`` and ``consumer-rate-limiting`` with ``limitBy: PRINCIPAL`` and
``limitBy: VCLUSTER``, through a gateway whose clients log in over SASL PLAIN with gateway tokens
(service accounts in no virtual cluster and in two virtual clusters), against the test broker.

Whose bucket a client's bytes went to is read from what the limiter did, never from a clock: the
bytes it counted (``kanal_rate_limit_bytes_total``, which counts a held request's bytes only once
the hold is over), the ``throttle_time_ms`` of each raw response (the debt the bucket was in), the
audit events (naming the bucket) and the throttle events librdkafka reported. Each contrast test runs
the same traffic under ``limitBy: RULE``, where the two clients share one bucket, to show the
assertions would fail if the buckets were shared.
"""

from __future__ import annotations

import base64
import datetime
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from safeguard_clients import (
    audit_events,
    bootstrap_of,
    create_topics,
    direct,
    in_gateway,
    safeguards_gateway,
    spec,
    unique,
    wait_for,
)
from wire import WireClient, produce_request

from kanal.api import ApiKey, build, nested, require_request_class
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway
from kanal.identity.accounts import AccountType, ServiceAccount
from kanal.identity.tokens import mint
from kanal.tenancy.clusters import VirtualCluster

SECRET = secrets.token_bytes(32)
TEAM_A, TEAM_B = "team-a.", "team-b."
VALUE = b"v" * 1000
COUNTED = "kanal_rate_limit_bytes_total"


def records_size(values: int) -> int:
    """The bytes a raw Produce request of ``values`` 1 KB records counts (its ``records`` field)."""
    return len(produce_request("t", 1, [VALUE] * values).topic_data[0].partition_data[0].records)


PLAIN_VALUES, BIG_VALUES = 5, 15
SIZE = records_size(PLAIN_VALUES)  # a plain request
BIG = records_size(BIG_VALUES)  # a request past a burst of 2 * SIZE on its own


@contextmanager
def sasl_gateway(tansu: TansuBroker, plugin: str, config: dict[str, Any]) -> Iterator[Gateway]:
    """A SASL_PLAINTEXT gateway with one rate-limit interceptor (for every client), the virtual
    clusters ``team-a.`` and ``team-b.``, and service accounts ``alice`` and ``bob`` (in no virtual
    cluster), ``app`` in each virtual cluster and ``ops`` in ``team-a.``."""
    env = {
        "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(SECRET).decode(),
    }
    with safeguards_gateway(tansu, [spec("rate", plugin, config, priority=1)], env) as gateway:
        in_gateway(gateway, gateway.virtual_clusters.replace, [VirtualCluster(TEAM_A), VirtualCluster(TEAM_B)])
        accounts = [
            ServiceAccount("alice", None, AccountType.LOCAL),
            ServiceAccount("bob", None, AccountType.LOCAL),
            ServiceAccount("app", TEAM_A, AccountType.LOCAL),
            ServiceAccount("ops", TEAM_A, AccountType.LOCAL),
            ServiceAccount("app", TEAM_B, AccountType.LOCAL),
        ]
        in_gateway(gateway, gateway.service_accounts.replace, accounts)
        yield gateway


def sasl(gateway: Gateway, user: str, vcluster: str | None = None, **extra: Any) -> dict[str, Any]:
    """librdkafka settings of a client logging in as ``user`` with a gateway token."""
    return {
        "bootstrap.servers": bootstrap_of(gateway),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": mint(user, vcluster, 600, SECRET),
        **extra,
    }


class Session:
    """A raw Kafka connection to the gateway, logged in over SASL PLAIN as ``user``: requests go
    one at a time, so each response's ``throttle_time_ms`` is the debt that request left."""

    def __init__(self, gateway: Gateway, user: str, vcluster: str | None = None) -> None:
        self.client = WireClient(bootstrap_of(gateway), timeout=30)
        self.correlation = 0
        self.call(require_request_class(ApiKey.SASL_HANDSHAKE, 1)(mechanism="PLAIN"))
        token = mint(user, vcluster, 600, SECRET).encode()
        auth = require_request_class(ApiKey.SASL_AUTHENTICATE, 2)(auth_bytes=b"\x00" + user.encode() + b"\x00" + token)
        assert self.call(auth).error_code == 0

    def call(self, request: Any) -> Any:
        self.correlation += 1
        return self.client.call(request, correlation_id=self.correlation)

    def produce(self, topic: str, count: int, values: int = PLAIN_VALUES) -> list[int]:
        """``count`` Produce requests of ``values`` records (SIZE bytes by default); the throttle
        time (ms) of each response."""
        throttles = []
        for _ in range(count):
            response = self.call(produce_request(topic, 1, [VALUE] * values))
            assert [p.error_code for t in response.responses for p in t.partition_responses] == [0]
            throttles.append(throttle_ms(response))
        return throttles

    def fetch(self, topic: str, count: int) -> tuple[list[int], int]:
        """``count`` Fetch requests of partition 0 from its start (the same records each time);
        the throttle time (ms) of each response and the record bytes they carried in all."""
        throttles, fetched = [], 0
        for _ in range(count):
            response = self.call(fetch_request(topic))
            [partition] = response.responses[0].partitions
            assert partition.error_code == 0 and partition.records
            fetched += len(partition.records)
            throttles.append(throttle_ms(response))
        return throttles, fetched

    def close(self) -> None:
        self.client.close()


@contextmanager
def sessions(gateway: Gateway, *logins: tuple[str, str | None]) -> Iterator[list[Session]]:
    """A logged-in :class:`Session` per ``(user, vcluster)``, all open before any traffic, so that
    no login happens between two clients' requests."""
    opened = [Session(gateway, user, vcluster) for user, vcluster in logins]
    try:
        yield opened
    finally:
        for session in opened:
            session.close()


def throttle_ms(response: Any) -> int:
    return int(response.throttle_time / datetime.timedelta(milliseconds=1))


def fetch_request(topic: str) -> Any:
    """Fetch v12 of partition 0 from offset 0: the one batch the test topics hold."""
    cls = require_request_class(ApiKey.FETCH, 12)
    topic_cls = nested(cls, "topics")
    partition = build(
        nested(topic_cls, "partitions"), partition=0, current_leader_epoch=-1, fetch_offset=0, partition_max_bytes=1
    )
    return build(
        cls,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=100),
        min_bytes=1,
        max_bytes=1 << 20,
        session_epoch=-1,
        topics=(build(topic_cls, topic=topic, partitions=(partition,)),),
    )


def counted(gateway: Gateway, plugin: str) -> float:
    """The bytes the gateway's rate limiter of this type counted so far."""
    return gateway.metrics.registry.get_sample_value(COUNTED, {"plugin": plugin}) or 0.0


def buckets(gateway: Gateway, plugin: str) -> list[Any]:
    """The ``bucket`` of each audit event of ``plugin`` (one per bucket per second over the limit)."""
    return [e["eventData"]["bucket"] for e in audit_events(gateway) if e["eventData"]["plugin"] == plugin]


def one_batch_topic(tansu: TansuBroker, *physical: str) -> dict[str, int]:
    """Creates the topics on the broker and writes one batch of five 1 KB records to each; the
    bytes a fetch of each returns (the batch as the broker stores it), read directly."""
    create_topics(tansu, *physical)
    client = WireClient(tansu.bootstrap, timeout=30)
    try:
        for n, topic in enumerate(physical, start=1):
            response = client.call(produce_request(topic, -1, [VALUE] * PLAIN_VALUES), correlation_id=n)
            assert response.responses[0].partition_responses[0].error_code == 0
        sizes = {}
        for n, topic in enumerate(physical, start=len(physical) + 1):
            response = client.call(fetch_request(topic), correlation_id=n)
            [partition] = response.responses[0].partitions
            assert partition.error_code == 0 and partition.records
            sizes[topic] = len(partition.records)
        return sizes
    finally:
        client.close()


# -- producer-rate-limiting ------------------------------------------------------------------------
#
# The limit is 2 * SIZE a second, a burst of two plain requests. A client's first request is BIG,
# past its whole burst on its own: that response carries a throttle time however fast or slow the
# client is, and its next requests are held until the debt is paid, each then leaving SIZE's worth
# (500 ms) at most: held, the debt does not pile up.


@pytest.mark.parametrize("limit_by", ["PRINCIPAL", "RULE"])
def test_a_throttled_principal_does_not_slow_another(tansu: TansuBroker, limit_by: str) -> None:
    """alice goes past her burst and is throttled and held; bob, right after her, has his own full
    bucket: no throttle time (so never held), no audit event. Under RULE the same traffic
    throttles bob too."""
    plugin = "producer-rate-limiting"
    topic = unique("rl-principals")
    create_topics(tansu, topic)
    with (
        sasl_gateway(tansu, plugin, {"maximumBytesPerSecond": 2 * SIZE, "limitBy": limit_by}) as gateway,
        sessions(gateway, ("alice", None), ("bob", None)) as (alice, bob),
    ):
        [first] = alice.produce(topic, 1, BIG_VALUES)
        assert first > 0
        assert counted(gateway, plugin) == BIG
        assert all(0 < t <= 500 for t in alice.produce(topic, 2))  # held, then SIZE at 2 * SIZE a second
        assert counted(gateway, plugin) == BIG + 2 * SIZE
        bob_throttles = bob.produce(topic, 2)
        assert counted(gateway, plugin) == BIG + 4 * SIZE  # bob's bytes went through the limiter too
        if limit_by == "PRINCIPAL":
            assert bob_throttles == [0, 0]  # his whole burst, whatever alice's debt
            assert set(wait_for(lambda: buckets(gateway, plugin))) == {"alice"}
            reasons = audit_events(gateway)[0]["eventData"]["reasons"]
            assert reasons == [f"Produce rate over {2 * SIZE} bytes per second for principal 'alice'."]
        else:
            assert bob_throttles[0] > 0  # alice's debt is his
            assert set(wait_for(lambda: buckets(gateway, plugin))) == {None}


def test_the_same_name_in_two_virtual_clusters_is_two_principals(tansu: TansuBroker) -> None:
    """``app`` of team-a and ``app`` of team-b are two service accounts: one's debt is not the
    other's (they shared a bucket when it was keyed by name alone)."""
    plugin = "producer-rate-limiting"
    topic = unique("rl-tenants")
    create_topics(tansu, TEAM_A + topic, TEAM_B + topic)
    with (
        sasl_gateway(tansu, plugin, {"maximumBytesPerSecond": 2 * SIZE, "limitBy": "PRINCIPAL"}) as gateway,
        sessions(gateway, ("app", TEAM_A), ("app", TEAM_B)) as (app_a, app_b),
    ):
        assert app_a.produce(topic, 1, BIG_VALUES)[0] > 0
        assert app_b.produce(topic, 2) == [0, 0]
        assert counted(gateway, plugin) == BIG + 2 * SIZE
        [event] = wait_for(lambda: [e["eventData"] for e in audit_events(gateway)])
        assert event["bucket"] == "app"
        assert event["reasons"] == [
            f"Produce rate over {2 * SIZE} bytes per second for principal 'app' in virtual cluster '{TEAM_A}'."
        ]


@pytest.mark.parametrize("limit_by", ["VCLUSTER", "RULE"])
def test_a_throttled_virtual_cluster_does_not_slow_another(tansu: TansuBroker, limit_by: str) -> None:
    """team-a's principals share team-a's bucket (ops is held for app's debt); team-b's app, right
    after them, has a full bucket. Under RULE every tenant shares one."""
    plugin = "producer-rate-limiting"
    topic = unique("rl-vclusters")
    create_topics(tansu, TEAM_A + topic, TEAM_B + topic)
    with (
        sasl_gateway(tansu, plugin, {"maximumBytesPerSecond": 2 * SIZE, "limitBy": limit_by}) as gateway,
        sessions(gateway, ("app", TEAM_A), ("ops", TEAM_A), ("app", TEAM_B)) as (app_a, ops_a, app_b),
    ):
        assert app_a.produce(topic, 1, BIG_VALUES)[0] > 0  # past team-a's whole burst
        assert all(0 < t <= 500 for t in ops_a.produce(topic, 2))  # the same bucket: held, throttled
        assert counted(gateway, plugin) == BIG + 2 * SIZE
        b_throttles = app_b.produce(topic, 2)
        assert counted(gateway, plugin) == BIG + 4 * SIZE
        if limit_by == "VCLUSTER":
            assert b_throttles == [0, 0]
            assert set(wait_for(lambda: buckets(gateway, plugin))) == {TEAM_A}
        else:
            assert b_throttles[0] > 0


def test_librdkafka_producers_of_two_principals_have_their_own_buckets(tansu: TansuBroker) -> None:
    """Real producers: alice floods (120 KB where 40 KB a second are allowed) and is throttled;
    while she is, bob's 10 KB fit his own burst: librdkafka never reports a throttle to him."""
    plugin = "producer-rate-limiting"
    topic = unique("rl-librdkafka")
    create_topics(tansu, topic)
    limit = {"maximumBytesPerSecond": 40_000, "limitBy": "PRINCIPAL"}
    with sasl_gateway(tansu, plugin, limit) as gateway:
        alice_throttles: list[float] = []
        bob_throttles: list[float] = []
        alice = Producer(
            sasl(
                gateway,
                "alice",
                **{
                    "linger.ms": 5,
                    "batch.size": 8000,
                    "throttle_cb": lambda e: alice_throttles.append(e.throttle_time),
                },
            )
        )
        errors: list[Any] = []

        def flood() -> None:
            for n in range(120):
                alice.produce(topic, VALUE, key=b"a%d" % n, on_delivery=lambda err, _m: errors.append(err))
                alice.poll(0)
            alice.flush(60)

        flooding = threading.Thread(target=flood)
        flooding.start()
        try:
            wait_for(lambda: [t for t in alice_throttles if t > 0], what="alice throttled")
            bob = Producer(sasl(gateway, "bob", **{"throttle_cb": lambda e: bob_throttles.append(e.throttle_time)}))
            for n in range(10):
                bob.produce(topic, VALUE, key=b"b%d" % n, on_delivery=lambda err, _m: errors.append(err))
            assert bob.flush(30) == 0
        finally:
            flooding.join(90)
        assert errors == [None] * 130  # a quota never fails a request
        assert [t for t in bob_throttles if t > 0] == []
        assert counted(gateway, plugin) >= 130 * len(VALUE)
        assert set(wait_for(lambda: buckets(gateway, plugin))) == {"alice"}


# -- consumer-rate-limiting ------------------------------------------------------------------------
#
# Each fetch returns the topic's one batch (FETCHED bytes, as the broker stores it) where FETCHED a
# second are allowed: a fetch is never held on a full or just-emptied bucket, so a client's first
# two responses carry no throttle time; its second leaves a debt (a second, less the time since the
# first), which holds its third fetch, whose response carries the debt its own bytes leave
# (FETCHED's worth: 1000 ms at most).


@pytest.mark.parametrize("limit_by", ["PRINCIPAL", "RULE"])
def test_a_throttled_consumer_principal_does_not_slow_another(tansu: TansuBroker, limit_by: str) -> None:
    """alice's third fetch is held and throttled; bob, right after her, fetches within his own
    full bucket (under RULE his fetch is held for alice's debt)."""
    plugin = "consumer-rate-limiting"
    topic = unique("rl-fetch-principals")
    fetched = one_batch_topic(tansu, topic)[topic]
    with (
        sasl_gateway(tansu, plugin, {"maximumBytesPerSecond": fetched, "limitBy": limit_by}) as gateway,
        sessions(gateway, ("alice", None), ("bob", None)) as (alice, bob),
    ):
        alice_throttles, alice_bytes = alice.fetch(topic, 3)
        assert alice_bytes == 3 * fetched
        assert counted(gateway, plugin) == alice_bytes
        assert alice_throttles[:2] == [0, 0]
        assert 0 < alice_throttles[2] <= 1000
        bob_throttles, bob_bytes = bob.fetch(topic, 1)
        assert counted(gateway, plugin) == alice_bytes + bob_bytes == 4 * fetched
        if limit_by == "PRINCIPAL":
            assert bob_throttles == [0]
            assert set(wait_for(lambda: buckets(gateway, plugin))) == {"alice"}
        else:
            assert bob_throttles[0] > 0  # held for alice's debt (and told the debt his bytes left)
            assert set(wait_for(lambda: buckets(gateway, plugin))) == {None}


@pytest.mark.parametrize("limit_by", ["VCLUSTER", "RULE"])
def test_a_throttled_consumer_virtual_cluster_does_not_slow_another(tansu: TansuBroker, limit_by: str) -> None:
    """team-a's app reads past team-a's burst; team-b's app, reading the same name in its own
    virtual cluster right after, is neither held nor throttled."""
    plugin = "consumer-rate-limiting"
    topic = unique("rl-fetch-vclusters")
    sizes = one_batch_topic(tansu, TEAM_A + topic, TEAM_B + topic)
    fetched = sizes[TEAM_A + topic]
    assert sizes[TEAM_B + topic] == fetched
    with (
        sasl_gateway(tansu, plugin, {"maximumBytesPerSecond": fetched, "limitBy": limit_by}) as gateway,
        sessions(gateway, ("app", TEAM_A), ("app", TEAM_B)) as (app_a, app_b),
    ):
        a_throttles, a_bytes = app_a.fetch(topic, 3)
        assert a_throttles[:2] == [0, 0] and a_throttles[2] > 0
        b_throttles, b_bytes = app_b.fetch(topic, 1)
        assert counted(gateway, plugin) == a_bytes + b_bytes == 4 * fetched
        if limit_by == "VCLUSTER":
            assert b_throttles == [0]
            events = wait_for(lambda: [e["eventData"] for e in audit_events(gateway)])
            assert {e["bucket"] for e in events} == {TEAM_A}  # one a second while team-a is over
            reason = f"Fetch rate over {fetched} bytes per second for virtual cluster '{TEAM_A}'."
            assert events[0]["reasons"] == [reason]
        else:
            assert b_throttles[0] > 0


def test_librdkafka_consumers_of_two_virtual_clusters_have_their_own_buckets(tansu: TansuBroker) -> None:
    """Real consumers: team-a's reads 60 KB where 20 KB a second are allowed and is throttled;
    team-b's, reading 10 KB of its own topic meanwhile, never gets a throttle time."""
    plugin = "consumer-rate-limiting"
    topic = unique("rl-librdkafka-fetch")
    create_topics(tansu, TEAM_A + topic, TEAM_B + topic)
    producer = Producer(direct(tansu, **{"linger.ms": 0, "batch.size": 5000}))  # batches of about 5 KB
    for n in range(60):
        producer.produce(TEAM_A + topic, VALUE, key=b"%d" % n)
    for n in range(10):
        producer.produce(TEAM_B + topic, VALUE, key=b"%d" % n)
    assert producer.flush(30) == 0
    with sasl_gateway(tansu, plugin, {"maximumBytesPerSecond": 20_000, "limitBy": "VCLUSTER"}) as gateway:
        throttled: dict[str, list[float]] = {TEAM_A: [], TEAM_B: []}
        keys: dict[str, list[bytes]] = {TEAM_A: [], TEAM_B: []}

        def consume(tenant: str, count: int) -> None:
            settings = {
                "group.id": unique("rl"),
                "enable.auto.commit": False,
                "fetch.max.bytes": 6000,  # several fetches of about 5 KB each
                "message.max.bytes": 6000,
                "max.partition.fetch.bytes": 6000,
                "throttle_cb": lambda event: throttled[tenant].append(event.throttle_time),
            }
            consumer = Consumer(sasl(gateway, "app", tenant, **settings))
            try:
                consumer.assign([TopicPartition(topic, 0, 0)])
                deadline = time.monotonic() + 60
                while len(keys[tenant]) < count and time.monotonic() < deadline:
                    message = consumer.poll(0.5)
                    if message is not None and message.error() is None:
                        keys[tenant].append(message.key())
                consumer.poll(0.1)  # serve the last throttle callbacks
            finally:
                consumer.close()

        reading = threading.Thread(target=consume, args=(TEAM_A, 60), daemon=True)
        reading.start()
        wait_for(lambda: [t for t in throttled[TEAM_A] if t > 0], timeout=60, what="team-a throttled")
        consume(TEAM_B, 10)
        reading.join(60)
        assert not reading.is_alive()
        assert keys[TEAM_A] == [b"%d" % n for n in range(60)]
        assert keys[TEAM_B] == [b"%d" % n for n in range(10)]
        assert [t for t in throttled[TEAM_B] if t > 0] == []
        assert counted(gateway, plugin) >= 70 * len(VALUE)
        assert set(wait_for(lambda: buckets(gateway, plugin))) == {TEAM_A}
