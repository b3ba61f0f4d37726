"""The values of a batch's records in one call: the compiled walk against its Python reference and the codec.

The compiled walk reads client bytes, so it is held to the reference on well-formed batches and on
every kind of damage (flipped, cut, inserted bytes, random bytes, areas out of the buffer): both give
the same list, or both raise ValueError.
"""

from __future__ import annotations

import shutil
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kanal.protocol.records import (
    GZIP,
    HEADER_SIZE,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    Record,
    RecordBatch,
    encode_batch,
    encode_varint,
    records_area,
)
from kanal.protocol.records.values import ACCELERATED, python_record_values, record_values

compiled = pytest.mark.skipif(not ACCELERATED, reason="the C extension is not built")


def _text(raw: bytes) -> Any:
    return ("text", raw.decode("utf-8", "replace"))


def _walk(fn: Any, b: bytes | memoryview, p: int, count: int, end: int) -> Any:
    """fn's answer, or ValueError as a value."""
    try:
        return fn(b, p, count, end, orjson.loads, orjson.JSONDecodeError, _text)
    except ValueError:
        return ValueError


_int64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
_values = st.one_of(
    st.none(), st.binary(max_size=40), st.dictionaries(st.text(max_size=5), _int64, max_size=3).map(orjson.dumps)
)
_records = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(max_size=8)),
        _values,
        st.lists(st.tuples(st.text(max_size=4), st.one_of(st.none(), st.binary(max_size=4))), max_size=2),
        st.integers(min_value=0, max_value=1 << 40),
    ),
    min_size=1,
    max_size=8,
)


def _batch(records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]]) -> bytes:
    return encode_batch(
        [
            Record(offset_delta=i, timestamp_delta=ts, key=k, value=v, headers=list(h))
            for i, (k, v, h, ts) in enumerate(records)
        ],
        base_timestamp=1_700_000_000_000,
    )


def test_the_values_are_those_the_codec_decodes() -> None:
    records = [
        (None, b'{"a": 1}', [], 0),
        (b"k", None, [("h", b"v")], 5),
        (b"", b"not json", [("x", None)], 300),
        (None, b"", [], 1 << 33),
        (b"key" * 100, b'"' + b"s" * 500 + b'"', [], 7),
    ]
    data = _batch(records)
    expected = [None if v is None else _decoded(v) for v in (r.value for r in RecordBatch(data).records())]
    assert expected == [{"a": 1}, None, ("text", "not json"), ("text", ""), "s" * 500]
    for fn in (python_record_values, record_values):
        assert fn(data, HEADER_SIZE, len(records), len(data), orjson.loads, orjson.JSONDecodeError, _text) == expected
        view = memoryview(data)
        assert fn(view, HEADER_SIZE, len(records), len(data), orjson.loads, orjson.JSONDecodeError, _text) == expected


@pytest.mark.parametrize("codec", [NONE, GZIP, LZ4, SNAPPY, ZSTD])
def test_records_area_of_compressed_batches(codec: int) -> None:
    records = [Record(offset_delta=i, value=b'{"n": %d}' % i) for i in range(50)]
    batch = RecordBatch(encode_batch(records, base_timestamp=1, compression=codec))
    data, start = records_area(batch)
    assert record_values(data, start, 50, len(data), orjson.loads, orjson.JSONDecodeError, _text) == [
        {"n": i} for i in range(50)
    ]


def _decoded(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _text(raw)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_records)
def test_well_formed_batches(records: list[Any]) -> None:
    data = _batch(records)
    expected = [None if v is None else _decoded(v) for _k, v, _h, _t in records]
    assert _walk(python_record_values, data, HEADER_SIZE, len(records), len(data)) == expected
    assert _walk(record_values, data, HEADER_SIZE, len(records), len(data)) == expected


@compiled
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_records, st.data())
def test_damaged_batches_get_the_reference_answer(records: list[Any], data: st.DataObject) -> None:
    raw = bytearray(_batch(records))
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        kind = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        at = data.draw(st.integers(min_value=HEADER_SIZE, max_value=len(raw) - 1))
        if kind == "flip":
            raw[at] = data.draw(st.integers(min_value=0, max_value=255))
        elif kind == "cut":
            del raw[at:]
        elif kind == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=3))
        else:
            del raw[at]
        if len(raw) <= HEADER_SIZE:
            break
    b = bytes(raw)
    count = data.draw(st.sampled_from([len(records), len(records) + 1, max(0, len(records) - 1)]))
    end = data.draw(st.sampled_from([len(b), max(HEADER_SIZE, len(b) - 1)]))
    assert _walk(record_values, b, HEADER_SIZE, count, end) == _walk(python_record_values, b, HEADER_SIZE, count, end)


@compiled
@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=64), st.integers(min_value=-2, max_value=70), st.integers(min_value=-1, max_value=6))
def test_random_bytes_get_the_reference_answer(b: bytes, p: int, count: int) -> None:
    for end in (len(b), len(b) + 1, p):
        assert _walk(record_values, b, p, count, end) == _walk(python_record_values, b, p, count, end)


@pytest.mark.parametrize("fn", [python_record_values, record_values])
def test_a_walk_that_does_not_add_up_raises(fn: Any) -> None:
    data = _batch([(None, b'{"a": 1}', [], 0), (None, b"2", [("h", b"v")], 0)])
    n = len(data)
    assert _walk(fn, data, HEADER_SIZE, 2, n) == [{"a": 1}, 2]
    assert _walk(fn, data, HEADER_SIZE, 3, n) is ValueError  # a record too many
    assert _walk(fn, data, HEADER_SIZE, 1, n) is ValueError  # records left over
    assert _walk(fn, data, HEADER_SIZE, 2, n + 1) is ValueError  # an end past the buffer
    assert _walk(fn, data, -1, 2, n) is ValueError
    assert _walk(fn, data[:-1], HEADER_SIZE, 2, n - 1) is ValueError  # the last header cut


def _record(body: bytes, length: bytes | None = None) -> bytes:
    """A hand-made record: its length (``length`` as written, else the right varint), then ``body``."""
    return (encode_varint(len(body)) if length is None else length) + body


# attributes, timestamp delta, offset delta, null key, then the value "1" (length 1)
_HEAD = b"\x00\x00\x00\x01\x021"


@pytest.mark.parametrize("fn", [python_record_values, record_values])
def test_hand_made_records(fn: Any) -> None:
    def walk(*records: bytes) -> Any:
        b = b"".join(records)
        return _walk(fn, b, 0, len(records), len(b))

    assert walk(_record(_HEAD + b"\x00")) == [1]
    assert walk(_record(_HEAD + b"\x02\x02hk\x02hv")) == [1]  # one header, not parsed
    assert walk(_record(_HEAD + b"\x00\x00")) is ValueError  # no headers, yet a byte left in the record
    assert walk(_record(_HEAD)) is ValueError  # no header count
    assert walk(_record(b"\x00\x00\x00\x20abc\x021\x00")) is ValueError  # the key runs past the record
    assert walk(_record(b"\x00\x00\x00\x01\x0812\x00")) is ValueError  # the value runs past the record
    # A length written in 10 bytes whose last one is above 1 (2^64 more), or in 11 bytes: the walk must
    # not drop the high bits and read the record as 6 bytes long.
    six = 6 << 1
    for length in (bytes([six | 0x80]) + b"\x80" * 8 + b"\x02", bytes([six | 0x80]) + b"\x80" * 9 + b"\x00"):
        assert walk(_record(b"\x00\x00\x00\x01\x00\x00", length)) is ValueError
    assert walk(_record(b"\x00\x00\x00\x01\x00\x00", bytes([six | 0x80]) + b"\x80" * 8 + b"\x00")) == [("text", "")]


@pytest.mark.parametrize("fn", [python_record_values, record_values])
def test_other_errors_of_the_decoder_propagate(fn: Any) -> None:
    data = _batch([(None, b"{}", [], 0)])

    def loads(raw: bytes) -> Any:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        fn(data, HEADER_SIZE, 1, len(data), loads, orjson.JSONDecodeError, _text)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler: the package installs without the extension")
def test_an_install_with_a_compiler_has_the_compiled_walk() -> None:
    assert ACCELERATED
    assert record_values is not python_record_values
