"""``chargeback`` (safeguards plugin) in a gateway in front of Tansu: a confluent-kafka producer and
consumer go through the gateway; the Prometheus counters move by their record bytes and requests, and
the totals are flushed as JSON records to the chargeback topic (read from the broker itself), both
periodically and when the gateway stops."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import kanal_safeguards.plugin
import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]
from safeguard_clients import create_topics, direct, read_count, safeguards_gateway, spec, through, wait_for

from kanal.api import InterceptorConfigError, Record, encode_batch
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway
from kanal.pipeline.chain import Pipeline
from kanal.pipeline.registry import PluginRegistry
from kanal.testing import FakeServices

USAGE_TOPIC = "_usage-chargeback"
VALUES = [b"first", b"second value", b"x" * 300, b"fourth"]
PRODUCER = "cb-producer"
CONSUMER = "cb-consumer"


def produce_one_by_one(gateway: Gateway, topic: str) -> None:
    """One Produce request per value: a record batch of one record each, uncompressed."""
    producer = Producer(through(gateway, **{"client.id": PRODUCER, "linger.ms": 0, "compression.type": "none"}))
    for value in VALUES:
        producer.produce(topic, value, partition=0)
        assert producer.flush(30) == 0


def flushed(tansu: TansuBroker, topic: str) -> list[dict[str, Any]]:
    """Every record of the chargeback topic so far (values), read from the broker itself."""
    consumer = Consumer({**direct(tansu), "group.id": "cb-flushed", "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        values: list[dict[str, Any]] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error() is not None:  # the end of the partition (or the topic is not there yet)
                return values
            value = orjson.loads(message.value())
            assert orjson.loads(message.key()) == {k: value[k] for k in ("principal", "vcluster", "topic", "clientId")}
            values.append(value)
        return values
    finally:
        consumer.close()


def sample(gateway: Gateway, metric: str, direction: str, topic: str, client_id: str) -> float:
    labels = {"direction": direction, "principal": "anonymous", "vcluster": "passthrough", "topic": topic}
    value = gateway.metrics.registry.get_sample_value(metric, {**labels, "client_id": client_id})
    return value or 0.0


def totals(records: list[dict[str, Any]], topic: str, client_id: str) -> dict[str, int]:
    """The sums of the flushed windows of one owner."""
    mine = [r for r in records if (r["principal"], r["vcluster"], r["topic"], r["clientId"]) == (
        "anonymous", "passthrough", topic, client_id)]  # fmt: skip
    return {k: sum(r[k] for r in mine) for k in ("bytesIn", "bytesOut", "requestsIn", "requestsOut")}


def batch_sizes() -> int:
    """The bytes of the producer's batches: one uncompressed record without key or headers each."""
    return sum(len(encode_batch([Record(offset_delta=0, value=v)], base_timestamp=0)) for v in VALUES)


@pytest.fixture(scope="module")
def gateway(tansu: TansuBroker) -> Iterator[Gateway]:
    config = {"topicName": USAGE_TOPIC, "flushIntervalInSecond": 0.5, "replicationFactor": -1}
    with safeguards_gateway(tansu, [spec("usage", "chargeback", config)]) as gw:
        yield gw


def test_counters_move_by_the_bytes_and_requests(tansu: TansuBroker, gateway: Gateway) -> None:
    topic = "cb-orders"
    create_topics(tansu, topic)
    produce_one_by_one(gateway, topic)
    expected = batch_sizes()
    assert sample(gateway, "gateway_chargeback_bytes_total", "in", topic, PRODUCER) == expected
    assert sample(gateway, "gateway_chargeback_requests_total", "in", topic, PRODUCER) == len(VALUES)

    read_count(through(gateway, **{"client.id": CONSUMER}), topic, len(VALUES))
    # the consumer fetched the very batches the producer wrote, each once
    assert wait_for(lambda: sample(gateway, "gateway_chargeback_bytes_total", "out", topic, CONSUMER) == expected)
    assert 1 <= sample(gateway, "gateway_chargeback_requests_total", "out", topic, CONSUMER) <= len(VALUES)
    assert sample(gateway, "gateway_chargeback_bytes_total", "out", topic, PRODUCER) == 0
    assert sample(gateway, "gateway_chargeback_bytes_total", "in", topic, CONSUMER) == 0

    # the flushes carry the same totals, as JSON records of the chargeback topic
    requests_out = sample(gateway, "gateway_chargeback_requests_total", "out", topic, CONSUMER)
    want_producer = {"bytesIn": expected, "bytesOut": 0, "requestsIn": len(VALUES), "requestsOut": 0}
    want_consumer = {"bytesIn": 0, "bytesOut": expected, "requestsIn": 0, "requestsOut": requests_out}
    records = wait_for(
        lambda: (
            (r := flushed(tansu, USAGE_TOPIC))
            and totals(r, topic, PRODUCER) == want_producer
            and totals(r, topic, CONSUMER) == want_consumer
            and r
        )
    )
    for record in records:
        assert set(record) == {
            "principal", "vcluster", "topic", "clientId", "windowStart", "windowEnd",
            "bytesIn", "bytesOut", "requestsIn", "requestsOut",
        }  # fmt: skip
        assert record["windowStart"] <= record["windowEnd"] <= time.time() * 1000
        assert record["bytesIn"] + record["bytesOut"] > 0  # idle owners are not written
    windows = sorted((r["windowStart"], r["windowEnd"]) for r in records)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(windows) if a != b)  # no overlap


def test_the_chargeback_topic_has_one_partition(tansu: TansuBroker, gateway: Gateway) -> None:
    wait_for(lambda: flushed(tansu, USAGE_TOPIC))  # written (created) by the previous test
    metadata = AdminClient(direct(tansu)).list_topics(USAGE_TOPIC, timeout=10)
    assert len(metadata.topics[USAGE_TOPIC].partitions) == 1


def test_the_last_window_is_flushed_when_the_gateway_stops(tansu: TansuBroker) -> None:
    topic = "cb-at-close"
    create_topics(tansu, topic)
    usage_topic = "_usage-at-close"
    config = {"topicName": usage_topic, "flushIntervalInSecond": 3600}  # never periodically in this test
    with safeguards_gateway(tansu, [spec("usage", "chargeback", config)]) as gw:
        produce_one_by_one(gw, topic)
        assert not AdminClient(direct(tansu)).list_topics(timeout=10).topics.get(usage_topic)
    records = wait_for(lambda: flushed(tansu, usage_topic))
    assert totals(records, topic, PRODUCER) == {
        "bytesIn": batch_sizes(),
        "bytesOut": 0,
        "requestsIn": len(VALUES),
        "requestsOut": 0,
    }


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, r"topicName: required"),
        ({"topicName": ""}, r"topicName: Expected `str` of length >= 1"),
        ({"topicName": "t", "flushIntervalInSecond": 0}, r"flushIntervalInSecond: Expected `float` > 0"),
        ({"topicName": "t", "replicationFactor": -2}, r"replicationFactor: Expected `int` >= -1"),
        ({"topicName": "t", "topic": "x"}, r"config: Object contains unknown field `topic`"),
    ],
)
def test_bad_configs_are_refused_naming_the_key(config: dict[str, Any], message: str) -> None:
    registry = PluginRegistry()
    registry.register(kanal_safeguards.plugin, "safeguards")
    pipeline = Pipeline(registry, lambda plugin: FakeServices())
    with pytest.raises(InterceptorConfigError, match=r"interceptor 'usage' \(chargeback\): " + message):
        pipeline.configure([spec("usage", "chargeback", config)])
