"""Record-batch codec: round trips, byte-exact pass-through, edits, and oracles.

Oracles: kafka-python's DefaultRecordBatch/DefaultRecordBatchBuilder (all codecs), kio.records
(uncompressed only; it truncates timestamps to whole seconds), and real captured Kafka frames.
"""

from __future__ import annotations

import base64
import json
import struct
import warnings
import zlib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.records.readers import read_batch as kio_read_batch

from kanal.protocol.records import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    GZIP,
    LOG_APPEND_TIME,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    CorruptRecordError,
    Record,
    RecordBatch,
    RecordSet,
    encode_batch,
)
from kanal.protocol.records.values import record_spans, records_area, write_record

with warnings.catch_warnings():  # kafka-python's import emits importlib.resources deprecations
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]
CODEC_IDS = ["none", "gzip", "snappy", "lz4", "zstd"]
BASE_TS = 1714564800123  # an exact millisecond: must never be rounded
Row = tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def sample_records(n: int = 20) -> list[Record]:
    out = []
    for i in range(n):
        value = json.dumps({"id": f"ord-{i:08d}", "amount": i * 7.5, "note": "y" * 40}).encode()
        headers: list[tuple[str, bytes | None]] = [("x-source", b"web"), ("trace-id", b"%032x" % i)]
        if i % 3 == 0:
            headers.append(("x-source", None))  # duplicate key, null value
        key = None if i % 5 == 0 else f"k-{i}".encode()
        out.append(Record(i, i * 37 + (i % 4), key, value, headers))
    out.append(Record(n, 999_999, b"null-value", None, []))
    return out


def ours(data: bytes | None) -> list[Row]:
    rs = RecordSet.parse(data)
    return [
        (b.offset_of(r), b.timestamp_of(r), r.key, r.value, list(r.headers)) for b in rs.batches for r in b.records()
    ]


def kp_read(batch: bytes) -> list[Row]:
    """Read one batch with kafka-python."""
    kb = DefaultRecordBatch(batch)
    assert kb.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in kb]


def kp_build(
    records: list[Record],
    codec: int,
    *,
    base_ts: int = BASE_TS,
    producer: tuple[int, int, int] = (-1, -1, -1),
    transactional: bool = False,
) -> bytes:
    """Write one batch with kafka-python (its base timestamp is the first record's timestamp)."""
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=transactional,
        producer_id=producer[0],
        producer_epoch=producer[1],
        base_sequence=producer[2],
        batch_size=1 << 30,
    )
    for r in records:
        assert b.append(r.offset_delta, base_ts + r.timestamp_delta, r.key, r.value, r.headers) is not None
    return bytes(b.build())


def rows(records: list[Record], base_offset: int = 0, base_ts: int = BASE_TS) -> list[Row]:
    return [
        (base_offset + r.offset_delta, base_ts + r.timestamp_delta, r.key, r.value, list(r.headers)) for r in records
    ]


def legacy_message(offset: int, value: bytes, magic: int) -> bytes:
    """A magic 0/1 message-set entry (offset, size, crc, magic, attributes, [ts], key, value)."""
    body = bytes([magic, 0]) + (struct.pack(">q", BASE_TS) if magic == 1 else b"")
    body += struct.pack(">i", -1) + struct.pack(">i", len(value)) + value
    msg = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", offset, len(msg)) + msg


def control_batch(kind: int, *, base_offset: int = 50) -> bytes:
    key = struct.pack(">hh", 0, kind)
    value = struct.pack(">hi", 0, 7)  # version, coordinator epoch
    return encode_batch(
        [Record(0, 0, key, value)],
        base_offset=base_offset,
        base_timestamp=BASE_TS,
        producer_id=4001,
        producer_epoch=3,
        transactional=True,
        control=True,
    )


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_round_trip_every_codec(codec: int) -> None:
    recs = sample_records()
    data = encode_batch(recs, base_offset=1000, base_timestamp=BASE_TS, compression=codec)
    rs = RecordSet.parse(data)
    (batch,) = rs.batches
    assert batch.compression == codec
    assert batch.records() == recs
    assert batch.records_count == len(recs)
    assert batch.last_offset_delta == len(recs) - 1
    assert batch.max_timestamp == BASE_TS + 999_999
    assert batch.next_offset == 1000 + len(recs)
    assert ours(data) == rows(recs, 1000)
    assert rs.to_bytes() is data


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_kafka_python_reads_ours(codec: int) -> None:
    recs = sample_records()
    data = encode_batch(recs, base_offset=7, base_timestamp=BASE_TS, compression=codec)
    kb = DefaultRecordBatch(data)
    assert kb.compression_type == codec
    assert kp_read(data) == rows(recs, 7)


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_we_read_kafka_python(codec: int) -> None:
    recs = sample_records()
    data = kp_build(recs, codec)
    (batch,) = RecordSet.parse(data).batches
    assert batch.compression == codec  # the sample compresses well, so kafka-python keeps the codec
    assert ours(data) == kp_read(data) == rows(recs)


def test_exact_millisecond_timestamps() -> None:
    recs = [Record(0, 0, None, b"a"), Record(1, 1, None, b"b"), Record(2, -5, None, b"c"), Record(3, 86_400_001)]
    data = encode_batch(recs, base_timestamp=BASE_TS)
    (batch,) = RecordSet.parse(data).batches
    got = [batch.timestamp_of(r) for r in batch.records()]
    assert got == [BASE_TS, BASE_TS + 1, BASE_TS - 5, BASE_TS + 86_400_001]
    assert all(type(t) is int for t in got)
    assert batch.base_timestamp == BASE_TS and batch.max_timestamp == BASE_TS + 86_400_001
    assert [t for (_, t, *_) in kp_read(data)] == got


def test_log_append_time_uses_max_timestamp() -> None:
    data = encode_batch([Record(0, 3), Record(1, 9)], base_timestamp=BASE_TS, timestamp_type=LOG_APPEND_TIME)
    (batch,) = RecordSet.parse(data).batches
    assert batch.timestamp_type == LOG_APPEND_TIME
    assert [batch.timestamp_of(r) for r in batch.records()] == [BASE_TS + 9, BASE_TS + 9]
    assert [t for (_, t, *_) in kp_read(data)] == [BASE_TS + 9, BASE_TS + 9]


def test_headers_nulls_duplicates_and_non_utf8_keys() -> None:
    headers: list[tuple[str, bytes | None]] = [("a", b"1"), ("a", None), ("", b""), ("é✓", b"\x00\xff"), ("a", b"2")]
    rec = Record(0, 0, None, None, headers)
    data = encode_batch([rec, Record(1, 0, b"", b"")], base_timestamp=BASE_TS)
    r0, r1 = RecordSet.parse(data).batches[0].records()
    assert r0.key is None and r0.value is None
    assert r0.headers == headers
    assert r1.key == b"" and r1.value == b"" and r1.headers == []
    assert kp_read(data)[0][4] == headers
    # A header key that is not UTF-8 survives a decode + re-encode byte for byte.
    raw = bytearray(data)
    pos = raw.index(b"\xc3\xa9\xe2\x9c\x93")
    raw[pos] = 0xFF
    raw[17:21] = struct.pack(">I", crc32c(bytes(raw[21:])))
    (batch,) = RecordSet.parse(bytes(raw)).batches
    assert batch.records()[0].headers[3][0].encode("utf-8", "surrogateescape")[:1] == b"\xff"
    batch.mark_changed()
    assert batch.to_bytes() == bytes(raw)


def test_headers_stay_encoded_until_read_and_edits_are_encoded() -> None:
    data = encode_batch(sample_records(3), base_timestamp=BASE_TS)
    (batch,) = RecordSet.parse(data).batches
    recs = batch.records()
    batch.mark_changed()
    assert batch.to_bytes() == data  # untouched headers are copied as wire bytes
    recs[1].headers.append(("added", b"yes"))
    recs[2].headers = []
    batch.mark_changed()
    again = RecordSet.parse(batch.to_bytes()).batches[0].records()
    assert again[1].headers[-1] == ("added", b"yes")
    assert again[2].headers == []
    assert again[0].headers == recs[0].headers


def test_memoryview_input_and_null_and_empty() -> None:
    data = encode_batch(sample_records(2), base_timestamp=BASE_TS)
    rs = RecordSet.parse(memoryview(data))
    assert rs.to_bytes() == data and len(rs.batches) == 1
    null = RecordSet.parse(None)
    assert null.is_null and null.to_bytes() is None and null.batches == [] and list(null) == []
    empty = RecordSet.parse(b"")
    assert empty.to_bytes() == b"" and empty.batches == [] and not empty.changed()


def test_encode_batch_rejects_unknown_codec() -> None:
    with pytest.raises(ValueError, match="unsupported"):
        encode_batch([Record()], base_timestamp=0, compression=5)


# ---------------------------------------------------------------- pass-through


def test_idempotent_and_transactional_batches_preserved() -> None:
    recs = sample_records(5)
    data = encode_batch(
        recs,
        base_timestamp=BASE_TS,
        compression=ZSTD,
        producer_id=123456789,
        producer_epoch=7,
        base_sequence=42,
        transactional=True,
        partition_leader_epoch=9,
    )
    rs = RecordSet.parse(data)
    (batch,) = rs.batches
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (123456789, 7, 42)
    assert batch.is_transactional and not batch.is_control and batch.partition_leader_epoch == 9
    assert batch.records() == recs
    assert rs.to_bytes() is data and batch.to_bytes() is data
    kb = DefaultRecordBatch(data)
    assert (kb.producer_id, kb.producer_epoch, kb.base_sequence, kb.is_transactional) == (123456789, 7, 42, True)
    # kafka-python's idempotent batches read the same and pass through unchanged.
    kp = kp_build(recs, GZIP, producer=(99, 1, 1000))
    kbatch = RecordSet.parse(kp).batches[0]
    assert (kbatch.producer_id, kbatch.producer_epoch, kbatch.base_sequence) == (99, 1, 1000)
    assert RecordSet.parse(kp).to_bytes() == kp
    # Re-encoding keeps the producer fields and the transactional bit.
    batch.mark_changed()
    again = RecordSet.parse(batch.to_bytes()).batches[0]
    assert (again.producer_id, again.producer_epoch, again.base_sequence) == (123456789, 7, 42)
    assert again.is_transactional and again.partition_leader_epoch == 9 and again.records() == recs


@pytest.mark.parametrize("kind", [CONTROL_COMMIT, CONTROL_ABORT])
def test_control_batches_exposed_and_passed_through(kind: int) -> None:
    data_batch = encode_batch(
        sample_records(3),
        base_offset=47,
        base_timestamp=BASE_TS,
        producer_id=4001,
        producer_epoch=3,
        base_sequence=0,
        transactional=True,
    )
    marker = control_batch(kind)
    blob = data_batch + marker
    rs = RecordSet.parse(blob)
    data, ctrl = rs.batches
    assert ctrl.is_control and ctrl.is_transactional and not data.is_control
    assert ctrl.control_type == kind and data.control_type is None
    assert [b for b, _ in rs] == [data] * 4  # iteration skips transaction markers
    assert rs.to_bytes() is blob
    data.records()[0].value = b"changed"
    data.mark_changed()
    out = rs.to_bytes()
    assert out is not None and out.endswith(marker)  # the marker is emitted as it came
    assert DefaultRecordBatch(marker).is_control_batch


def test_truncated_tail_preserved() -> None:
    b1 = encode_batch(sample_records(3), base_offset=0, base_timestamp=BASE_TS)
    b2 = encode_batch(sample_records(4), base_offset=4, base_timestamp=BASE_TS, compression=LZ4)
    b3 = encode_batch(sample_records(5), base_offset=9, base_timestamp=BASE_TS)
    for cut in (1, 11, 12, 16, 17, 30, 61, 62, len(b3) - 1):
        blob = b1 + b2 + b3[:cut]
        rs = RecordSet.parse(blob)
        assert len(rs.batches) == 2
        assert rs.tail == b3[:cut]
        assert rs.to_bytes() is blob
        rs.batches[0].records()[0].key = b"new"
        rs.batches[0].mark_changed()
        out = rs.to_bytes()
        assert out is not None and out.endswith(b2 + b3[:cut])
        again = RecordSet.parse(out)
        assert again.tail == b3[:cut] and again.batches[0].records()[0].key == b"new"
    assert RecordSet.parse(b1 + b2).tail == b""


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_message_sets_kept_opaque(magic: int) -> None:
    legacy = legacy_message(0, b"old-1", magic) + legacy_message(1, b"old-2", magic)
    v2 = encode_batch(sample_records(3), base_offset=2, base_timestamp=BASE_TS)
    tail_legacy = legacy_message(6, b"old-3", magic)
    blob = legacy + v2 + tail_legacy
    rs = RecordSet.parse(blob)
    assert rs.has_legacy and len(rs.batches) == 1 and rs.tail == b""
    assert rs.to_bytes() is blob
    rs.batches[0].replace_records(rs.batches[0].records()[:1])
    out = rs.to_bytes()
    assert out is not None
    assert out.startswith(legacy) and out.endswith(tail_legacy)
    assert RecordSet.parse(out).batches[0].records_count == 1
    only_legacy = RecordSet.parse(legacy)
    assert only_legacy.has_legacy and only_legacy.batches == [] and only_legacy.to_bytes() is legacy


def test_parse_is_lazy_and_crc_checked_on_records() -> None:
    data = bytearray(encode_batch(sample_records(5), base_timestamp=BASE_TS))
    data[100] ^= 0xFF  # corrupt a record byte: the stored CRC no longer matches
    blob = bytes(data)
    rs = RecordSet.parse(blob)  # headers only: no error yet
    (batch,) = rs.batches
    assert batch.records_count == 6
    assert rs.to_bytes() is blob  # forwarded untouched without ever decoding
    with pytest.raises(CorruptRecordError, match="CRC"):
        batch.records()
    with pytest.raises(CorruptRecordError):
        list(rs)


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD], ids=CODEC_IDS[1:])
def test_crc_mismatch_compressed(codec: int) -> None:
    data = bytearray(encode_batch(sample_records(5), base_timestamp=BASE_TS, compression=codec))
    data[-3] ^= 0x55
    with pytest.raises(CorruptRecordError):
        RecordSet.parse(bytes(data)).batches[0].records()


def test_bad_records_area_with_valid_crc_raises() -> None:
    rec_area = b"\x7f\x00"  # a record claiming 63 bytes, then nothing
    tail = struct.pack(">hiqqqhii", 0, 0, BASE_TS, BASE_TS, -1, -1, -1, 1)
    crc = crc32c(rec_area, crc32c(tail))
    blob = struct.pack(">qiibI", 0, 49 + len(rec_area), -1, 2, crc) + tail + rec_area
    with pytest.raises(CorruptRecordError):
        RecordSet.parse(blob).batches[0].records()
    garbage = encode_batch([Record()], base_timestamp=0, compression=GZIP)
    broken = bytearray(garbage)
    broken[61:70] = b"notgzip!!"
    broken[17:21] = struct.pack(">I", crc32c(bytes(broken[21:])))
    with pytest.raises(CorruptRecordError, match="cannot decode"):
        RecordSet.parse(bytes(broken)).batches[0].records()


# ---------------------------------------------------------------- edits


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_filter_keeps_offsets_and_last_offset_delta(codec: int) -> None:
    recs = sample_records(9)  # offset deltas 0..9
    data = encode_batch(
        recs,
        base_offset=500,
        base_timestamp=BASE_TS,
        compression=codec,
        producer_id=5,
        producer_epoch=0,
        base_sequence=10,
    )
    rs = RecordSet.parse(data)
    (batch,) = rs.batches
    kept = [r for r in batch.records() if r.offset_delta in (1, 4, 6)]
    batch.replace_records(kept)
    assert rs.changed()
    out = rs.to_bytes()
    assert out is not None and out != data
    again = RecordSet.parse(out).batches[0]
    assert again.compression == codec
    assert again.base_offset == 500 and again.last_offset_delta == 9 and again.records_count == 3
    assert again.next_offset == 510
    assert [again.offset_of(r) for r in again.records()] == [501, 504, 506]
    assert again.max_timestamp == BASE_TS + max(r.timestamp_delta for r in kept)
    assert (again.producer_id, again.producer_epoch, again.base_sequence) == (5, 0, 10)
    again.check_crc()
    assert kp_read(out) == rows(kept, 500)
    assert DefaultRecordBatch(out).last_offset_delta == 9


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_emptied_batch_is_still_valid(codec: int) -> None:
    data = encode_batch(sample_records(4), base_offset=70, base_timestamp=BASE_TS, compression=codec)
    rs = RecordSet.parse(data)
    orig_max_ts = rs.batches[0].max_timestamp
    rs.batches[0].replace_records([])
    out = rs.to_bytes()
    assert out is not None
    again = RecordSet.parse(out).batches[0]
    assert again.records_count == 0 and again.records() == []
    assert again.last_offset_delta == 4 and again.next_offset == 75
    assert again.max_timestamp == orig_max_ts
    kb = DefaultRecordBatch(out)
    assert kb.validate_crc() and kb.last_offset == 74 and list(kb) == []


def test_in_place_edit_needs_mark_changed() -> None:
    data = encode_batch(sample_records(3), base_timestamp=BASE_TS, compression=SNAPPY)
    rs = RecordSet.parse(data)
    (batch,) = rs.batches
    batch.records()[1].value = b"rewritten"
    assert not rs.changed() and rs.to_bytes() is data  # not declared yet
    batch.mark_changed()
    assert rs.changed()
    assert [r.value for r in RecordSet.parse(rs.to_bytes()).batches[0].records()][1] == b"rewritten"


def test_header_only_edit_reframes_without_reencoding() -> None:
    data = encode_batch(sample_records(5), base_offset=0, base_timestamp=BASE_TS, compression=ZSTD)
    (batch,) = RecordSet.parse(data).batches
    batch.base_offset = 12345
    batch.partition_leader_epoch = 3
    out = batch.to_bytes()
    assert out[61:] == data[61:]  # same compressed records area
    again = RecordBatch.from_bytes(out)
    assert again.base_offset == 12345 and again.partition_leader_epoch == 3
    assert again.records() == sample_records(5)
    assert kp_read(out)[0][0] == 12345


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_change_compression(codec: int) -> None:
    recs = sample_records(6)
    data = encode_batch(recs, base_timestamp=BASE_TS, compression=GZIP)
    (batch,) = RecordSet.parse(data).batches
    batch.compression = codec
    out = batch.to_bytes()
    again = RecordBatch.from_bytes(out)
    assert again.compression == codec and again.records() == recs
    assert kp_read(out) == rows(recs)


def test_renumber_for_produce() -> None:
    data = encode_batch(sample_records(5), base_timestamp=BASE_TS, producer_id=1, producer_epoch=0, base_sequence=0)
    (batch,) = RecordSet.parse(data).batches
    batch.replace_records([r for r in batch.records() if r.offset_delta % 2])
    batch.renumber()
    again = RecordBatch.from_bytes(batch.to_bytes())
    assert [r.offset_delta for r in again.records()] == [0, 1, 2]
    assert again.last_offset_delta == 2 and again.records_count == 3


def test_remove_batch() -> None:
    b1 = encode_batch(sample_records(2), base_offset=0, base_timestamp=BASE_TS)
    b2 = encode_batch(sample_records(2), base_offset=3, base_timestamp=BASE_TS)
    rs = RecordSet.parse(b1 + b2)
    rs.remove(rs.batches[0])
    assert rs.changed() and rs.to_bytes() == b2 and len(rs.batches) == 1


def test_replace_batch_with_rewritten_records() -> None:
    b1 = encode_batch(sample_records(2), base_offset=0, base_timestamp=BASE_TS)
    b2 = encode_batch(sample_records(2), base_offset=3, base_timestamp=BASE_TS)
    rs = RecordSet.parse(b1 + b2)
    first = rs.batches[0]
    area, start = records_area(first)
    out = bytearray()
    for span in record_spans(area, start, first.records_count, len(area)):
        write_record(out, area, span, b"new")
    new = rs.replace(first, first.with_records(out, first.records_count))
    assert rs.batches[0] is new and rs.changed()
    again = RecordSet.parse(rs.to_bytes())
    second = [r.value for _, r in RecordSet.parse(b2)]
    assert [r.value for _, r in again] == [b"new"] * first.records_count + second
    with pytest.raises(CorruptRecordError):
        rs.replace(new, b2[:30])


def test_compression_setter_rejects_unknown_codec() -> None:
    (batch,) = RecordSet.parse(encode_batch([Record()], base_timestamp=0)).batches
    with pytest.raises(ValueError, match="unsupported"):
        batch.compression = 6


def test_from_bytes_rejects_non_batches() -> None:
    data = encode_batch([Record()], base_timestamp=0)
    with pytest.raises(CorruptRecordError):
        RecordBatch.from_bytes(data + b"x")
    with pytest.raises(CorruptRecordError):
        RecordBatch.from_bytes(data[:40])
    with pytest.raises(CorruptRecordError, match="magic"):
        RecordBatch.from_bytes(legacy_message(0, b"v", 1) + bytes(61))


# ---------------------------------------------------------------- second implementations


def test_kio_reads_ours_uncompressed() -> None:
    recs = sample_records(10)
    data = encode_batch(recs, base_offset=77, base_timestamp=BASE_TS, producer_id=8, producer_epoch=1, base_sequence=3)
    kbatch, size = kio_read_batch(data, 0)
    assert size == len(data)
    assert (kbatch.base_offset, kbatch.producer_id, kbatch.base_sequence) == (77, 8, 3)
    for kr, r in zip(kbatch.records, recs, strict=True):
        assert kr.offset == 77 + r.offset_delta and kr.key == r.key and kr.value == r.value
        assert [(h.key, h.value) for h in kr.headers] == [(k.encode(), v) for k, v in r.headers]
        assert int(kr.timestamp.timestamp()) == (BASE_TS + r.timestamp_delta) // 1000  # kio keeps seconds


headers_st = st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=20)), max_size=4)
record_st = st.builds(
    Record,
    offset_delta=st.integers(0, 2**31 - 1),
    timestamp_delta=st.integers(-(2**40), 2**40),
    key=st.none() | st.binary(max_size=300),
    value=st.none() | st.binary(max_size=20_000),
    headers=headers_st,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(record_st, max_size=12),
    codec=st.sampled_from(CODECS),
    base_offset=st.integers(0, 2**62),
    base_ts=st.integers(0, 2**50),
)
def test_property_round_trip(records: list[Record], codec: int, base_offset: int, base_ts: int) -> None:
    data = encode_batch(records, base_offset=base_offset, base_timestamp=base_ts, compression=codec)
    rs = RecordSet.parse(data)
    (batch,) = rs.batches
    assert batch.records() == records
    assert batch.records_count == len(records)
    assert rs.to_bytes() is data
    batch.mark_changed()
    assert batch.to_bytes() == data  # re-encoding is deterministic
    if records:
        assert kp_read(data) == rows(records, base_offset, base_ts)


# ---------------------------------------------------------------- captured traffic


def captures_dir() -> Path | None:
    """Captured frames: the repo's conformance copy first, else the shared folder next to the repo."""
    repo = Path(__file__).resolve().parents[2]
    for d in (repo / "conformance" / "captures" / "kafka", repo.parent / "shared" / "captures" / "kafka"):
        if d.is_dir() and any(d.glob("*.jsonl")):
            return d
    return None


@cache
def captured_blobs() -> list[tuple[str, bytes]]:
    """(label, records blob) for every partition of every Produce request and Fetch response."""
    from kio.index import load_request_schema, load_response_schema
    from kio.serial import entity_reader

    d = captures_dir()
    assert d is not None
    out: list[tuple[str, bytes]] = []
    for path in sorted(d.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            obj = json.loads(line)
            key, direction = obj["api_key"], obj["dir"]
            if (key, direction) not in ((0, "c2s"), (1, "s2c")):
                continue
            frame = base64.b64decode(obj["frame"])
            load = load_request_schema if direction == "c2s" else load_response_schema
            cls: Any = load(key, obj["api_version"])
            _, n = entity_reader(cls.__header_schema__)(frame, 0)
            body, _ = entity_reader(cls)(frame, n)
            label = f"{path.stem}:{obj['conn']}/{obj['seq']}"
            parts: Iterator[Any] = (
                (p for t in body.topic_data for p in t.partition_data)
                if key == 0
                else (p for t in body.responses for p in t.partitions)
            )
            out.extend((label, bytes(p.records)) for p in parts if p.records)
    return out


needs_captures = pytest.mark.skipif(captures_dir() is None, reason="no captured Kafka frames found")


@needs_captures
def test_captures_cover_every_codec() -> None:
    codecs = {b.compression for _, blob in captured_blobs() for b in RecordSet.parse(blob).batches}
    assert codecs == set(CODECS)


@needs_captures
def test_captured_batches_parse_decode_and_reencode() -> None:
    blobs = captured_blobs()
    assert blobs
    for label, blob in blobs:
        rs = RecordSet.parse(blob)
        assert rs.batches, label
        assert rs.to_bytes() is blob, label
        assert not rs.has_legacy
        for batch in rs.batches:
            raw = batch.to_bytes()
            records = batch.records()  # checks the CRC
            assert len(records) == batch.records_count, label
            expected = kp_read(raw)
            assert [(batch.offset_of(r), batch.timestamp_of(r), r.key, r.value, r.headers) for r in records] == (
                expected
            ), label
            batch.mark_changed()
            fresh = batch.to_bytes()
            again = RecordBatch.from_bytes(fresh)
            assert again.compression == batch.compression, label
            assert (again.producer_id, again.producer_epoch, again.base_sequence) == (
                batch.producer_id,
                batch.producer_epoch,
                batch.base_sequence,
            ), label
            assert again.last_offset_delta == batch.last_offset_delta, label
            assert kp_read(fresh) == expected, label
        out = rs.to_bytes()
        assert out is not None
        assert ours(out) == ours(blob), label


@needs_captures
def test_captured_fetch_blobs_truncated_anywhere() -> None:
    multi = [blob for _, blob in captured_blobs() if len(RecordSet.parse(blob).batches) > 1]
    assert multi
    for blob in multi:
        sizes = [b.size for b in RecordSet.parse(blob).batches]
        ends = [sum(sizes[: i + 1]) for i in range(len(sizes))]
        for cut in sorted({1, 16, 17, 60, 61, 62, *ends, *(e - 1 for e in ends), *(e + 70 for e in ends)}):
            if cut >= len(blob):
                continue
            part = blob[:cut]
            rs = RecordSet.parse(part)
            complete = sum(1 for e in ends if e <= cut)
            assert len(rs.batches) == complete
            assert rs.tail == part[(ends[complete - 1] if complete else 0) :]
            assert rs.to_bytes() is part
            for b in rs.batches:
                b.mark_changed()
            out = rs.to_bytes()
            assert out is not None and out.endswith(rs.tail) and ours(out) == ours(part)
