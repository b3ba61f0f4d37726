"""``producer-rate-limiting`` and ``consumer-rate-limiting`` through the gateway, with confluent-kafka
(librdkafka) and raw Kafka requests against the test broker.

Everything is counted, never timed: which responses carry a throttle time, how many throttle
events a client reported, how many records arrived, how many audit events were written. Tests
over the limit take a couple of seconds because the gateway holds requests until the rate allows.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from safeguard_clients import audit_events, bootstrap_of, direct, safeguards_gateway, spec, through, wait_for
from wire import WireClient, produce_request

from kanal.embedded import TansuBroker

VALUE = b"v" * 1000


@pytest.fixture
def topic(tansu: TansuBroker) -> Iterator[str]:
    name = f"rl-{uuid.uuid4().hex[:10]}"
    admin = AdminClient(direct(tansu))
    for future in admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)]).values():
        future.result(30)
    yield name


def stored(tansu: TansuBroker, topic: str, expected: int) -> int:
    """How many records partition 0 holds on the broker, read back directly up to ``expected``
    (Tansu's high watermark counts batches, not records)."""
    consumer = Consumer(direct(tansu, **{"group.id": "rl-read-back", "enable.auto.commit": False}))
    count = 0
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while count < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                count += 1
        return count
    finally:
        consumer.close()


def produce_all(config: dict[str, Any], topic: str, count: int) -> tuple[list[Any], list[float]]:
    """Produces ``count`` records with librdkafka; returns the delivery errors and the throttle
    times (seconds) librdkafka reported to ``throttle_cb``."""
    throttles: list[float] = []
    errors: list[Any] = []
    producer = Producer({**config, "throttle_cb": lambda event: throttles.append(event.throttle_time)})
    for n in range(count):
        producer.produce(topic, VALUE, key=str(n), on_delivery=lambda err, _msg: errors.append(err))
        producer.poll(0)
    assert producer.flush(60) == 0
    return errors, throttles


def test_a_producer_over_the_limit_is_throttled_and_every_record_arrives(tansu: TansuBroker, topic: str) -> None:
    limit = {"maximumBytesPerSecond": 40_000}
    with safeguards_gateway(tansu, [spec("produce-rate", "producer-rate-limiting", limit, priority=1)]) as gateway:
        began = time.monotonic()
        # small requests (about 8 KB), so that many go over the limit
        config = through(gateway, **{"linger.ms": 5, "batch.size": 8000, "acks": "all"})
        errors, throttles = produce_all(config, topic, 120)  # 120 KB: a 40 KB burst, then held
        elapsed = time.monotonic() - began
        assert errors == [None] * 120  # a quota never fails a request
        assert stored(tansu, topic, 120) == 120
        # Produce responses carried throttle_time_ms (librdkafka also reports a 0 when it ends)
        assert len([t for t in throttles if t > 0]) >= 5
        events = wait_for(lambda: audit_events(gateway))
        assert {(e["eventData"]["plugin"], e["eventData"]["action"]) for e in events} == {
            ("producer-rate-limiting", "BLOCK")
        }
        assert len(events) <= math.ceil(elapsed) + 1  # at most one a second, not one per request
        assert events[0]["eventData"]["reasons"] == ["Produce rate over 40000 bytes per second."]


def test_a_producer_below_the_limit_is_never_throttled(tansu: TansuBroker, topic: str) -> None:
    limit = {"maximumBytesPerSecond": 10 * 1024 * 1024}
    with safeguards_gateway(tansu, [spec("produce-rate", "producer-rate-limiting", limit, priority=1)]) as gateway:
        errors, throttles = produce_all(through(gateway, **{"linger.ms": 5}), topic, 200)
        assert errors == [None] * 200
        assert throttles == []
        assert stored(tansu, topic, 200) == 200
        assert audit_events(gateway) == []


def send_produces(gateway: Any, topic: str, count: int, values: int = 5) -> list[Any]:
    """``count`` Produce requests of ``values`` 1 KB records, one after the other; the responses."""
    client = WireClient(bootstrap_of(gateway), timeout=30)
    try:
        return [client.call(produce_request(topic, 1, [VALUE] * values), correlation_id=n) for n in range(1, count + 1)]
    finally:
        client.close()


def test_raw_produce_responses_carry_the_debt_each_request_leaves(tansu: TansuBroker, topic: str) -> None:
    """Each Produce request is about 5 KB; the limit lets 4 through in its burst. From then on a
    client that does not wait is held until the debt is paid, and each response says the debt its
    own bytes leave: its size at the rate (about 250 ms)."""
    size = len(produce_request(topic, 1, [VALUE] * 5).topic_data[0].partition_data[0].records)
    limit = {"maximumBytesPerSecond": 4 * size}
    with safeguards_gateway(tansu, [spec("produce-rate", "producer-rate-limiting", limit, priority=1)]) as gateway:
        responses = send_produces(gateway, topic, 10)
        codes = [p.error_code for r in responses for t in r.responses for p in t.partition_responses]
        assert codes == [0] * 10
        throttles = [int(r.throttle_time.total_seconds() * 1000) for r in responses]
        assert throttles[:3] == [0, 0, 0]
        assert all(200 <= t <= 250 for t in throttles[4:]), throttles  # bucket arithmetic, not timing
        assert stored(tansu, topic, 50) == 50


def test_info_never_throttles_and_audits(tansu: TansuBroker, topic: str) -> None:
    limit = {"maximumBytesPerSecond": 10_000, "action": "INFO"}
    with safeguards_gateway(tansu, [spec("produce-rate", "producer-rate-limiting", limit, priority=1)]) as gateway:
        began = time.monotonic()
        responses = send_produces(gateway, topic, 12)  # 60 KB where 10 KB a second are allowed
        elapsed = time.monotonic() - began
        assert [r.throttle_time.total_seconds() for r in responses] == [0.0] * 12
        events = wait_for(lambda: audit_events(gateway))
        assert 1 <= len(events) <= math.ceil(elapsed) + 1
        data = events[0]["eventData"]
        assert (data["plugin"], data["action"], data["level"], data["throttleTimeMs"]) == (
            "producer-rate-limiting",
            "INFO",
            "WARNING",
            0,
        )


def test_a_consumer_reading_above_the_limit_is_throttled(tansu: TansuBroker, topic: str) -> None:
    producer = Producer(direct(tansu, **{"linger.ms": 0, "batch.size": 5000}))  # batches of about 5 KB
    for n in range(60):
        producer.produce(topic, VALUE, key=str(n))
    assert producer.flush(30) == 0
    limit = {"maximumBytesPerSecond": 20_000}
    with safeguards_gateway(tansu, [spec("fetch-rate", "consumer-rate-limiting", limit, priority=1)]) as gateway:
        throttles: list[float] = []
        consumer = Consumer(
            through(
                gateway,
                **{
                    "group.id": f"rl-{uuid.uuid4().hex[:8]}",
                    "enable.auto.commit": False,
                    "fetch.max.bytes": 6000,  # several fetches of about 5 KB each
                    "message.max.bytes": 6000,
                    "max.partition.fetch.bytes": 6000,
                    "throttle_cb": lambda event: throttles.append(event.throttle_time),
                },
            )
        )
        keys: list[bytes] = []
        try:
            consumer.assign([TopicPartition(topic, 0, 0)])
            deadline = time.monotonic() + 60
            while len(keys) < 60 and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is not None and message.error() is None:
                    keys.append(message.key())
            consumer.poll(0.1)  # serve the last throttle callbacks
        finally:
            consumer.close()
        assert keys == [str(n).encode() for n in range(60)]  # everything arrives, in order
        assert [t for t in throttles if t > 0]
        events = wait_for(lambda: audit_events(gateway))
        assert {(e["eventData"]["plugin"], e["eventData"]["action"]) for e in events} == {
            ("consumer-rate-limiting", "BLOCK")
        }
