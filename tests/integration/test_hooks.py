"""Interceptor hooks seen through real clients and a real broker (gateway in this process)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from inprocess import bootstrap_of, inprocess_gateway

from kanal.api.context import Connection, RecordsContext, RequestContext
from kanal.api.hookspecs import hookimpl
from kanal.api.interceptor import Interceptor, InterceptorSpec
from kanal.api.results import PartitionError, Reject
from kanal.embedded import TansuBroker

pytestmark = pytest.mark.integration


class CreateTopicsPolicy(Interceptor):
    plugin_name = "test-create-topics-policy"
    request_api_keys = frozenset({19})

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> Reject | None:
        too_big = [t.name for t in ctx.request.topics if t.num_partitions > self.config["max"]]
        if too_big:
            return Reject(44, f"{', '.join(too_big)}: at most {self.config['max']} partitions")
        return None


class BlockPartitionOne(Interceptor):
    plugin_name = "test-block-partition-one"

    @hookimpl
    async def kanal_produce_records(self, ctx: RecordsContext) -> PartitionError | None:
        await trio.sleep(0)  # async hooks are awaited
        if ctx.partition == 1:
            return PartitionError(87, f"records for {ctx.topic}/1 are refused")
        return None


class UppercaseOnFetch(Interceptor):
    plugin_name = "test-uppercase"

    @hookimpl
    def kanal_fetch_records(self, ctx: RecordsContext) -> None:
        for batch in ctx.records.batches:
            if batch.is_control:
                continue
            for record in batch.records():
                if record.value is not None:
                    record.value = record.value.upper()
            batch.mark_changed()


class FailFetch(Interceptor):
    plugin_name = "test-fail-fetch"

    @hookimpl
    def kanal_fetch_records(self, ctx: RecordsContext) -> PartitionError | None:
        return PartitionError(29, "not for you")  # TOPIC_AUTHORIZATION_FAILED


class Lifecycle(Interceptor):
    plugin_name = "test-lifecycle"
    events: list[str] = []

    @hookimpl
    def kanal_connection_opened(self, connection: Connection) -> None:
        self.events.append(f"opened {connection.client_address}")

    @hookimpl
    def kanal_connection_closed(self, connection: Connection) -> None:
        self.events.append(f"closed {connection.client_address}")


class BrokenOnOpen(Interceptor):
    plugin_name = "test-broken-on-open"
    fail = True

    @hookimpl
    def kanal_connection_opened(self, connection: Connection) -> None:
        if BrokenOnOpen.fail:
            raise RuntimeError("plugin bug")


class TestPlugin:
    @hookimpl
    def kanal_interceptor_types(self) -> list[type[Interceptor]]:
        return [CreateTopicsPolicy, BlockPartitionOne, UppercaseOnFetch, Lifecycle, BrokenOnOpen, FailFetch]


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions)]).values():
        future.result(timeout=15)


def _consume_all(bootstrap: str, topic: str, partitions: int, expected: int) -> list[Any]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[Any] = []
    deadline = time.monotonic() + 30
    while len(out) < expected and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            out.append(msg)
    consumer.close()
    return out


def test_reject_reaches_the_admin_client_as_policy_violation(
    tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    spec = InterceptorSpec(name="policy", plugin="test-create-topics-policy", config={"max": 4})
    with inprocess_gateway(tansu, {"test": TestPlugin()}, [spec]) as gw:
        admin = AdminClient({"bootstrap.servers": bootstrap_of(gw)})
        big, small = unique_topic("big"), unique_topic("small")
        futures = admin.create_topics([NewTopic(big, 10), NewTopic(small, 2)])
        with pytest.raises(Exception) as info:
            futures[big].result(timeout=15)
        error = info.value.args[0]
        assert error.code() == KafkaError.POLICY_VIOLATION
        assert "at most 4 partitions" in error.str()
        with pytest.raises(Exception) as info:  # Reject answers for the whole request
            futures[small].result(timeout=15)
        assert info.value.args[0].code() == KafkaError.POLICY_VIOLATION
    topics = AdminClient({"bootstrap.servers": tansu.bootstrap}).list_topics(timeout=10).topics
    assert big not in topics and small not in topics


def test_partition_error_fails_only_that_partition(tansu: TansuBroker, unique_topic: Callable[..., str]) -> None:
    spec = InterceptorSpec(name="block-1", plugin="test-block-partition-one")
    topic = unique_topic()
    _create(tansu.bootstrap, topic, 2)
    with inprocess_gateway(tansu, {"test": TestPlugin()}, [spec]) as gw:
        producer = Producer({"bootstrap.servers": bootstrap_of(gw), "linger.ms": 20, "retries": 0})
        reports: list[tuple[int, Any]] = []
        for i in range(20):
            producer.produce(
                topic,
                value=f"v{i}".encode(),
                partition=i % 2,
                on_delivery=lambda err, msg: reports.append((msg.partition(), err)),
            )
        assert producer.flush(20) == 0
    by_partition = {p: [e for q, e in reports if q == p] for p in (0, 1)}
    assert all(e is None for e in by_partition[0]) and len(by_partition[0]) == 10
    assert len(by_partition[1]) == 10
    assert all(e is not None and e.code() == KafkaError.INVALID_RECORD for e in by_partition[1])
    stored = _consume_all(tansu.bootstrap, topic, 2, 10)
    assert sorted(m.value() for m in stored) == sorted(f"v{i}".encode() for i in range(0, 20, 2))
    assert {m.partition() for m in stored} == {0}


def test_fetch_hook_changes_values_and_keeps_offsets(tansu: TansuBroker, unique_topic: Callable[..., str]) -> None:
    topic = unique_topic()
    _create(tansu.bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": tansu.bootstrap, "compression.type": "gzip"})
    for i in range(50):
        producer.produce(topic, key=f"k{i}".encode(), value=f"value-{i}".encode(), headers=[("h", b"1")])
    assert producer.flush(15) == 0
    direct = _consume_all(tansu.bootstrap, topic, 1, 50)
    spec = InterceptorSpec(name="upper", plugin="test-uppercase")
    with inprocess_gateway(tansu, {"test": TestPlugin()}, [spec]) as gw:
        through = _consume_all(bootstrap_of(gw), topic, 1, 50)
    assert [m.offset() for m in through] == [m.offset() for m in direct]
    assert [m.value() for m in through] == [m.value().upper() for m in direct]
    assert [(m.key(), m.headers(), m.timestamp()) for m in through] == [
        (m.key(), m.headers(), m.timestamp()) for m in direct
    ]


def test_connection_hooks_see_open_and_close(tansu: TansuBroker) -> None:
    Lifecycle.events.clear()
    spec = InterceptorSpec(name="life", plugin="test-lifecycle")
    with inprocess_gateway(tansu, {"test": TestPlugin()}, [spec]) as gw:
        AdminClient({"bootstrap.servers": bootstrap_of(gw)}).list_topics(timeout=10)
        deadline = time.monotonic() + 10
        while not any(e.startswith("closed") for e in Lifecycle.events) and time.monotonic() < deadline:
            time.sleep(0.05)
    opened = [e for e in Lifecycle.events if e.startswith("opened")]
    closed = [e for e in Lifecycle.events if e.startswith("closed")]
    assert opened and len(closed) == len(opened)


def test_a_failing_hook_costs_its_connection_not_the_gateway(tansu: TansuBroker) -> None:
    from wire import WireClient, metadata_request

    spec = InterceptorSpec(name="broken", plugin="test-broken-on-open")
    with inprocess_gateway(tansu, {"test": TestPlugin()}, [spec]) as gw:
        BrokenOnOpen.fail = True
        victim = WireClient(bootstrap_of(gw))
        assert victim.closed_by_peer(timeout=10)
        victim.close()
        BrokenOnOpen.fail = False
        healthy = WireClient(bootstrap_of(gw))
        try:
            assert healthy.call(metadata_request(), 1).brokers
        finally:
            healthy.close()


def _samples(gateway: object, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    text = generate_latest(gateway.metrics.registry).decode()  # type: ignore[attr-defined]
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def test_lifecycle_metrics_time_each_interceptor_and_the_upstream(
    tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    topic = unique_topic()
    _create(tansu.bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": tansu.bootstrap})
    producer.produce(topic, b"value")
    assert producer.flush(15) == 0
    spec = InterceptorSpec(name="upper", plugin="test-uppercase")
    env = {"GATEWAY_FEATURE_FLAGS_LIFECYCLE_METRICS": "true"}
    with inprocess_gateway(tansu, {"test": TestPlugin()}, [spec], env=env) as gw:
        assert [m.value() for m in _consume_all(bootstrap_of(gw), topic, 1, 1)] == [b"VALUE"]
        counts = _samples(gw, "gateway_request_lifecycle_seconds_count")
    labels = {dict(k)["stage"] + "/" + dict(k)["interceptor"] for k, v in counts.items() if v > 0}
    assert "fetch_records/upper" in labels and "upstream/" in labels
    assert all(dict(k)["api_key"] for k in counts)
    with inprocess_gateway(tansu, {"test": TestPlugin()}, [spec]) as gw:
        assert _samples(gw, "gateway_request_lifecycle_seconds_count") == {}


def test_fetch_partition_error_reaches_the_consumer(tansu: TansuBroker, unique_topic: Callable[..., str]) -> None:
    topic = unique_topic()
    _create(tansu.bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": tansu.bootstrap})
    producer.produce(topic, b"hidden")
    assert producer.flush(15) == 0
    spec = InterceptorSpec(name="deny", plugin="test-fail-fetch")
    with inprocess_gateway(tansu, {"test": TestPlugin()}, [spec]) as gw:
        consumer = Consumer({"bootstrap.servers": bootstrap_of(gw), "group.id": f"g-{topic}"})
        consumer.assign([TopicPartition(topic, 0, 0)])
        errors = []
        deadline = time.monotonic() + 20
        while not errors and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is not None, "the record must not be delivered"
                errors.append(msg.error().code())
        consumer.close()
    assert errors == [KafkaError.TOPIC_AUTHORIZATION_FAILED]


def test_large_produce_requests_a_hook_reads_arrive_whole(tansu: TansuBroker, unique_topic: Callable[..., str]) -> None:
    """Produce requests above the streaming threshold are read whole when a record hook needs them."""
    spec = InterceptorSpec(name="block-1", plugin="test-block-partition-one")
    topic = unique_topic()
    _create(tansu.bootstrap, topic, 1)
    values = [bytes([i % 251]) * 1000 for i in range(3000)]
    with inprocess_gateway(tansu, {"test": TestPlugin()}, [spec]) as gw:
        producer = Producer({"bootstrap.servers": bootstrap_of(gw), "linger.ms": 200, "batch.size": 1_000_000})
        for value in values:
            producer.produce(topic, value=value, partition=0)
        assert producer.flush(30) == 0
        sizes = gw.metrics.registry.get_sample_value("gateway_request_bytes_total", {"api_key": "Produce"})
        count = gw.metrics.registry.get_sample_value("gateway_requests_total", {"api_key": "Produce"})
    assert sizes is not None and count and sizes / count > 256 * 1024  # requests above the threshold
    assert [m.value() for m in _consume_all(tansu.bootstrap, topic, 1, len(values))] == values
