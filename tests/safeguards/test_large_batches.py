"""``large-batch``: whole record batches in the store, a reference batch of the same record count in
Kafka. Without a broker (``kanal.testing``'s harness over a local directory): every codec, the
header fields the broker checks, the broker's framing on fetch, forged or mismatched batches, a
failing store. With confluent-kafka clients through a gateway in front of Tansu and a moto S3
server: batches of several records round-trip with their offsets, keys, headers and timestamps, the
broker holds only the reference batch, idempotent and transactional producers keep working, and a
store that is down fails produce and fetch retriably, losing nothing."""

from __future__ import annotations

import functools
import hashlib
import logging
import random
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kanal_safeguards.plugin
import pytest
import trio
import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition
from kanal_safeguards.claim_check.large_batches import MARKER, BatchReference, LargeBatch
from kanal_safeguards.claim_check.large_messages import Reference
from safeguard_clients import create_topics, direct, read_to_end, safeguards_gateway, spec, through, unique, wait_for
from test_large_messages import MotoS3, end_offset

from kanal.api import (
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    ErrorCode,
    InterceptorConfigError,
    PartitionError,
    Record,
    RecordBatch,
    RecordSet,
    encode_batch,
)
from kanal.embedded import TansuBroker
from kanal.testing import Harness

LOGGER = "kanal_safeguards.claim_check.large_batches"
BASE_TIMESTAMP = 1_700_000_000_000

# ----------------------------------------------------------------------------- without a broker


def records(count: int, size: int = 40, seed: int = 0) -> list[Record]:
    """Records with keys, headers, distinct timestamps and incompressible values."""
    rng = random.Random(seed)
    return [
        Record(
            offset_delta=i,
            timestamp_delta=i * 7,
            key=b"key-%d" % i,
            value=rng.randbytes(size),
            headers=[("h", b"%d" % i), ("empty", None)],
        )
        for i in range(count)
    ]


def harness(store: Path, **config: Any) -> Harness:
    h = Harness()
    h.add(LargeBatch, {"localDiskDirectory": str(store), "minimumSizeInBytes": 200, **config})
    return h


def run(h: Harness, data: bytes, fetch: bool = False) -> tuple[RecordSet, PartitionError | None]:
    return trio.run(functools.partial(h.records, "t", 0, data, fetch=fetch))


def as_broker(produced: bytes, base_offset: int, **header: int) -> bytes:
    """What a broker hands out for a produced batch: offsets assigned, header fields set."""
    batch = RecordBatch.from_bytes(produced)
    batch.base_offset = base_offset
    batch.partition_leader_epoch = 5
    for name, value in header.items():
        setattr(batch, name, value)
    return batch.to_bytes()


@pytest.mark.parametrize("codec", [NONE, GZIP, SNAPPY, LZ4, ZSTD])
def test_a_batch_is_stored_whole_and_restored_with_the_brokers_offsets(tmp_path: Path, codec: int) -> None:
    h = harness(tmp_path)
    original = records(6)
    sent = encode_batch(
        original,
        base_timestamp=BASE_TIMESTAMP,
        compression=codec,
        producer_id=4321,
        producer_epoch=2,
        base_sequence=17,
        transactional=True,
    )
    produced, error = run(h, sent)
    assert error is None
    [batch] = produced.batches
    # the broker checks these: all as the producer sent them
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (4321, 2, 17)
    assert batch.is_transactional and batch.records_count == 6 and batch.last_offset_delta == 5
    assert batch.base_timestamp == BASE_TIMESTAMP and batch.compression == codec
    first, *rest = batch.records()
    assert first.key is None and [name for name, _ in first.headers] == [MARKER]
    reference = BatchReference.decode(first.value, first.headers[0][1])
    assert reference is not None and reference.size == len(sent)
    assert reference.sha256 == hashlib.sha256(sent).digest()
    assert (tmp_path / reference.key).read_bytes() == sent
    assert [(r.key, r.value, r.headers) for r in rest] == [(None, None, [])] * 5
    assert [r.offset_delta for r in batch.records()] == list(range(6))
    assert [r.timestamp_delta for r in batch.records()] == [r.timestamp_delta for r in original]

    fetched, error = run(h, as_broker(produced.to_bytes() or b"", 1000), fetch=True)
    assert error is None
    [restored] = fetched.batches
    assert restored.base_offset == 1000 and restored.partition_leader_epoch == 5
    assert restored.compression == codec and restored.is_transactional
    assert (restored.producer_id, restored.producer_epoch, restored.base_sequence) == (4321, 2, 17)
    assert restored.records() == original
    assert [restored.offset_of(r) for r in restored.records()] == list(range(1000, 1006))


def test_log_append_time_set_by_the_broker_stays(tmp_path: Path) -> None:
    h = harness(tmp_path)
    produced, _ = run(h, encode_batch(records(4), base_timestamp=BASE_TIMESTAMP))
    appended = as_broker(produced.to_bytes() or b"", 7, attributes=produced.batches[0].attributes | 0x08)
    appended_batch = RecordBatch.from_bytes(appended)
    appended_batch.max_timestamp = BASE_TIMESTAMP + 99_999
    fetched, error = run(h, appended_batch.to_bytes(), fetch=True)
    assert error is None
    [restored] = fetched.batches
    assert restored.timestamp_type == 1 and restored.max_timestamp == BASE_TIMESTAMP + 99_999
    assert [restored.timestamp_of(r) for r in restored.records()] == [BASE_TIMESTAMP + 99_999] * 4
    assert [r.value for r in restored.records()] == [r.value for r in records(4)]


def test_small_batches_and_other_topics_pass_untouched(tmp_path: Path) -> None:
    h = Harness()
    h.add(LargeBatch, {"localDiskDirectory": str(tmp_path), "minimumSizeInBytes": 200, "topic": "t"})
    small = encode_batch(records(2, size=10), base_timestamp=BASE_TIMESTAMP)
    assert len(small) < 200
    produced, error = run(h, small)
    assert error is None and produced.to_bytes() == small
    big = encode_batch(records(10), base_timestamp=BASE_TIMESTAMP)
    other, error = trio.run(functools.partial(h.records, "other", 0, big))
    assert error is None and other.to_bytes() == big
    assert list(tmp_path.iterdir()) == []


def test_several_batches_of_a_partition_are_stored_each(tmp_path: Path) -> None:
    h = harness(tmp_path)
    one = encode_batch(records(5, seed=1), base_timestamp=BASE_TIMESTAMP)
    small = encode_batch(records(1, size=5), base_timestamp=BASE_TIMESTAMP, base_offset=5)
    two = encode_batch(records(5, seed=2), base_timestamp=BASE_TIMESTAMP, base_offset=6)
    produced, error = run(h, one + small + two)
    assert error is None
    assert [b.records_count for b in produced.batches] == [5, 1, 5]
    assert len(list((tmp_path / "t" / "0").iterdir())) == 2
    fetched, error = run(h, produced.to_bytes() or b"", fetch=True)
    assert error is None
    assert [b.to_bytes() for b in fetched.batches] == [one, small, two]


def test_a_produce_carrying_the_marker_is_refused(tmp_path: Path) -> None:
    forged = encode_batch([Record(0, 0, None, b"x", [(MARKER, b"t/0/" + b"0" * 32)])], base_timestamp=BASE_TIMESTAMP)
    _, error = run(harness(tmp_path, minimumSizeInBytes=10**6), forged)
    assert error is not None and error.error_code == ErrorCode.invalid_record and MARKER in (error.message or "")


def test_a_corrupt_batch_is_refused_and_not_stored(tmp_path: Path) -> None:
    data = bytearray(encode_batch(records(5), base_timestamp=BASE_TIMESTAMP))
    data[-1] ^= 0xFF  # the CRC no longer matches
    _, error = run(harness(tmp_path), bytes(data))
    assert error is not None and error.error_code == ErrorCode.corrupt_message
    assert list(tmp_path.iterdir()) == []


def test_a_failing_store_fails_the_produce_retriably(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    h = harness(store)
    store.rmdir()
    store.write_bytes(b"")  # the directory is now a file: every write fails
    _, error = run(h, encode_batch(records(5), base_timestamp=BASE_TIMESTAMP))
    assert error is not None and error.error_code == ErrorCode.kafka_storage_error
    assert "large batch store unavailable" in (error.message or "")


def test_a_missing_or_foreign_object_fails_the_fetch(tmp_path: Path) -> None:
    h = harness(tmp_path)
    produced, _ = run(h, encode_batch(records(5), base_timestamp=BASE_TIMESTAMP))
    [batch] = produced.batches
    first = batch.records()[0]
    reference = BatchReference.decode(first.value, first.headers[0][1])
    assert reference is not None
    # an object of the right size and digest, but of another record count: never this batch's
    other = encode_batch(records(4, size=57), base_timestamp=BASE_TIMESTAMP)
    (tmp_path / reference.key).write_bytes(other)
    forged = BatchReference(reference.key, len(other), hashlib.sha256(other).digest())
    first.value = forged.encode()
    batch.mark_changed()
    _, error = run(h, produced.to_bytes() or b"", fetch=True)
    assert error is not None and error.error_code == ErrorCode.kafka_storage_error
    assert "is not the batch of offsets 0..4" in (error.message or "")
    (tmp_path / reference.key).unlink()
    _, error = run(h, produced.to_bytes() or b"", fetch=True)
    assert error is not None and error.error_code == ErrorCode.kafka_storage_error


def test_a_value_reference_is_not_a_batch_reference(tmp_path: Path) -> None:
    """A ``large-message`` reference under the batch marker is data, handed out as it is."""
    key = "t/0/" + "0" * 32
    value = Reference(key, 5, hashlib.sha256(b"value").digest()).encode()
    data = encode_batch([Record(0, 0, None, value, [(MARKER, key.encode())])], base_timestamp=BASE_TIMESTAMP)
    fetched, error = run(harness(tmp_path), data, fetch=True)
    assert error is None and fetched.to_bytes() == data


def test_restores_stop_at_the_budget(tmp_path: Path) -> None:
    h = harness(tmp_path, maximumRestoredBytesPerPartition=1)
    produced = [run(h, encode_batch(records(3, seed=i), base_timestamp=BASE_TIMESTAMP))[0] for i in range(3)]
    log = b"".join(as_broker(p.to_bytes() or b"", 3 * i) for i, p in enumerate(produced))
    fetched, error = run(h, log, fetch=True)
    assert error is None
    [restored] = fetched.batches  # the first always comes; the consumer fetches the others next
    assert restored.records() == records(3, seed=0)


def test_configs_are_those_of_large_message(tmp_path: Path) -> None:
    with pytest.raises(InterceptorConfigError, match=re.escape("s3Config, localDiskDirectory: a store is required")):
        Harness().add(LargeBatch, {})
    with pytest.raises(InterceptorConfigError, match=re.escape("minimumSizeInBytes: Expected `int` >= 1")):
        Harness().add(LargeBatch, {"localDiskDirectory": str(tmp_path), "minimumSizeInBytes": 0})
    Harness().add(LargeBatch, {"s3Config": {"bucketName": "b"}, "topic": "a.*", "minimumSizeInBytes": 1})
    types = {cls.plugin_name: cls for cls in kanal_safeguards.plugin.kanal_interceptor_types()}
    assert types["large-batch"] is LargeBatch


DOC = Path(__file__).resolve().parents[2] / "docs" / "safeguards-large-messages.md"


def test_the_operator_doc_example_is_accepted(tmp_path: Path) -> None:
    text = DOC.read_text().replace("/var/lib/kanal/large-values", str(tmp_path))
    text = text.replace("${S3_ACCESS_KEY}", "AKIAEXAMPLE").replace("${S3_SECRET_KEY}", "secret")
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    declared = [entry for block in blocks for entry in yaml.safe_load(block)["interceptors"]]
    batches = [entry for entry in declared if entry["plugin"] == "large-batch"]
    assert batches
    for entry in batches:
        Harness().add(LargeBatch, entry["config"])
    assert "`4B 41 4E 41 4C 2D 4C 42`" in text and BatchReference.MAGIC.hex(" ").upper() == "4B 41 4E 41 4C 2D 4C 42"


# ----------------------------------------------------------------------------- a gateway, Tansu, moto


THRESHOLD = 50_000
COUNT = 20
#: librdkafka waits this long for more records before it sends a batch: every test batch is one.
PRODUCER: dict[str, Any] = {"linger.ms": 500, "batch.num.messages": 10_000}


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[MotoS3]:
    server = MotoS3(log_dir=tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def bucket_of(s3: MotoS3) -> str:
    bucket = f"lb-{uuid.uuid4().hex[:8]}"
    s3.client().create_bucket(Bucket=bucket)
    return bucket


def large_batch(s3: MotoS3, bucket: str, **config: Any) -> Any:
    return spec("large", "large-batch", {"minimumSizeInBytes": THRESHOLD, "s3Config": s3.config(bucket), **config})


Produced = tuple[bytes, bytes, list[tuple[str, bytes]], int]


def batch_of(seed: int, count: int = COUNT, size: int = 4000) -> list[Produced]:
    """(key, value, headers, timestamp) of records that make one batch above the threshold, even
    compressed: each value is ``size`` random bytes, then as many that compress away (librdkafka
    sends a batch uncompressed when compression would not make it smaller)."""
    rng = random.Random(seed)
    return [
        (
            b"key-%d-%d" % (seed, i),
            rng.randbytes(size) + bytes([i]) * size,
            [("n", b"%d" % i), ("seed", b"%d" % seed)],
            1_000 * seed + i,
        )
        for i in range(count)
    ]


def send(producer: Producer, topic: str, batch: list[Produced], reports: list[tuple[KafkaError | None, int]]) -> None:
    for key, value, headers, timestamp in batch:
        producer.produce(
            topic,
            value,
            key,
            partition=0,
            headers=headers,
            timestamp=BASE_TIMESTAMP + timestamp,
            on_delivery=lambda e, m: reports.append((e, m.offset())),
        )


def produce(config: dict[str, Any], topic: str, *batches: list[Produced]) -> list[tuple[KafkaError | None, int]]:
    """Each batch produced as one (all its records within ``linger.ms``, then flushed); the
    delivery reports (error, offset)."""
    producer = Producer({**config, **PRODUCER})
    reports: list[tuple[KafkaError | None, int]] = []
    for batch in batches:
        send(producer, topic, batch, reports)
        assert producer.flush(60) == 0
    return reports


def seen(messages: list[Message]) -> list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]], int]]:
    """(offset, key, value, headers, timestamp) of what a consumer got."""
    return [(m.offset(), m.key(), m.value(), list(m.headers() or []), m.timestamp()[1]) for m in messages]


def expected(start: int, *batches: list[Produced]) -> list[tuple[int, bytes, bytes, list[tuple[str, bytes]], int]]:
    flat = [record for batch in batches for record in batch]
    return [(start + i, k, v, h, BASE_TIMESTAMP + t) for i, (k, v, h, t) in enumerate(flat)]


def check_reference_batch(on_broker: list[Message], start: int, count: int) -> BatchReference:
    """What a consumer of the broker itself sees of a stored batch: a reference, then empties, at
    the batch's offsets and with its records' timestamps; returns the reference."""
    batch = [m for m in on_broker if start <= m.offset() < start + count]
    assert [m.offset() for m in batch] == list(range(start, start + count))
    first, *rest = batch
    headers = dict(first.headers() or [])
    assert first.key() is None and list(headers) == [MARKER]
    reference = BatchReference.decode(first.value(), headers[MARKER])
    assert reference is not None and reference.key.startswith(f"{first.topic()}/0/")
    assert all(m.key() is None and m.value() is None and m.headers() is None for m in rest)
    return reference


def test_batches_round_trip_through_s3_with_their_offsets(tansu: TansuBroker, s3: MotoS3) -> None:
    bucket, topic = bucket_of(s3), unique("lb")
    create_topics(tansu, topic)
    one, small, two = batch_of(1), batch_of(2, count=3, size=100), batch_of(3, count=7, size=9000)
    with safeguards_gateway(tansu, [large_batch(s3, bucket)]) as gw:
        reports = produce(through(gw, **{"compression.type": "zstd"}), topic, one, small, two)
        assert reports == [(None, offset) for offset in range(COUNT + 3 + 7)]
        assert seen(read_to_end(through(gw), topic)) == expected(0, one, small, two)

    on_broker = read_to_end(direct(tansu), topic)
    assert len(on_broker) == COUNT + 3 + 7
    first = check_reference_batch(on_broker, 0, COUNT)
    assert seen(on_broker[COUNT : COUNT + 3]) == expected(COUNT, small)  # under the threshold: as it was
    second = check_reference_batch(on_broker, COUNT + 3, 7)
    assert [m.timestamp()[1] for m in on_broker] == [BASE_TIMESTAMP + t for *_, t in one + small + two]
    assert sum(len(m.value() or b"") for m in on_broker) < 2_000  # the data is not in Kafka

    listed = s3.client().list_objects_v2(Bucket=bucket).get("Contents", [])
    assert sorted(o["Key"] for o in listed) == sorted([first.key, second.key])
    stored = s3.client().get_object(Bucket=bucket, Key=first.key)["Body"].read()
    assert hashlib.sha256(stored).digest() == first.sha256
    batch = RecordBatch.from_bytes(stored)  # the batch as the producer sent it, compressed
    assert batch.records_count == COUNT and batch.compression == ZSTD and len(stored) < COUNT * 4000 * 2
    assert [r.value for r in batch.records()] == [v for _, v, _, _ in one]


def test_idempotent_and_transactional_producers(tansu: TansuBroker, s3: MotoS3) -> None:
    """The reference batch keeps the producer id, epoch and sequence: the broker takes batch after
    batch (a sequence gap would fail them), and transaction markers and read_committed work."""
    bucket, topic = bucket_of(s3), unique("lb")
    create_topics(tansu, topic)
    batches = [batch_of(10 + i, count=10, size=6000) for i in range(3)]
    with safeguards_gateway(tansu, [large_batch(s3, bucket)]) as gw:
        reports = produce(through(gw, **{"enable.idempotence": True, "compression.type": "lz4"}), topic, *batches)
        assert reports == [(None, offset) for offset in range(30)]

        aborted, committed = batch_of(20, count=8, size=7000), batch_of(21, count=8, size=7000)
        producer = Producer({**through(gw), **PRODUCER, "transactional.id": unique("lb-tx")})
        producer.init_transactions(30)
        tx_reports: list[tuple[KafkaError | None, int]] = []
        producer.begin_transaction()
        send(producer, topic, aborted, tx_reports)
        assert producer.flush(30) == 0
        producer.abort_transaction(30)
        producer.begin_transaction()
        send(producer, topic, committed, tx_reports)
        producer.commit_transaction(30)
        assert [e for e, _ in tx_reports] == [None] * 16
        # (the abort marker takes offset 38)
        assert [o for _, o in tx_reports] == [*range(30, 38), *range(39, 47)]

        everything = expected(0, *batches, aborted) + expected(39, committed)
        assert seen(read_to_end(through(gw), topic)) == everything
        # read_committed: the records the broker's own answer holds (Tansu 0.6 leaves aborted ones in)
        committed_only = read_to_end(direct(tansu), topic, **{"isolation.level": "read_committed"})
        offsets = {m.offset() for m in committed_only}
        assert offsets >= {*range(30), *range(39, 47)}
        got = read_to_end(through(gw), topic, **{"isolation.level": "read_committed"})
        assert seen(got) == [record for record in everything if record[0] in offsets]

    on_broker = read_to_end(direct(tansu), topic)
    references = [check_reference_batch(on_broker, start, count) for start, count in ((0, 10), (10, 10), (20, 10))]
    check_reference_batch(on_broker, 30, 8)
    check_reference_batch(on_broker, 39, 8)  # (after the abort marker)
    assert len(s3.client().list_objects_v2(Bucket=bucket).get("Contents", [])) == 5
    stored = [
        RecordBatch.from_bytes(s3.client().get_object(Bucket=bucket, Key=r.key)["Body"].read()) for r in references
    ]
    assert {b.compression for b in stored} == {LZ4} and len({b.producer_id for b in stored}) == 1
    assert stored[0].producer_id >= 0 and [b.base_sequence for b in stored] == [0, 10, 20]


def test_s3_down_fails_the_produce_nothing_is_written_and_it_works_again_after(
    tansu: TansuBroker, s3: MotoS3, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    bucket, topic = bucket_of(s3), unique("lb")
    create_topics(tansu, topic)
    lost, retried, after = batch_of(30), batch_of(31), batch_of(32)
    with safeguards_gateway(tansu, [large_batch(s3, bucket)]) as gw:
        s3.stop()
        # a producer that gives up soon gets the error
        reports = produce(through(gw, **{"message.timeout.ms": 3000}), topic, lost)
        assert len(reports) == COUNT and all(e is not None for e, _ in reports)
        codes = {e.code() for e, _ in reports if e is not None}
        assert codes <= {KafkaError.KAFKA_STORAGE_ERROR, KafkaError._MSG_TIMED_OUT}, codes
        assert end_offset(tansu, topic) == 0

        # a patient one retries until the store is back, and its batch is written once
        producer = Producer({**through(gw), **PRODUCER, "message.timeout.ms": 120_000, "retry.backoff.ms": 200})
        retry_reports: list[tuple[KafkaError | None, int]] = []
        send(producer, topic, retried, retry_reports)

        def store_failures() -> int:
            producer.poll(0.05)
            return sum("not written, the store failed" in r.getMessage() for r in caplog.records)

        failed_before = store_failures()
        wait_for(lambda: store_failures() >= failed_before + 2, what="the producer retrying while S3 is down")
        assert retry_reports == [], "the producer gave up instead of retrying"
        assert end_offset(tansu, topic) == 0

        s3.start()  # back, but empty: the bucket is made again
        s3.client().create_bucket(Bucket=bucket)
        assert producer.flush(60) == 0
        assert retry_reports == [(None, offset) for offset in range(COUNT)]
        assert produce(through(gw), topic, after) == [(None, offset) for offset in range(COUNT, 2 * COUNT)]
        assert seen(read_to_end(through(gw), topic)) == expected(0, retried, after)

    on_broker = read_to_end(direct(tansu), topic)
    assert len(on_broker) == 2 * COUNT
    keys = {check_reference_batch(on_broker, 0, COUNT).key, check_reference_batch(on_broker, COUNT, COUNT).key}
    assert {o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket).get("Contents", [])} == keys


def test_s3_down_on_fetch_hands_out_no_reference(
    tansu: TansuBroker, s3: MotoS3, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    bucket, topic = bucket_of(s3), unique("lb")
    create_topics(tansu, topic)
    batch = batch_of(40)
    with safeguards_gateway(tansu, [large_batch(s3, bucket)]) as gw:
        assert [e for e, _ in produce(through(gw), topic, batch)] == [None] * COUNT
        reference = check_reference_batch(read_to_end(direct(tansu), topic), 0, COUNT)
        stored = s3.client().get_object(Bucket=bucket, Key=reference.key)["Body"].read()
        s3.stop()
        consumer = Consumer({**through(gw), "group.id": unique("lb"), "enable.auto.commit": False})
        try:
            consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
            got: list[Message] = []

            def fetch_failures() -> int:
                message = consumer.poll(0.05)
                if message is not None and message.error() is None:
                    got.append(message)
                return sum("fetch failed, the store failed" in r.getMessage() for r in caplog.records)

            wait_for(lambda: fetch_failures() >= 3, what="the consumer fetching again while S3 is down")
            assert got == [], "the consumer got a record while S3 was down"

            s3.start()  # back (empty: the object is put back as it was)
            s3.client().create_bucket(Bucket=bucket)
            s3.client().put_object(Bucket=bucket, Key=reference.key, Body=stored)

            def restored() -> bool:
                fetch_failures()
                return len(got) >= COUNT

            wait_for(restored, what="the records once S3 is back")
            assert seen(got) == expected(0, batch)
        finally:
            consumer.close()


def test_a_client_cannot_send_the_marker_header(tansu: TansuBroker, s3: MotoS3) -> None:
    """A forged reference would make the gateway read any object of the store for the client."""
    topic = unique("lb")
    create_topics(tansu, topic)
    with safeguards_gateway(tansu, [large_batch(s3, bucket_of(s3))]) as gw:
        producer = Producer({**through(gw), "linger.ms": 0})
        reports: list[KafkaError | None] = []
        producer.produce(
            topic,
            b"v",
            partition=0,
            headers=[(MARKER, b"x/0/" + b"0" * 32)],
            on_delivery=lambda e, _: reports.append(e),
        )
        assert producer.flush(30) == 0
    assert reports[0] is not None and reports[0].code() == KafkaError.INVALID_RECORD
    assert end_offset(tansu, topic) == 0
