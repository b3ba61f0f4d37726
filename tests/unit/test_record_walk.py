"""The record walk beyond values: spans, headers, skipping, writing records, varints, re-framed batches.

Each compiled function reads client bytes, so it is held to its pure-Python reference on well-formed
batches and on every kind of damage (flipped, cut, inserted, deleted bytes; random bytes; positions
out of the buffer): both give the same answer, or both raise the same error. The reference itself is
held to the gateway's codec on well-formed batches: the spans point at the very parts the codec
decodes. And ``record_values`` and ``record_spans`` are one walk: they refuse the same bytes.
"""

from __future__ import annotations

import shutil
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kanal.api import (
    GZIP,
    LZ4,
    NONE,
    ZSTD,
    Record,
    RecordBatch,
    encode_batch,
    encode_varint,
    record_headers,
    record_spans,
    record_values,
    records_area,
    skip_records,
    write_record,
)
from kanal.protocol.records.values import (
    ACCELERATED,
    python_encode_varint,
    python_record_headers,
    python_record_spans,
    python_record_values,
    python_skip_records,
    python_write_record,
)

compiled = pytest.mark.skipif(not ACCELERATED, reason="the C extension is not built")
START = 61  # where an uncompressed batch's records start

_int64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
_headers = st.lists(
    st.tuples(st.text(max_size=4), st.one_of(st.none(), st.binary(max_size=70))),
    max_size=3,
)
_records = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(max_size=70)),  # key: one- and two-byte lengths
        st.one_of(st.none(), st.binary(max_size=200)),  # value
        _headers,
        _int64,  # timestamp delta
        st.integers(min_value=0, max_value=(1 << 31) - 1),  # offset delta
        st.integers(min_value=0, max_value=255),  # attributes
    ),
    min_size=1,
    max_size=8,
)

Records = list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int, int, int]]


def _batch(records: Records) -> bytes:
    return encode_batch(
        [Record(od, ts, k, v, list(h), attributes=a) for k, v, h, ts, od, a in records],
        base_timestamp=0,  # maxTimestamp is the largest delta: any 64-bit delta fits
    )


def _answer(fn: Any, *args: Any) -> Any:
    """fn's answer, or the type of what it raised."""
    try:
        return fn(*args)
    except (ValueError, TypeError, OverflowError) as exc:
        return type(exc)


def _damaged(raw: bytearray, data: st.DataObject, floor: int) -> bytes:
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        if len(raw) <= floor:
            break
        kind = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        at = data.draw(st.integers(min_value=floor, max_value=len(raw) - 1))
        if kind == "flip":
            raw[at] = data.draw(st.integers(min_value=0, max_value=255))
        elif kind == "cut":
            del raw[at:]
        elif kind == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=3))
        else:
            del raw[at]
    return bytes(raw)


# --------------------------------------------------------------------------- well-formed batches


@pytest.mark.parametrize("spans", [python_record_spans, record_spans])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=_records)
def test_spans_point_at_what_the_codec_decodes(spans: Any, records: Records) -> None:
    data = _batch(records)
    decoded = RecordBatch(data).records()
    found = spans(data, START, len(records), len(data))
    assert len(found) == len(records)
    at = START
    for span, r in zip(found, decoded, strict=True):
        start, body, end, attributes, tsd, od, key, key_end, value, value_end, header_count = span
        assert start == at and body == start + len(encode_varint(end - body))
        at = end
        assert (attributes, tsd, od) == (r.attributes, r.timestamp_delta, r.offset_delta)
        assert (None if key < 0 else data[key:key_end]) == r.key
        assert (None if value < 0 else data[value:value_end]) == r.value
        # the value's length sits between the key and the value, the header count after the value
        assert data[key_end : value if value >= 0 else value_end] == encode_varint(
            -1 if r.value is None else len(r.value)
        )
        assert data[value_end:].startswith(encode_varint(header_count))
        assert header_count == len(r.headers)
        assert [(k.decode("utf-8", "surrogateescape"), v) for k, v in record_headers(data, value_end, end)] == r.headers
    assert at == len(data)
    assert skip_records(data, START, len(records), len(data)) == len(data)
    assert [skip_records(data, START, k, len(data)) for k in range(1, len(records) + 1)] == [s[2] for s in found]


@pytest.mark.parametrize("codec", [GZIP, LZ4, ZSTD])
def test_spans_of_a_compressed_batch(codec: int) -> None:
    batch = RecordBatch(
        encode_batch([Record(i, 0, b"k%d" % i, b"v" * i) for i in range(40)], base_timestamp=1, compression=codec)
    )
    data, start = records_area(batch)
    assert [data[s[8] : s[9]] for s in record_spans(data, start, 40, len(data))] == [b"v" * i for i in range(40)]


# --------------------------------------------------------------------------- damaged and random bytes


@compiled
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=_records, data=st.data())
def test_damaged_batches_get_the_reference_answer(records: Records, data: st.DataObject) -> None:
    b = _damaged(bytearray(_batch(records)), data, START)
    count = data.draw(st.sampled_from([len(records), len(records) + 1, max(0, len(records) - 1)]))
    end = data.draw(st.sampled_from([len(b), max(START, len(b) - 1)]))
    spans = _answer(record_spans, b, START, count, end)
    assert spans == _answer(python_record_spans, b, START, count, end)
    assert _answer(skip_records, b, START, count, end) == _answer(python_skip_records, b, START, count, end)
    # one walk: the values are refused exactly where the spans are
    values = _answer(record_values, b, START, count, end, bytes, ValueError, bytes)
    assert (values is ValueError) == (spans is ValueError)
    if spans is not ValueError:
        assert values == [None if s[8] < 0 else b[s[8] : s[9]] for s in spans]
        for s in spans:
            assert _answer(record_headers, b, s[9], s[2]) == _answer(python_record_headers, b, s[9], s[2])


@compiled
@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=64), st.integers(min_value=-2, max_value=70), st.integers(min_value=-1, max_value=6))
def test_random_bytes_get_the_reference_answer(b: bytes, p: int, count: int) -> None:
    for end in (len(b), len(b) + 1, p, p + 3):
        assert _answer(record_spans, b, p, count, end) == _answer(python_record_spans, b, p, count, end)
        assert _answer(skip_records, b, p, count, end) == _answer(python_skip_records, b, p, count, end)
        assert _answer(record_headers, b, p, end) == _answer(python_record_headers, b, p, end)
        values = _answer(record_values, b, p, count, end, bytes, ValueError, bytes)
        assert values == _answer(python_record_values, b, p, count, end, bytes, ValueError, bytes)


@compiled
@settings(max_examples=500, deadline=None)
@given(headers=_headers, data=st.data())
def test_damaged_header_sections_get_the_reference_answer(
    headers: list[tuple[str, bytes | None]], data: st.DataObject
) -> None:
    (span,) = record_spans(batch := _batch([(None, None, headers, 0, 0, 0)]), START, 1, len(batch))
    section = _damaged(bytearray(batch[span[9] : span[2]]), data, 0)
    for end in (len(section), max(0, len(section) - 1)):
        assert _answer(record_headers, section, 0, end) == _answer(python_record_headers, section, 0, end)


@pytest.mark.parametrize("fn", [python_record_spans, record_spans])
def test_hand_made_records(fn: Any) -> None:
    def walk(*bodies: bytes) -> Any:
        b = b"".join(encode_varint(len(body)) + body for body in bodies)
        return _answer(fn, b, 0, len(bodies), len(b))

    # attributes 5, timestamp delta -1, offset delta 64 (two bytes), key "k", value "vv", no headers
    assert walk(b"\x05\x01\x80\x01\x02k\x04vv\x00") == [(0, 1, 11, 5, -1, 64, 6, 7, 8, 10, 0)]
    assert walk(b"\x00\x00\x00\x01\x01\x02\x02h\x00") == [(0, 1, 10, 0, 0, 0, -1, 5, -1, 6, 1)]  # nulls, 1 header
    assert walk(b"\x00\x00\x00\x01\x01\x00\x00") is ValueError  # no headers, yet a byte left
    assert walk(b"\x00\x00\x00\x01\x01\x01") is ValueError  # a negative header count
    assert walk(b"\x00\x00\x00\x01\x01\x80") is ValueError  # a header count cut by the record's end
    assert walk(b"\x00\x00\x00\x01\x01") is ValueError  # no header count
    assert walk(b"\x00\x00\x00\x04k\x01\x00") is ValueError  # the key runs past the record
    assert walk(b"\x00\x00\x00\x01\x06vv\x00") is ValueError  # the value runs past the record


@pytest.mark.parametrize("fn", [python_record_headers, record_headers])
def test_hand_made_header_sections(fn: Any) -> None:
    def read(section: bytes) -> Any:
        return _answer(fn, section, 0, len(section))

    assert read(b"\x00") == []
    assert read(b"\x04\x02a\x02x\x02a\x01") == [(b"a", b"x"), (b"a", None)]  # duplicates kept, null value
    assert read(b"\x02\x00\x00") == [(b"", b"")]
    assert read(b"\x02\x01\x00") is ValueError  # a null key
    assert read(b"\x01") is ValueError  # a negative count
    assert read(b"\x04\x02a\x00") is ValueError  # a header missing
    assert read(b"\x02\x02a\x00\x00") is ValueError  # a byte left after the headers
    assert read(b"\x02\x02a\x04x") is ValueError  # the value runs past the section
    assert read(b"") is ValueError
    assert _answer(fn, b"\x02\x02a\x00", 0, 5) is ValueError  # an end past the buffer


@pytest.mark.parametrize("fn", [python_skip_records, skip_records])
def test_skip_records_reads_lengths_only(fn: Any) -> None:
    b = encode_varint(3) + b"abc" + encode_varint(100) + b"x" * 100
    assert fn(b, 0, 0, len(b)) == 0
    assert fn(b, 0, 1, len(b)) == 4
    assert fn(b, 0, 2, len(b)) == len(b)
    assert _answer(fn, b, 0, 3, len(b)) is ValueError  # a record too many
    assert _answer(fn, b, 0, 2, len(b) - 1) is ValueError  # the last one past the end
    assert _answer(fn, encode_varint(0) + b"x", 0, 1, 2) is ValueError  # a length not positive
    assert _answer(fn, b, -1, 1, len(b)) is ValueError
    assert _answer(fn, b, 0, -1, len(b)) is ValueError


# --------------------------------------------------------------------------- writing


def _zigzag_reference(n: int) -> bytes:
    """Kafka's varint, written from its definition: zigzag, then base 128, low groups first."""
    z = 2 * n if n >= 0 else -2 * n - 1
    groups = [z & 0x7F]
    while z >> 7:
        z >>= 7
        groups.append(z & 0x7F)
    return bytes([g | 0x80 for g in groups[:-1]] + groups[-1:])


@pytest.mark.parametrize("fn", [python_encode_varint, encode_varint])
@settings(max_examples=300, deadline=None)
@given(n=_int64)
def test_encode_varint(fn: Any, n: int) -> None:
    assert fn(n) == _zigzag_reference(n)


@pytest.mark.parametrize("fn", [python_encode_varint, encode_varint])
def test_encode_varint_edges(fn: Any) -> None:
    assert [fn(n) for n in (0, -1, 1, 63, -64, 64, 8191, 8192)] == [
        b"\x00", b"\x01", b"\x02", b"\x7e", b"\x7f", b"\x80\x01", b"\xfe\x7f", b"\x80\x80\x01"
    ]  # fmt: skip
    assert len(fn(-(1 << 63))) == len(fn((1 << 63) - 1)) == 10
    for n in (1 << 63, -(1 << 63) - 1):
        with pytest.raises(OverflowError):
            fn(n)


_new_values = st.one_of(st.none(), st.binary(max_size=10), st.binary(min_size=60, max_size=70), st.just(b"v" * 9000))


@pytest.mark.parametrize("write", [python_write_record, write_record])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=_records, data=st.data())
def test_a_written_record_is_the_record_with_its_new_value(write: Any, records: Records, data: st.DataObject) -> None:
    batch = _batch(records)
    out = bytearray(b"prefix")
    news = []
    for span in record_spans(batch, START, len(records), len(batch)):
        new = data.draw(_new_values)
        news.append(new)
        write(out, batch, span, new)
    assert out[:6] == b"prefix"
    rewritten = RecordBatch(RecordBatch(batch).with_records(out[6:], len(records))).records()
    original = RecordBatch(batch).records()
    for r, before, new in zip(rewritten, original, news, strict=True):
        assert r.value == new
        assert (r.key, r.headers, r.offset_delta, r.timestamp_delta, r.attributes) == (
            before.key,
            before.headers,
            before.offset_delta,
            before.timestamp_delta,
            before.attributes,
        )


@compiled
@settings(max_examples=500, deadline=None)
@given(
    b=st.binary(max_size=20),
    positions=st.lists(st.integers(min_value=-2, max_value=24), min_size=4, max_size=4),
    value=st.one_of(st.none(), st.binary(max_size=5)),
)
def test_write_record_checks_the_span_as_its_reference(b: bytes, positions: list[int], value: bytes | None) -> None:
    body, end, key_end, value_end = positions
    span = (0, body, end, 0, 0, 0, -1, key_end, -1, value_end, 0)
    outs = [bytearray(b"x"), bytearray(b"x")]
    answers = [
        _answer(fn, out, b, span, value) for fn, out in zip((write_record, python_write_record), outs, strict=True)
    ]
    assert answers[0] == answers[1] and outs[0] == outs[1]
    if answers[0] is ValueError:
        assert outs[0] == b"x"  # nothing written


@pytest.mark.parametrize("write", [python_write_record, write_record])
def test_write_record_takes_a_span_and_a_bytearray(write: Any) -> None:
    b = _batch([(None, b"v", [], 0, 0, 0)])
    (span,) = record_spans(b, START, 1, len(b))
    with pytest.raises(TypeError):
        write(bytearray(), b, span[:10], b"x")
    with pytest.raises(TypeError):
        write(b"", b, span, b"x")
    with pytest.raises(TypeError):
        write(bytearray(), b, span, 5)


# --------------------------------------------------------------------------- re-framed batches


@pytest.mark.parametrize("codec", [NONE, GZIP, LZ4, ZSTD])
def test_with_records_keeps_the_header_and_frames_the_records_given(codec: int) -> None:
    records = [Record(i * 2, i * 10, None, b"value-%d" % i) for i in range(6)]
    original = RecordBatch(
        encode_batch(records, base_offset=100, base_timestamp=5_000, compression=codec, producer_id=9, base_sequence=3)
    )
    data, start = records_area(original)
    spans = record_spans(data, start, 6, len(data))
    area = b"".join(data[s[0] : s[2]] for s in spans if s[5] % 4 == 0)  # offsets 0, 4, 8
    kept = RecordBatch(original.with_records(area, 3))
    kept.check_crc()
    assert [(r.offset_delta, r.value) for r in kept.records()] == [(0, b"value-0"), (4, b"value-2"), (8, b"value-4")]
    header = ("base_offset", "last_offset_delta", "base_timestamp", "max_timestamp", "producer_id", "base_sequence")
    assert [getattr(kept, f) for f in header] == [getattr(original, f) for f in header] == [100, 10, 5_000, 5_050, 9, 3]
    assert (kept.compression, kept.records_count) == (codec, 3)
    cut = RecordBatch(original.with_records(area, 3, last_offset_delta=4))
    assert (cut.last_offset_delta, cut.next_offset) == (4, 105)


def test_with_no_records_a_batch_is_emptied_as_kafka_does() -> None:
    original = RecordBatch(encode_batch([Record(0, 0, None, b"x" * 100)] * 3, base_timestamp=1, compression=GZIP))
    empty = RecordBatch(original.with_records(b"", 0))
    empty.check_crc()
    assert (empty.records_count, empty.compression, empty.records(), empty.next_offset) == (0, NONE, [], 1)
    assert empty.size == 61


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler: the package installs without the extension")
def test_an_install_with_a_compiler_has_every_compiled_function() -> None:
    assert ACCELERATED
    for compiled_fn, reference in [
        (record_spans, python_record_spans),
        (record_headers, python_record_headers),
        (skip_records, python_skip_records),
        (write_record, python_write_record),
        (encode_varint, python_encode_varint),
    ]:
        assert compiled_fn is not reference


def test_values_of_the_walk_decode_as_given() -> None:
    b = _batch([(None, b'{"a": 1}', [], 0, 0, 0), (None, b"nope", [], 0, 1, 0)])
    assert record_values(b, START, 2, len(b), orjson.loads, orjson.JSONDecodeError, bytes) == [{"a": 1}, b"nope"]
