"""The same user scenario with three Kafka clients, direct to the broker and through the gateway.

One scenario function per client (confluent-kafka, kafka-python, aiokafka) does what an application
does: create one 3-partition topic per compression codec, produce keyed records with headers and
explicit timestamps, consume them back in a consumer group, commit, read the committed offsets back
(from the consumer and from an admin client), list and describe the topics, delete them.

Each returns a :class:`ScenarioResult` with topic names and timestamps normalized away, so that

- ``test_scenario`` checks what a user would see (every record back with the same key, value,
  headers, timestamp and partition; consecutive offsets; committed == consumed positions; topics
  listed, described with 3 partitions, gone after delete), and
- ``test_gateway_same_as_broker`` checks the gateway result equals the direct one, field by field.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import pytest

from kanal.embedded import GatewayProcess, TansuBroker

pytestmark = pytest.mark.integration

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
PARTITIONS = 3
RECORDS_PER_CODEC = 200
TIMEOUT = 20.0  # seconds, for any single wait (produce flush, consume, admin)

# Test consumers join groups quickly only with these (Tansu's rebalance otherwise takes ~20 s).
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 500

Headers = tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True, order=True)
class Rec:
    """A record as the user sees it; ``timestamp`` is relative to the scenario's base time."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp: int


@dataclass(frozen=True)
class Outgoing:
    key: bytes
    value: bytes | None
    headers: Headers
    timestamp: int  # relative to the run's base time


@dataclass
class ScenarioResult:
    """What one client saw; topic names replaced by their codec, so runs compare equal."""

    client: str
    codecs: tuple[str, ...]
    sent: dict[str, list[Outgoing]] = field(default_factory=dict)
    produced: dict[str, list[Rec]] = field(default_factory=dict)  # from delivery reports
    consumed: dict[str, list[Rec]] = field(default_factory=dict)
    positions: dict[str, dict[int, int]] = field(default_factory=dict)  # consumer positions at commit
    committed: dict[str, dict[int, int]] = field(default_factory=dict)  # read back by the consumer
    committed_admin: dict[str, dict[int, int]] = field(default_factory=dict)  # read back by an admin
    listed: list[str] = field(default_factory=list)  # codecs whose topic was listed
    described: dict[str, int] = field(default_factory=dict)  # codec -> partition count
    listed_after_delete: list[str] = field(default_factory=list)  # codecs whose topic is still listed
    # Where the client was told to go; differs between direct and gateway, so not compared.
    brokers: dict[int, str] = field(default_factory=dict)  # node id -> host:port, from metadata
    coordinator: tuple[int, str] | None = None  # the group's coordinator, where the client reports it

    ADDRESS_FIELDS = ("brokers", "coordinator")


def outgoing_records(codec: str, *, null_header: bool = True) -> list[Outgoing]:
    """Deterministic records: 13 keys, values of varied size (some null), headers including a
    repeated key, an empty value, a null value (unless the client refuses them) and a non-ASCII name."""
    records = []
    for i in range(RECORDS_PER_CODEC):
        value: bytes | None = None if i % 50 == 49 else (f"{codec}:{i}:".encode() + bytes(range(i % 97)) * 3)
        headers: Headers = (
            ("idx", str(i).encode()),
            ("codec", codec.encode()),
            ("dup", b"first"),
            ("dup", b"second"),
            ("empty", b""),
            *((("null", None),) if null_header else ()),
            ("ключ", "значение".encode()),
        )
        records.append(Outgoing(key=f"key-{i % 13}".encode(), value=value, headers=headers, timestamp=i * 7))
    return records


class Names:
    """Topic and group names of one scenario run; maps topic names back to codecs."""

    def __init__(self, client: str, codecs: Sequence[str]) -> None:
        run = uuid.uuid4().hex[:10]
        self.topics = {codec: f"clients-{client}-{codec}-{run}" for codec in codecs}
        self.codec_of = {topic: codec for codec, topic in self.topics.items()}
        self.group = f"clients-{client}-group-{run}"
        self.base_ts = int(time.time() * 1000) - 60_000


def wait_until(check: Callable[[], bool], timeout: float = TIMEOUT, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def _headers(raw: Iterable[tuple[str, bytes | None]] | None) -> Headers:
    """Headers as a tuple; empty and null header values stay distinct."""
    return tuple((k, None if v is None else bytes(v)) for k, v in (raw or ()))


def _sorted(recs: dict[str, list[Rec]]) -> dict[str, list[Rec]]:
    return {codec: sorted(items) for codec, items in recs.items()}


# ----------------------------------------------------------------------------------- confluent-kafka


def confluent_codecs() -> tuple[str, ...]:
    return CODECS  # librdkafka in the wheel is built with all of them


def _delivery_report(
    rec: Outgoing, reports: list[tuple[Outgoing, int, int]], errors: list[str]
) -> Callable[[Any, Any], None]:
    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            reports.append((rec, msg.partition(), msg.offset()))

    return on_delivery


def run_confluent(bootstrap: str) -> ScenarioResult:
    from confluent_kafka import (
        Consumer,
        ConsumerGroupTopicPartitions,
        KafkaException,
        Producer,
        TopicCollection,
        TopicPartition,
    )
    from confluent_kafka.admin import AdminClient, NewTopic

    codecs = confluent_codecs()
    names = Names("confluent", codecs)
    result = ScenarioResult("confluent", codecs)
    admin = AdminClient({"bootstrap.servers": bootstrap})

    futures = admin.create_topics(
        [NewTopic(t, num_partitions=PARTITIONS, replication_factor=1) for t in names.topics.values()],
        request_timeout=TIMEOUT,
    )
    for f in futures.values():
        f.result(TIMEOUT)

    for codec, topic in names.topics.items():
        producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5, "acks": "all"})
        sent = outgoing_records(codec)
        result.sent[codec] = sent
        reports: list[tuple[Outgoing, int, int]] = []
        errors: list[str] = []
        for rec in sent:
            producer.produce(
                topic,
                key=rec.key,
                value=rec.value,
                headers=list(rec.headers),
                timestamp=names.base_ts + rec.timestamp,
                on_delivery=_delivery_report(rec, reports, errors),
            )
        remaining = producer.flush(TIMEOUT)
        assert remaining == 0 and not errors, f"{codec}: {remaining} undelivered, errors {errors[:3]}"
        result.produced[codec] = [Rec(p, o, r.key, r.value, r.headers, r.timestamp) for r, p, o in reports]

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": names.group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
        }
    )
    try:
        consumer.subscribe(list(names.topics.values()))
        consumed: dict[str, list[Rec]] = defaultdict(list)
        total, expected = 0, RECORDS_PER_CODEC * len(codecs)
        deadline = time.monotonic() + TIMEOUT
        while total < expected and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=500, timeout=0.5):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                _kind, ts = msg.timestamp()
                consumed[names.codec_of[msg.topic()]].append(
                    Rec(
                        msg.partition(),
                        msg.offset(),
                        msg.key(),
                        msg.value(),
                        _headers(msg.headers()),
                        ts - names.base_ts,
                    )
                )
                total += 1
        result.consumed = dict(consumed)
        assignment = consumer.assignment()
        consumer.commit(asynchronous=False)
        for tp in consumer.position(assignment):
            if tp.offset >= 0:
                result.positions.setdefault(names.codec_of[tp.topic], {})[tp.partition] = tp.offset
        for tp in consumer.committed(assignment, timeout=TIMEOUT):
            if tp.offset >= 0:
                result.committed.setdefault(names.codec_of[tp.topic], {})[tp.partition] = tp.offset
    finally:
        consumer.close()

    request = ConsumerGroupTopicPartitions(
        names.group,
        [TopicPartition(t, p) for t in names.topics.values() for p in range(PARTITIONS)],
    )
    offsets = admin.list_consumer_group_offsets([request], request_timeout=TIMEOUT)[names.group].result(TIMEOUT)
    for tp in offsets.topic_partitions:
        if tp.offset >= 0:
            result.committed_admin.setdefault(names.codec_of[tp.topic], {})[tp.partition] = tp.offset

    group = admin.describe_consumer_groups([names.group], request_timeout=TIMEOUT)[names.group].result(TIMEOUT)
    result.coordinator = (group.coordinator.id, f"{group.coordinator.host}:{group.coordinator.port}")

    metadata = admin.list_topics(timeout=TIMEOUT)
    result.brokers = {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()}
    result.listed = sorted(names.codec_of[t] for t in metadata.topics if t in names.codec_of)
    described = admin.describe_topics(TopicCollection(list(names.topics.values())), request_timeout=TIMEOUT)
    for topic, f in described.items():
        result.described[names.codec_of[topic]] = len(f.result(TIMEOUT).partitions)

    for f in admin.delete_topics(list(names.topics.values()), request_timeout=TIMEOUT).values():
        f.result(TIMEOUT)

    def still_listed() -> list[str]:
        return sorted(names.codec_of[t] for t in admin.list_topics(timeout=TIMEOUT).topics if t in names.codec_of)

    wait_until(lambda: not still_listed())
    result.listed_after_delete = still_listed()
    return result


# ------------------------------------------------------------------------------------- kafka-python


def kafka_python_codecs() -> tuple[str, ...]:
    from kafka import codec

    present = {
        "none": True,
        "gzip": codec.has_gzip(),
        "snappy": codec.has_snappy(),
        "lz4": codec.has_lz4(),
        "zstd": codec.has_zstd(),
    }
    return tuple(c for c in CODECS if present[c])


def run_kafka_python(bootstrap: str) -> ScenarioResult:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

    codecs = kafka_python_codecs()
    names = Names("kafka-python", codecs)
    result = ScenarioResult("kafka-python", codecs)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(TIMEOUT * 1000))
    try:
        admin.create_topics(
            [NewTopic(t, num_partitions=PARTITIONS, replication_factor=1) for t in names.topics.values()]
        )

        for codec, topic in names.topics.items():
            producer = KafkaProducer(
                bootstrap_servers=bootstrap,
                compression_type=None if codec == "none" else codec,
                linger_ms=5,
                acks="all",
            )
            try:
                sent = outgoing_records(codec, null_header=False)  # KafkaProducer rejects None header values
                result.sent[codec] = sent
                futures = [
                    (
                        rec,
                        producer.send(
                            topic,
                            key=rec.key,
                            value=rec.value,
                            headers=list(rec.headers),
                            timestamp_ms=names.base_ts + rec.timestamp,
                        ),
                    )
                    for rec in sent
                ]
                producer.flush(TIMEOUT)
                produced = []
                for rec, fut in futures:
                    meta = fut.get(TIMEOUT)
                    produced.append(Rec(meta.partition, meta.offset, rec.key, rec.value, rec.headers, rec.timestamp))
                result.produced[codec] = produced
            finally:
                producer.close(timeout=TIMEOUT)

        consumer = KafkaConsumer(
            *names.topics.values(),
            bootstrap_servers=bootstrap,
            group_id=names.group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
        )
        try:
            consumed: dict[str, list[Rec]] = defaultdict(list)
            total, expected = 0, RECORDS_PER_CODEC * len(codecs)
            deadline = time.monotonic() + TIMEOUT
            while total < expected and time.monotonic() < deadline:
                for tp, messages in consumer.poll(timeout_ms=500).items():
                    for m in messages:
                        consumed[names.codec_of[tp.topic]].append(
                            Rec(m.partition, m.offset, m.key, m.value, _headers(m.headers), m.timestamp - names.base_ts)
                        )
                        total += 1
            result.consumed = dict(consumed)
            consumer.commit()
            for tp in consumer.assignment():
                codec = names.codec_of[tp.topic]
                result.positions.setdefault(codec, {})[tp.partition] = consumer.position(tp)
                committed = consumer.committed(tp)
                if committed is not None and committed >= 0:
                    result.committed.setdefault(codec, {})[tp.partition] = committed
        finally:
            consumer.close()

        offsets = admin.list_group_offsets(
            {names.group: [TopicPartition(t, p) for t in names.topics.values() for p in range(PARTITIONS)]}
        )[names.group]
        for tp, om in offsets.items():
            if om.offset >= 0:
                result.committed_admin.setdefault(names.codec_of[tp.topic], {})[tp.partition] = om.offset

        cluster = admin.describe_cluster()
        result.brokers = {b["broker_id"]: f"{b['host']}:{b['port']}" for b in cluster["brokers"]}
        result.listed = sorted(names.codec_of[t] for t in admin.list_topics() if t in names.codec_of)
        for desc in admin.describe_topics(list(names.topics.values())):
            assert desc["error_code"] == 0, desc
            result.described[names.codec_of[desc["name"]]] = len(desc["partitions"])

        admin.delete_topics(list(names.topics.values()))

        def still_listed() -> list[str]:
            return sorted(names.codec_of[t] for t in admin.list_topics() if t in names.codec_of)

        wait_until(lambda: not still_listed())
        result.listed_after_delete = still_listed()
    finally:
        admin.close()
    return result


# ------------------------------------------------------------------------------------------ aiokafka


def aiokafka_codecs() -> tuple[str, ...]:
    from aiokafka import codec

    present = {
        "none": True,
        "gzip": codec.has_gzip(),
        "snappy": codec.has_snappy(),
        "lz4": codec.has_lz4(),
        "zstd": codec.has_zstd(),
    }
    return tuple(c for c in CODECS if present[c])


def run_aiokafka(bootstrap: str) -> ScenarioResult:
    return asyncio.run(asyncio.wait_for(_run_aiokafka(bootstrap), timeout=6 * TIMEOUT))


async def _run_aiokafka(bootstrap: str) -> ScenarioResult:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    codecs = aiokafka_codecs()
    names = Names("aiokafka", codecs)
    result = ScenarioResult("aiokafka", codecs)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(TIMEOUT * 1000))
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(t, num_partitions=PARTITIONS, replication_factor=1) for t in names.topics.values()]
        )
        errors = [t for t in response.topic_errors if t[1] != 0]
        assert not errors, errors

        for codec, topic in names.topics.items():
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap,
                compression_type=None if codec == "none" else codec,
                linger_ms=5,
                acks="all",
                enable_idempotence=False,  # Tansu answers aiokafka's InitProducerId with an error
            )
            await producer.start()
            try:
                sent = outgoing_records(codec)
                result.sent[codec] = sent
                futures = [
                    await producer.send(
                        topic,
                        key=rec.key,
                        value=rec.value,
                        headers=list(rec.headers),
                        timestamp_ms=names.base_ts + rec.timestamp,
                    )
                    for rec in sent
                ]
                metas = await asyncio.wait_for(asyncio.gather(*futures), TIMEOUT)
                result.produced[codec] = [
                    Rec(m.partition, m.offset, r.key, r.value, r.headers, r.timestamp)
                    for r, m in zip(sent, metas, strict=True)
                ]
            finally:
                await producer.stop()

        consumer = AIOKafkaConsumer(
            *names.topics.values(),
            bootstrap_servers=bootstrap,
            group_id=names.group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
        )
        await consumer.start()
        try:
            consumed: dict[str, list[Rec]] = defaultdict(list)
            total, expected = 0, RECORDS_PER_CODEC * len(codecs)
            deadline = time.monotonic() + TIMEOUT
            while total < expected and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                for tp, messages in batches.items():
                    for m in messages:
                        consumed[names.codec_of[tp.topic]].append(
                            Rec(m.partition, m.offset, m.key, m.value, _headers(m.headers), m.timestamp - names.base_ts)
                        )
                        total += 1
            result.consumed = dict(consumed)
            await consumer.commit()
            for tp in consumer.assignment():
                codec = names.codec_of[tp.topic]
                result.positions.setdefault(codec, {})[tp.partition] = await consumer.position(tp)
                committed = await consumer.committed(tp)
                if committed is not None and committed >= 0:
                    result.committed.setdefault(codec, {})[tp.partition] = committed
        finally:
            await consumer.stop()

        offsets = await admin.list_consumer_group_offsets(
            names.group,
            partitions=[TopicPartition(t, p) for t in names.topics.values() for p in range(PARTITIONS)],
        )
        for tp, om in offsets.items():
            if om.offset >= 0:
                result.committed_admin.setdefault(names.codec_of[tp.topic], {})[tp.partition] = om.offset

        cluster = await admin.describe_cluster()
        result.brokers = {b["node_id"]: f"{b['host']}:{b['port']}" for b in cluster["brokers"]}
        result.listed = sorted(names.codec_of[t] for t in await admin.list_topics() if t in names.codec_of)
        for desc in await admin.describe_topics(list(names.topics.values())):
            assert desc["error_code"] == 0, desc
            result.described[names.codec_of[desc["topic"]]] = len(desc["partitions"])

        response = await admin.delete_topics(list(names.topics.values()))
        errors = [t for t in response.topic_error_codes if t[1] != 0]
        assert not errors, errors

        async def still_listed() -> list[str]:
            return sorted(names.codec_of[t] for t in await admin.list_topics() if t in names.codec_of)

        deadline = time.monotonic() + TIMEOUT
        while await still_listed() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        result.listed_after_delete = await still_listed()
    finally:
        await admin.close()
    return result


# ------------------------------------------------------------------------------------------- checks

SCENARIOS: dict[str, Callable[[str], ScenarioResult]] = {
    "confluent": run_confluent,
    "kafka-python": run_kafka_python,
    "aiokafka": run_aiokafka,
}

# (client, "direct" | "gateway") -> result, so the comparison reuses the runs of test_scenario.
_results: dict[tuple[str, str], ScenarioResult] = {}


def check_user_view(result: ScenarioResult) -> None:
    """Assert what a user of ``result.client`` would expect to see."""
    assert result.codecs, "no codec to test"
    for codec in result.codecs:
        where = f"{result.client}/{codec}"
        sent, produced = result.sent[codec], sorted(result.produced[codec])
        consumed = sorted(result.consumed.get(codec, []))

        # Everything produced was acknowledged, once, with the values we sent.
        assert len(produced) == len(sent) == RECORDS_PER_CODEC, where
        assert Counter((r.key, r.value, r.headers, r.timestamp) for r in produced) == Counter(
            (o.key, o.value, o.headers, o.timestamp) for o in sent
        ), where

        # Keyed records: one partition per key, and more than one partition in use.
        partition_of_key: dict[bytes | None, set[int]] = defaultdict(set)
        for r in produced:
            partition_of_key[r.key].add(r.partition)
        assert all(len(ps) == 1 for ps in partition_of_key.values()), (where, dict(partition_of_key))
        used = {r.partition for r in produced}
        assert used <= set(range(PARTITIONS)) and len(used) > 1, (where, used)

        # Offsets per partition start at 0 and are consecutive.
        per_partition: dict[int, list[int]] = defaultdict(list)
        for r in produced:
            per_partition[r.partition].append(r.offset)
        for partition, offsets in per_partition.items():
            assert offsets == list(range(len(offsets))), (where, partition, offsets[:10])

        # The consumer got back exactly the records the producer was told were written.
        assert len(consumed) == len(produced), (where, len(consumed), len(produced))
        for got, want in zip(consumed, produced, strict=True):
            assert got == want, where

        # Committed offsets equal the consumed positions, seen by the consumer and by an admin.
        ends = {p: len(offsets) for p, offsets in per_partition.items()}
        assert result.positions.get(codec) == ends, where
        assert result.committed.get(codec) == ends, where
        assert result.committed_admin.get(codec) == ends, where

    assert result.listed == sorted(result.codecs)
    assert result.described == dict.fromkeys(result.codecs, PARTITIONS)
    assert result.listed_after_delete == []


def scenario(client: str, mode: str, address: str) -> ScenarioResult:
    result = SCENARIOS[client](address)
    _results[(client, mode)] = result
    return result


@pytest.mark.parametrize("client", list(SCENARIOS))
def test_scenario(client: str, bootstrap: str, tansu: TansuBroker, request: pytest.FixtureRequest) -> None:
    mode = request.node.callspec.params["bootstrap"]
    result = scenario(client, mode, bootstrap)
    check_user_view(result)

    # The client must be sent back to where it bootstrapped: the broker, or the gateway's ports.
    if mode == "direct":
        expected = {tansu.node_id: tansu.bootstrap}
    else:
        env = request.getfixturevalue("gateway").env
        start, count = int(env["GATEWAY_PORT_START"]), int(env["GATEWAY_PORT_COUNT"])
        first_id = int(env["GATEWAY_MIN_BROKERID"])
        expected = {tansu.node_id: f"127.0.0.1:{start + tansu.node_id - first_id}"}
        assert tansu.node_id - first_id < count
    assert result.brokers == expected
    if result.coordinator is not None:
        assert result.coordinator == (tansu.node_id, expected[tansu.node_id])


@pytest.mark.parametrize("client", list(SCENARIOS))
def test_gateway_same_as_broker(client: str, tansu: TansuBroker, gateway: GatewayProcess) -> None:
    direct = _results.get((client, "direct")) or scenario(client, "direct", tansu.bootstrap)
    through = _results.get((client, "gateway")) or scenario(client, "gateway", gateway.bootstrap)
    compared = [f.name for f in fields(ScenarioResult) if f.name not in ScenarioResult.ADDRESS_FIELDS]
    for name in compared:
        mine, theirs = getattr(through, name), getattr(direct, name)
        if name in ("produced", "consumed"):  # arrival order may differ; content may not
            mine, theirs = _sorted(mine), _sorted(theirs)
        assert mine == theirs, f"{client}: {name} differs through the gateway"
