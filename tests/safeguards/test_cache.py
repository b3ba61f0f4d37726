"""The ``cache`` interceptor through the gateway, with confluent-kafka against Tansu.

Whether a Fetch was answered from the cache is read from the gateway's own metrics
(``kanal_cache_hits_total``): answered from the cache, a Fetch never reaches the broker or the
interceptors after the cache, so the hit counter is the observable. Records are checked against
what the broker itself returns.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import kanal_safeguards.plugin
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from kanal_safeguards.caching.cache import SESSIONS_VARIABLE, Cache
from safeguard_clients import (
    create_topics,
    direct,
    inprocess_gateway,
    read_to_end,
    safeguards_gateway,
    spec,
    through,
    unique,
)

from kanal.api import InterceptorConfigError
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway
from kanal.testing import FakeServices, Harness

#: Fetches of a few batches each, so that a partition takes many Fetch requests to read.
SMALL_FETCHES = {"fetch.max.bytes": 4000, "max.partition.fetch.bytes": 4000, "message.max.bytes": 4000}

Record = tuple[int, int, bytes | None, bytes | None]  # partition, offset, key, value


def produce(config: dict[str, Any], topic: str, values: Sequence[bytes], partition: int = 0, **extra: Any) -> None:
    producer = Producer({**config, "linger.ms": 0, **extra})
    errors: list[KafkaError] = []
    for i, value in enumerate(values):
        producer.produce(
            topic, value, key=b"k%d" % i, partition=partition, on_delivery=lambda e, _: e and errors.append(e)
        )
    assert producer.flush(30) == 0
    assert not errors, errors


def read_all(config: dict[str, Any], topic: str, partition: int = 0, **extra: Any) -> list[Record]:
    """Every record of the partition from the start to its end, in the order the consumer got them."""
    messages = read_to_end(config, topic, partition, **extra)
    return [(m.partition(), m.offset(), m.key(), m.value()) for m in messages]


def read_from(config: dict[str, Any], topic: str, offset: int, count: int, **extra: Any) -> list[Record]:
    """``count`` records of partition 0 from ``offset`` on."""
    consumer = Consumer({**config, "group.id": unique("cache"), "enable.auto.commit": False, **extra})
    try:
        consumer.assign([TopicPartition(topic, 0, offset)])
        records: list[Record] = []
        deadline = time.monotonic() + 30
        while len(records) < count and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                records.append((message.partition(), message.offset(), message.key(), message.value()))
        return records
    finally:
        consumer.close()


def hits(gateway: Gateway) -> float:
    return gateway.metrics.registry.get_sample_value("kanal_cache_hits_total") or 0.0


@pytest.fixture
def cached(tansu: TansuBroker) -> Iterator[Gateway]:
    with safeguards_gateway(tansu, [spec("cache", "cache", {"topic": "cached-.*"})]) as gateway:
        yield gateway


def test_a_partition_read_twice_gives_the_same_records_the_second_time_from_the_cache(
    tansu: TansuBroker, cached: Gateway
) -> None:
    topic = unique("cached-twice")
    create_topics(tansu, topic)
    produce(direct(tansu), topic, [b"v%d" % i for i in range(200)], **{"batch.num.messages": 7})
    expected = read_all(direct(tansu), topic)
    assert [r[1] for r in expected] == list(range(200))
    first = read_all(through(cached), topic, **SMALL_FETCHES)
    assert first == expected
    before = hits(cached)
    second = read_all(through(cached), topic, **SMALL_FETCHES)
    assert second == expected  # same records, same offsets, in order
    assert hits(cached) > before  # and the broker was not asked for (some of) them


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_records_produced_through_the_gateway_are_served_from_the_cache(
    tansu: TansuBroker, cached: Gateway, isolation: str
) -> None:
    topic = unique("cached-produced")
    create_topics(tansu, topic)
    produce(through(cached), topic, [b"p%d" % i for i in range(50)], acks="all", **{"batch.num.messages": 5})
    # a first read: the broker vouches for the consumer's leader epoch and tells the offsets
    assert read_all(through(cached), topic, **{"isolation.level": isolation}) == read_all(direct(tansu), topic)
    produce(through(cached), topic, [b"q%d" % i for i in range(50)], acks="all", **{"batch.num.messages": 5})
    expected = read_all(direct(tansu), topic)
    assert [r[1] for r in expected] == list(range(100))
    before = hits(cached)
    # from offset 50: the batches produced last, at the offsets the Produce responses gave
    assert read_from(through(cached), topic, 50, 50, **{"isolation.level": isolation}) == expected[50:]
    assert hits(cached) > before


def test_topics_the_regex_does_not_match_are_never_cached(tansu: TansuBroker, cached: Gateway) -> None:
    topic = unique("plain")
    create_topics(tansu, topic)
    produce(through(cached), topic, [b"x%d" % i for i in range(20)], acks="all")
    before = hits(cached)
    assert read_all(through(cached), topic) == read_all(through(cached), topic) == read_all(direct(tansu), topic)
    assert hits(cached) == before


def test_concurrent_produce_and_fetch_through_the_gateway_see_the_broker_log(
    tansu: TansuBroker, cached: Gateway
) -> None:
    topic = unique("cached-concurrent")
    create_topics(tansu, topic, partitions=2)
    total = 300
    seen: dict[int, list[Record]] = {0: [], 1: []}
    failures: list[BaseException] = []

    def consume(partition: int) -> None:
        consumer = Consumer({**through(cached), "group.id": unique("cc"), "enable.auto.commit": False})
        try:
            consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
            deadline = time.monotonic() + 60
            while len(seen[partition]) < total and time.monotonic() < deadline:
                message = consumer.poll(0.1)
                if message is None or message.error() is not None:
                    continue
                seen[partition].append((partition, message.offset(), message.key(), message.value()))
        except BaseException as exc:  # surfaced below
            failures.append(exc)
        finally:
            consumer.close()

    def write(partition: int) -> None:
        try:
            producer = Producer({**through(cached), "linger.ms": 1, "acks": "all"})
            for i in range(total):
                producer.produce(topic, b"c%d" % i, key=b"k%d" % i, partition=partition)
                if i % 10 == 0:
                    producer.poll(0)
            assert producer.flush(30) == 0
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=f, args=(p,)) for p in (0, 1) for f in (consume, write)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert not failures, failures
    for partition in (0, 1):
        expected = read_all(direct(tansu), topic, partition)
        assert len(expected) == total
        assert seen[partition] == expected  # nothing skipped, nothing repeated, in order
        # and a reader after the fact, from the cache where it can
        assert read_all(through(cached), topic, partition) == expected


# -- refusals ------------------------------------------------------------------------------------


def test_the_cache_is_refused_while_incremental_fetch_sessions_are_enabled() -> None:
    services = FakeServices(settings={SESSIONS_VARIABLE: "true"})
    with pytest.raises(InterceptorConfigError, match=SESSIONS_VARIABLE):
        Harness(services=services).add(Cache, {})
    # false (or unset) is fine
    Harness(services=FakeServices(settings={SESSIONS_VARIABLE: "false"})).add(Cache, {})
    Harness(services=FakeServices()).add(Cache, {})


def test_a_gateway_with_incremental_fetch_sessions_enabled_refuses_the_cache(tansu: TansuBroker) -> None:
    """The plugin declares the flag, so the gateway starts with it; the cache is then refused."""
    with (
        inprocess_gateway(
            tansu, {"safeguards": kanal_safeguards.plugin}, [], env={SESSIONS_VARIABLE: "true"}
        ) as gateway,
        pytest.raises(InterceptorConfigError, match=SESSIONS_VARIABLE),
    ):
        gateway.pipeline.configure([spec("cache", "cache", {})])


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"cacheConfig": {"type": "ROCKSDB", "rocksdbConfig": {"dbPath": "/tmp/x"}}}, "cacheConfig.type: ROCKSDB"),
        ({"cacheConfig": {"type": "REDIS"}}, "cacheConfig.type: 'REDIS'"),
        ({"topic": "("}, "topic: "),
        ({"cacheConfig": {"inMemConfig": {"cacheSize": 0}}}, "cacheSize"),
        ({"cacheConfig": {"inMemConfig": {"expireTimeMs": "5"}}}, "expireTimeMs"),
        ({"cacheConfig": {"inMemConfig": {"size": 5}}}, "size"),
    ],
)
def test_bad_configs_are_refused_naming_the_field(config: dict[str, Any], message: str) -> None:
    with pytest.raises(InterceptorConfigError, match=message.replace("(", r"\(")):
        Harness(services=FakeServices()).add(Cache, config)


def test_interceptors_in_front_of_the_cache_see_what_it_serves(tansu: TansuBroker) -> None:
    """Header removal in front of the cache: records served from the cache lose the header too."""
    chain = [
        spec("strip", "header-removal", {"topic": "cached-.*", "headerKeyRegex": "secret-.*"}, priority=10),
        spec("cache", "cache", {"topic": "cached-.*"}, priority=900),
    ]
    topic = unique("cached-front")
    create_topics(tansu, topic)
    producer = Producer({**direct(tansu), "linger.ms": 0})
    for i in range(20):
        producer.produce(topic, b"v%d" % i, partition=0, headers=[("secret-id", b"s"), ("kept", b"k")])
    assert producer.flush(30) == 0
    with safeguards_gateway(tansu, chain) as gateway:
        reads = []
        for _ in range(2):
            before = hits(gateway)
            consumer = Consumer({**through(gateway), "group.id": unique("cache"), "enable.auto.commit": False})
            try:
                consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
                got = []
                while len(got) < 20:
                    message = consumer.poll(1)
                    if message is not None:
                        assert message.error() is None, message.error()
                        got.append(message.headers())
            finally:
                consumer.close()
            reads.append((got, hits(gateway) - before))
    assert all(headers == [("kept", b"k")] for got, _ in reads for headers in got)
    assert reads[1][1] > 0  # the second read came (at least in part) from the cache
