"""Topic views through a real gateway, in front of a real broker, with three client libraries.

The gateway runs in this process (``tests/integration/inprocess.py``) with the topic-views plugin
registered directly; views are applied through the resource kind's ``apply``, as the admin layer does
on every node. Covered: filtering and projection with the physical offsets (confluent-kafka,
kafka-python, aiokafka), Metadata (partition count, own topic id), commit and resume with a
``<view>::`` group, INVALID_GROUP_ID otherwise, two views of one topic not sharing offsets, DROP and
FAIL_FETCH, produce refused, a consumer reading a view and its input topic at once.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

import kanal_topicviews.plugin as plugin
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from inprocess import bootstrap_of, inprocess_gateway
from kanal_topicviews.interceptor import PLUGIN_NAME
from kanal_topicviews.resource import topic_view_kind
from kanal_topicviews.views import view_topic_id

from kanal.embedded import TansuBroker

pytestmark = pytest.mark.integration

CLUSTER_ID = "views-clients"
GROUP_TIMINGS = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
RECORDS = 80


class Setup:
    def __init__(self, broker: TansuBroker, bootstrap: str, uid: str) -> None:
        self.broker = broker
        self.bootstrap = bootstrap
        self.uid = uid
        self.gateway: Any = None
        self.orders = f"orders-{uid}"
        self.dirty = f"dirty-{uid}"
        self.eur = f"eur-{uid}"  # amount > 300 AND currency = 'EUR', 3 fields
        self.cheap = f"cheap-{uid}"  # amount <= 300, on the same topic
        self.drop = f"drop-{uid}"
        self.fail = f"fail-{uid}"
        self.produced: list[tuple[int, int, dict[str, Any]]] = []  # partition, offset, value

    def expected_eur(self) -> set[tuple[int, int, bytes]]:
        return {
            (
                p,
                o,
                json.dumps(
                    {"id": v["id"], "amount": v["amount"], "cur": v["currency"]}, separators=(",", ":")
                ).encode(),
            )
            for p, o, v in self.produced
            if v["amount"] > 300 and v["currency"] == "EUR"
        }


def manifest(name: str, statement: str, on_error: str = "DROP") -> dict[str, Any]:
    return {
        "apiVersion": "gateway/v2",
        "kind": "TopicView",
        "metadata": {"name": name},
        "spec": {"transformation": {"type": "sql", "statement": statement}, "onError": {"type": on_error}},
    }


class _NoState:
    def resources(self, kind: str) -> list[dict[str, Any]]:
        return []


@pytest.fixture(scope="module")
def setup(tansu: TansuBroker) -> Iterator[Setup]:
    uid = uuid.uuid4().hex[:8]
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    s = Setup(tansu, "", uid)
    for future in admin.create_topics([NewTopic(s.orders, 2, 1), NewTopic(s.dirty, 1, 1)]).values():
        future.result(15)
    producer = Producer({"bootstrap.servers": tansu.bootstrap, "linger.ms": 20})
    offsets = [0, 0]
    for i in range(RECORDS):
        value = {"id": i, "amount": i * 37 % 1000, "currency": "EUR" if i % 3 else "USD", "pad": "x" * 50}
        producer.produce(s.orders, json.dumps(value).encode(), key=str(i).encode(), partition=i % 2)
        s.produced.append((i % 2, offsets[i % 2], value))
        offsets[i % 2] += 1
    for value in (b'{"id": 0}', b'{"id": 1}', b"not json", b'{"id": 3}', b"[4]", b'{"id": 5}'):
        producer.produce(s.dirty, value, partition=0)
        producer.flush(15)  # one batch each: the failing record is not the first of its batch either way
    assert producer.flush(15) == 0
    with inprocess_gateway(tansu, {"topic-views": plugin}, env={"GATEWAY_CLUSTER_ID": CLUSTER_ID}) as gateway:
        kind = topic_view_kind(gateway.services_for(PLUGIN_NAME))
        statuses = kind.apply(
            [
                manifest(
                    s.eur,
                    f"SELECT id, amount, currency AS cur FROM \"{s.orders}\" WHERE amount > 300 AND currency = 'EUR'",
                ),
                manifest(s.cheap, f'SELECT id FROM "{s.orders}" WHERE amount <= 300'),
                manifest(s.drop, f'SELECT id FROM "{s.dirty}" WHERE id >= 0'),
                manifest(s.fail, f'SELECT id FROM "{s.dirty}" WHERE id >= 0', "FAIL_FETCH"),
            ],
            _NoState(),
        )
        assert {st.state for st in statuses.values()} == {"Ready"}
        s.bootstrap = bootstrap_of(gateway)
        s.gateway = gateway
        yield s


def consume_confluent(bootstrap: str, topics: list[str], count: int, partitions: int = 2, **config: Any) -> list[Any]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False, **config})
    try:
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in range(partitions)])
        out: list[Any] = []
        deadline = time.monotonic() + 20
        while len(out) < count and time.monotonic() < deadline:
            for msg in consumer.consume(100, 0.5):
                if msg.error() is None:
                    out.append(msg)
                else:
                    out.append(msg.error())
        return out
    finally:
        consumer.close()


def test_confluent_filter_projection_and_physical_offsets(setup: Setup) -> None:
    expected = setup.expected_eur()
    got = consume_confluent(setup.bootstrap, [setup.eur], len(expected))
    assert {(m.partition(), m.offset(), m.value()) for m in got} == expected
    assert all(m.topic() == setup.eur for m in got)
    keys = {m.offset(): m.key() for m in got if m.partition() == 0}
    assert all(k == str(2 * o).encode() for o, k in keys.items())  # keys untouched: record i is at offset i // 2

    admin = AdminClient({"bootstrap.servers": setup.bootstrap})
    metadata = admin.list_topics(timeout=10)
    assert len(metadata.topics[setup.eur].partitions) == 2
    assert setup.orders in metadata.topics  # listing every topic shows input topics and views
    from confluent_kafka import TopicCollection

    described = admin.describe_topics(TopicCollection([setup.eur, setup.orders]))
    view_id = described[setup.eur].result(10).topic_id
    assert str(view_id) != str(described[setup.orders].result(10).topic_id)
    assert uuid.UUID(bytes=_uuid_bytes(view_id)) == view_topic_id(CLUSTER_ID, setup.eur)


def test_list_offsets_answer_the_input_topic_offsets(setup: Setup) -> None:
    consumer = Consumer({"bootstrap.servers": setup.bootstrap, "group.id": "unused"})
    try:
        for p in (0, 1):
            view_marks = consumer.get_watermark_offsets(TopicPartition(setup.eur, p), timeout=10)
            assert view_marks == consumer.get_watermark_offsets(TopicPartition(setup.orders, p), timeout=10)
            assert view_marks[0] == 0 and view_marks[1] > 0  # (Tansu's latest offset is its own)
        (by_time,) = consumer.offsets_for_times([TopicPartition(setup.eur, 1, 0)], timeout=10)
        assert (by_time.topic, by_time.offset) == (setup.eur, 0)
    finally:
        consumer.close()


def test_a_topic_cannot_be_created_under_a_view_name(setup: Setup) -> None:
    admin = AdminClient({"bootstrap.servers": setup.bootstrap})
    with pytest.raises(KafkaException) as error:
        admin.create_topics([NewTopic(setup.eur, 1, 1)])[setup.eur].result(10)
    assert error.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS


def _uuid_bytes(kafka_uuid: Any) -> bytes:
    msb, lsb = kafka_uuid.get_most_significant_bits(), kafka_uuid.get_least_significant_bits()
    return (msb & (2**64 - 1)).to_bytes(8, "big") + (lsb & (2**64 - 1)).to_bytes(8, "big")


def test_aiokafka_reads_the_view(setup: Setup) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as AioPartition

    expected = setup.expected_eur()

    async def run() -> set[tuple[int, int, bytes]]:
        consumer = AIOKafkaConsumer(bootstrap_servers=setup.bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([AioPartition(setup.eur, 0), AioPartition(setup.eur, 1)])
            await consumer.seek_to_beginning()
            got: set[tuple[int, int, bytes]] = set()
            deadline = time.monotonic() + 20
            while len(got) < len(expected) and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    got.update((r.partition, r.offset, r.value) for r in records)
            return got
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == expected


def kafka_python_consumer(setup: Setup, group: str, **config: Any) -> Any:
    from kafka import KafkaConsumer

    return KafkaConsumer(
        setup.eur,
        bootstrap_servers=setup.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
        consumer_timeout_ms=10_000,
        **config,
    )


def test_kafka_python_commits_and_resumes_with_a_view_group(setup: Setup) -> None:
    from kafka import TopicPartition as KTopicPartition

    expected = setup.expected_eur()
    group = f"{setup.eur}::resume"
    first = kafka_python_consumer(setup, group, max_poll_records=5)
    seen: list[tuple[int, int, bytes]] = []
    for msg in first:
        seen.append((msg.partition, msg.offset, msg.value))
        if len(seen) >= len(expected) // 2:
            break
    first.commit()
    committed = {p: first.committed(KTopicPartition(setup.eur, p)) for p in (0, 1)}
    first.close()
    positions = {p: max([o for q, o, _ in seen if q == p], default=-1) + 1 for p in (0, 1)}
    for p in (0, 1):  # the physical offset after the last record seen (a partition not read yet: none or 0)
        assert committed[p] == positions[p] or (positions[p] == 0 and committed[p] in (None, 0)), (committed, seen)

    second = kafka_python_consumer(setup, group)
    for msg in second:
        seen.append((msg.partition, msg.offset, msg.value))
        if len(seen) >= len(expected):
            break
    second.close()
    assert len(seen) == len(set(seen)) and set(seen) == expected  # resumed: nothing twice, nothing lost


def test_a_group_without_the_view_prefix_cannot_commit(setup: Setup) -> None:
    from kafka.errors import InvalidGroupIdError

    consumer = kafka_python_consumer(setup, "plain-group")
    next(iter(consumer))
    with pytest.raises(InvalidGroupIdError):
        consumer.commit()
    consumer.close()

    confluent = Consumer(
        {"bootstrap.servers": setup.bootstrap, "group.id": "plain-group-2", "enable.auto.commit": False}
    )
    try:
        with pytest.raises(KafkaException) as error:
            confluent.commit(offsets=[TopicPartition(setup.eur, 0, 3)], asynchronous=False)
        assert _commit_error(error.value) == KafkaError.INVALID_GROUP_ID
    finally:
        confluent.close()


def _commit_error(exc: KafkaException) -> int:
    err = exc.args[0]
    if err.code() == KafkaError._PARTITION_EOF or not isinstance(err, KafkaError):
        raise AssertionError(err)
    return int(err.code())


def _confluent_commit(setup: Setup, group: str, topic: str, offset: int) -> None:
    consumer = Consumer({"bootstrap.servers": setup.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


def _committed(setup: Setup, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": setup.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        return int(tp.offset)
    finally:
        consumer.close()


def test_two_views_of_one_topic_never_share_offsets(setup: Setup) -> None:
    _confluent_commit(setup, f"{setup.eur}::shared", setup.eur, 11)
    _confluent_commit(setup, f"{setup.cheap}::shared", setup.cheap, 4)
    assert _committed(setup, f"{setup.eur}::shared", setup.eur) == 11
    assert _committed(setup, f"{setup.cheap}::shared", setup.cheap) == 4
    # the eur group has no offsets on the other view, and may not write them
    assert _committed(setup, f"{setup.eur}::shared", setup.cheap) < 0
    for topic in (setup.cheap, setup.orders):
        with pytest.raises(KafkaException) as error:
            _confluent_commit(setup, f"{setup.eur}::shared", topic, 1)
        assert _commit_error(error.value) == KafkaError.INVALID_GROUP_ID


def test_drop_skips_what_cannot_be_transformed(setup: Setup) -> None:
    got = consume_confluent(setup.bootstrap, [setup.drop], 4, partitions=1)
    assert [(m.offset(), m.value()) for m in got] == [
        (0, b'{"id":0}'),
        (1, b'{"id":1}'),
        (3, b'{"id":3}'),
        (5, b'{"id":5}'),
    ]


def test_fail_fetch_stops_at_the_bad_record_with_an_error(setup: Setup) -> None:
    got = consume_confluent(setup.bootstrap, [setup.fail], 3, partitions=1)
    values = [(m.offset(), m.value()) for m in got if not isinstance(m, KafkaError)]
    errors = [e for e in got if isinstance(e, KafkaError)]
    assert values[:2] == [(0, b'{"id":0}'), (1, b'{"id":1}')] and len(values) == 2
    assert errors and errors[0].code() == KafkaError.INVALID_MSG, errors  # CORRUPT_MESSAGE (2)
    assert "failed at offset 2" in errors[0].str()

    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition
    from kafka.errors import CorruptRecordError

    consumer = KafkaConsumer(bootstrap_servers=setup.bootstrap, enable_auto_commit=False, consumer_timeout_ms=10_000)
    consumer.assign([KTopicPartition(setup.fail, 0)])
    consumer.seek(KTopicPartition(setup.fail, 0), 2)
    with pytest.raises(CorruptRecordError):
        consumer.poll(timeout_ms=5000)
        consumer.poll(timeout_ms=5000)
    consumer.close()


def test_producing_to_a_view_is_refused(setup: Setup) -> None:
    failures: list[Any] = []
    producer = Producer({"bootstrap.servers": setup.bootstrap, "message.timeout.ms": 10_000})
    producer.produce(setup.eur, b'{"id": 1}', partition=0, on_delivery=lambda err, msg: failures.append(err))
    producer.flush(15)
    assert [e.code() for e in failures] == [KafkaError.TOPIC_EXCEPTION]

    from kafka import KafkaProducer
    from kafka.errors import InvalidTopicError

    kp = KafkaProducer(bootstrap_servers=setup.bootstrap, retries=0)
    try:
        with pytest.raises(InvalidTopicError):
            kp.send(setup.eur, b'{"id": 1}', partition=0).get(timeout=15)
    finally:
        kp.close()


def test_one_consumer_reads_a_view_and_its_input_topic_together(setup: Setup) -> None:
    expected = {(p, o) for p, o, _ in setup.expected_eur()}
    got = consume_confluent(setup.bootstrap, [setup.eur, setup.orders], len(expected) + RECORDS)
    by_topic: dict[str, set[tuple[int, int]]] = {}
    for m in got:
        by_topic.setdefault(m.topic(), set()).add((m.partition(), m.offset()))
    assert by_topic[setup.eur] == expected
    assert len(by_topic[setup.orders]) == RECORDS


def test_topics_without_a_view_keep_the_fast_path(setup: Setup) -> None:
    """Fetch responses for topics no view reads are not decoded: large ones are forwarded while
    they arrive, as without any view."""
    plain = f"plain-{setup.uid}"
    admin = AdminClient({"bootstrap.servers": setup.broker.bootstrap})
    for future in admin.create_topics([NewTopic(plain, 1, 1)]).values():
        future.result(15)
    producer = Producer({"bootstrap.servers": setup.broker.bootstrap, "linger.ms": 20, "batch.size": 1_000_000})
    values = [bytes([i % 251]) * 2000 for i in range(1500)]  # 3 MB: Fetch responses above 256 KiB
    for value in values:
        producer.produce(plain, value, partition=0)
    assert producer.flush(15) == 0
    before = setup.gateway.metrics.registry.get_sample_value("gateway_streamed_responses_total", {"api_key": "Fetch"})
    got = consume_confluent(setup.bootstrap, [plain], len(values), partitions=1)
    assert [m.value() for m in got] == values
    after = setup.gateway.metrics.registry.get_sample_value("gateway_streamed_responses_total", {"api_key": "Fetch"})
    assert (after or 0) > (before or 0)
