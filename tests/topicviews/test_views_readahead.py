"""Read-ahead: a consumer that is behind on a view gets its next chunk from the gateway's read-ahead.

A topic of a few MB, consumed through a view by confluent-kafka, kafka-python (with a seek back in
the middle) and aiokafka: every kept record arrives once, with its physical offset (the projection
carries ``record.offset`` to prove it), some fetches were answered from read-aheads, and the helper
process ran part of the SQL.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

import kanal_topicviews.plugin as plugin
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from inprocess import bootstrap_of, inprocess_gateway
from kanal_topicviews.interceptor import PLUGIN_NAME, TopicViewsInterceptor
from kanal_topicviews.resource import topic_view_kind

from kanal.embedded import TansuBroker
from kanal.gateway import Gateway

pytestmark = pytest.mark.integration

RECORDS = 30_000
PAD = "p" * 200


class _NoState:
    def resources(self, kind: str) -> list[dict[str, Any]]:
        return []


class Setup:
    def __init__(self, gateway: Gateway, view: str, expected: list[tuple[int, bytes]]) -> None:
        self.gateway = gateway
        self.bootstrap = bootstrap_of(gateway)
        self.view = view
        self.expected = expected  # (offset, value) in offset order

    def interceptor(self) -> TopicViewsInterceptor:
        (item,) = [c for c in self.gateway.pipeline.resolve().interceptors if c.spec.name == "topic-views"]
        assert isinstance(item.instance, TopicViewsInterceptor)
        return item.instance


@pytest.fixture(scope="module")
def setup(tansu: TansuBroker) -> Iterator[Setup]:
    topic = f"stream-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
    producer = Producer({"bootstrap.servers": tansu.bootstrap, "linger.ms": 20, "batch.num.messages": 5000})
    expected = []
    for i in range(RECORDS):
        amount = i * 7 % 1000
        producer.produce(topic, json.dumps({"id": i, "amount": amount, "pad": PAD}).encode())
        if amount >= 400:
            expected.append((i, json.dumps({"id": i, "o": i}, separators=(",", ":")).encode()))
        if i % 5000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    view = f"big-{uuid.uuid4().hex[:6]}"
    with inprocess_gateway(tansu, {"topic-views": plugin}) as gateway:
        manifest = {
            "apiVersion": "gateway/v2",
            "kind": "TopicView",
            "metadata": {"name": view},
            "spec": {
                "transformation": {
                    "type": "sql",
                    "statement": f'SELECT id, record.offset AS o FROM "{topic}" WHERE amount >= 400',
                },
                "onError": {"type": "DROP"},
            },
        }
        assert {
            s.state for s in topic_view_kind(gateway.services_for(PLUGIN_NAME)).apply([manifest], _NoState()).values()
        } == {"Ready"}
        ready = Setup(gateway, view, expected)
        runtime = ready.interceptor().runtime
        assert runtime is not None and runtime.pool is not None
        # The first large chunk would start the helper process in the background (that chunk and the
        # next ones then stay in the gateway until it is ready): started here, so that it takes part.
        assert trio.run(runtime.pool.ready)
        yield ready


def test_confluent_from_the_beginning(setup: Setup) -> None:
    served = setup.interceptor().read_aheads_served
    consumer = Consumer(
        {
            "bootstrap.servers": setup.bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "fetch.queue.backoff.ms": 10,
        }
    )
    got: list[tuple[int, bytes]] = []
    try:
        consumer.assign([TopicPartition(setup.view, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 60
        while len(got) < len(setup.expected) and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                assert msg.error() is None, msg.error()
                got.append((msg.offset(), msg.value()))
    finally:
        consumer.close()
    assert got == setup.expected
    interceptor = setup.interceptor()
    assert interceptor.read_aheads_served > served
    assert interceptor.runtime is not None and interceptor.runtime.pool is not None
    assert interceptor.runtime.pool.started  # chunks of megabytes: half of their SQL ran in the helper


def test_kafka_python_with_a_seek_back(setup: Setup) -> None:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

    tp = KTopicPartition(setup.view, 0)
    consumer = KafkaConsumer(bootstrap_servers=setup.bootstrap, enable_auto_commit=False)
    got: list[tuple[int, bytes]] = []
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        rewound = False
        deadline = time.monotonic() + 60
        while len(got) < len(setup.expected) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend((r.offset, r.value) for r in records)
            if not rewound and len(got) > len(setup.expected) // 2:
                rewound = True
                consumer.seek(tp, 1000)  # back: read-aheads for the old position must not be used
                got = [g for g in got if g[0] < 1000]
    finally:
        consumer.close()
    assert rewound and got == setup.expected


def test_aiokafka_from_the_middle(setup: Setup) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as AioPartition

    start = RECORDS // 3
    expected = [e for e in setup.expected if e[0] >= start]

    async def run() -> list[tuple[int, bytes]]:
        consumer = AIOKafkaConsumer(bootstrap_servers=setup.bootstrap, enable_auto_commit=False)
        await consumer.start()
        got: list[tuple[int, bytes]] = []
        try:
            tp = AioPartition(setup.view, 0)
            consumer.assign([tp])
            consumer.seek(tp, start)
            deadline = time.monotonic() + 60
            while len(got) < len(expected) and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    got.extend((r.offset, r.value) for r in records)
        finally:
            await consumer.stop()
        return got

    assert asyncio.run(run()) == expected
