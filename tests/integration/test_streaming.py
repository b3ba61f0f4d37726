"""Large responses are forwarded while they arrive (cut-through), byte for byte."""

from __future__ import annotations

import os
import time
import urllib.request
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition

from kanal.embedded import GatewayProcess, TansuBroker

pytestmark = pytest.mark.integration

COUNT = 4000  # 4 MB: Fetch responses far larger than one 256 KiB read


@pytest.fixture(scope="module")
def big_topic(tansu: TansuBroker) -> tuple[str, list[bytes]]:
    topic = f"streaming-{time.time_ns()}"
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1)]).values():
        future.result(timeout=15)
    values = [os.urandom(1000) for _ in range(COUNT)]
    producer = Producer({"bootstrap.servers": tansu.bootstrap, "linger.ms": 20, "batch.size": 1_000_000})
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(30) == 0
    return topic, values


def _confluent(bootstrap: str, topic: str) -> list[tuple[int, bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{time.time_ns()}",
            "fetch.max.bytes": 8_000_000,
            "max.partition.fetch.bytes": 8_000_000,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 60
    while len(out) < COUNT and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            out.append((msg.offset(), msg.value()))
    consumer.close()
    return out


def _kafka_python(bootstrap: str, topic: str) -> list[tuple[int, bytes]]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_bytes=8_000_000,
        max_partition_fetch_bytes=8_000_000,
    )
    tp = KTopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 60
    while len(out) < COUNT and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            out.extend((r.offset, r.value) for r in records)
    consumer.close()
    return out


@pytest.mark.parametrize("consume", [_confluent, _kafka_python], ids=["confluent-fetch-v16", "kafka-python-fetch-v12"])
def test_large_fetch_responses_arrive_intact(
    gateway: GatewayProcess,
    big_topic: tuple[str, list[bytes]],
    consume: Callable[[str, str], list[tuple[int, bytes]]],
) -> None:
    topic, values = big_topic
    before = _streamed_fetches(gateway)
    got = consume(gateway.bootstrap, topic)
    assert [offset for offset, _ in got] == list(range(COUNT))
    assert [value for _, value in got] == values
    assert _streamed_fetches(gateway) > before  # the cut-through path carried them


def _streamed_fetches(gateway: GatewayProcess) -> float:
    return _counter(gateway, 'gateway_streamed_responses_total{api_key="Fetch"}')


def _counter(gateway: GatewayProcess, series: str) -> float:
    port = gateway.env["GATEWAY_HTTP_PORT"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(series):
            return float(line.split()[-1])
    return 0.0


def test_large_produce_requests_are_streamed_and_stored_intact(gateway: GatewayProcess, tansu: TansuBroker) -> None:
    topic = f"streaming-produce-{time.time_ns()}"
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1)]).values():
        future.result(timeout=15)
    values = [os.urandom(1000) for _ in range(COUNT)]
    before = _counter(gateway, 'gateway_streamed_requests_total{api_key="Produce"}')
    producer = Producer(
        {"bootstrap.servers": gateway.bootstrap, "linger.ms": 50, "batch.size": 1_000_000, "batch.num.messages": 10_000}
    )
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(30) == 0
    assert _counter(gateway, 'gateway_streamed_requests_total{api_key="Produce"}') > before
    got = _confluent(tansu.bootstrap, topic)
    assert [offset for offset, _ in got] == list(range(COUNT))
    assert [value for _, value in got] == values
