"""The record walk: what plugins read from, and write to, a batch's records without ``Record`` objects.

A plugin that checks, filters or projects every record needs a few parts of each, not ``Record``
objects::

    data, start = records_area(batch)
    values = record_values(data, start, batch.records_count, len(data), orjson.loads, orjson.JSONDecodeError, bytes)

Walking records in Python costs about as much as decoding their values, so the walk is compiled
(``_values.c``, built with the package when a C compiler is there). Each function has its pure-Python
reference here (``python_*``): used when the extension is not built, and held by the tests to the same
answers on well-formed, damaged and random bytes.

- :func:`record_values`: the values of a batch's records, decoded, in one call;
- :func:`record_spans`: where each record's parts are (:data:`RecordSpan`), to read its key,
  value or headers as slices, copy it as it is (``out += b[start:end]``), or rewrite its value with
  :func:`write_record`;
- :func:`record_headers`: the headers of one record's header section;
- :func:`skip_records`: the position after some records, by their length prefixes only (to cut a
  batch at a record boundary);
- :func:`encode_varint`: Kafka's zigzag varint, for matching or writing record bytes.

The walk reads what the gateway's codec reads and checks that every record adds up: its length is
positive and within the batch; its deltas, key, value and header count end within it; a record without
headers ends right after its header count (the headers are not parsed: :func:`record_headers` does
that for the records whose headers are read). Anything else raises ``ValueError``, and the caller
hands the batch to the codec.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from .batch import HEADER_SIZE, RecordBatch
from .compression import NONE, decompress

__all__ = [
    "ACCELERATED",
    "RecordSpan",
    "encode_varint",
    "python_encode_varint",
    "python_record_headers",
    "python_record_spans",
    "python_record_values",
    "python_skip_records",
    "python_write_record",
    "record_headers",
    "record_spans",
    "record_values",
    "record_walker",
    "records_area",
    "skip_records",
    "write_record",
]

#: ``record_values(b, p, count, end, loads, error, fallback)``: the value of each of ``count`` records
#: from ``b[p]`` to ``b[end]``: ``loads(value)``, ``fallback(value)`` when ``loads`` raised ``error``,
#: None for a null value.
RecordValues = Callable[
    [bytes, int, int, int, Callable[[bytes], Any], type[BaseException], Callable[[bytes], Any]], list[Any]
]

#: Where one record's parts are, positions in the walked buffer ``b``::
#:
#:     (start, body, end, attributes, timestamp_delta, offset_delta, key, key_end, value, value_end, header_count)
#:
#: The record is ``b[start:end]``; ``body`` is where it starts after its length prefix. The key is
#: ``b[key:key_end]``, null when ``key`` is -1 (``key_end`` is then where the value's length starts); the
#: value is ``b[value:value_end]``, null when ``value`` is -1; the header section (count, then headers)
#: is ``b[value_end:end]``, holding ``header_count`` headers.
RecordSpan = tuple[int, int, int, int, int, int, int, int, int, int, int]

_INT64: Final = 1 << 63


def records_area(batch: RecordBatch) -> tuple[bytes, int]:
    """``(bytes, start)`` of a batch's records, decompressed; the records end with the bytes."""
    data = batch.to_bytes()
    codec = batch.compression
    if codec == NONE:
        return data, HEADER_SIZE
    return decompress(codec, memoryview(data)[HEADER_SIZE:]), 0


# --------------------------------------------------------------------------- the reference walk


def _zigzag(b: bytes, p: int, limit: int) -> tuple[int, int]:
    """The zigzag varint at ``b[p]``, ending below ``limit``; (value, next position)."""
    raw = shift = 0
    while True:
        if p >= limit or shift > 63:
            raise ValueError("a varint does not end where it must")
        x = b[p]
        if shift == 63 and x > 1:
            raise ValueError("a varint longer than 64 bits")
        p += 1
        raw |= (x & 0x7F) << shift
        if x < 0x80:
            return (raw >> 1) ^ -(raw & 1), p
        shift += 7


def _area(b: bytes, p: int, count: int, end: int) -> None:
    if p < 0 or count < 0 or end > len(b) or p > end:
        raise ValueError("the records area is out of the buffer")


def python_record_spans(b: bytes, p: int, count: int, end: int) -> list[RecordSpan]:
    """Where the parts of each of ``count`` records from ``b[p]`` to ``b[end]`` are (:data:`RecordSpan`).

    Each varint is read by :func:`_zigzag`, or inline when it is one or two bytes within its bound
    (``x``: its first byte, 0x80 past the bound): most are, and a call per varint would double the
    walk's cost on an install without the compiled walk."""
    _area(b, p, count, end)
    out: list[RecordSpan] = []
    append = out.append
    zz = _zigzag
    for _ in range(count):
        start = p
        x = b[p] if p < end else 0x80
        if x < 0x80:
            n = (x >> 1) ^ -(x & 1)
            p += 1
        elif p + 1 < end and b[p + 1] < 0x80:
            n = (x & 0x7F) | b[p + 1] << 7
            n = (n >> 1) ^ -(n & 1)
            p += 2
        else:
            n, p = zz(b, p, end)
        if n <= 0 or n > end - p:
            raise ValueError("a record length does not fit the batch")
        body = p
        rend = p + n
        attributes = b[p]
        p += 1
        x = b[p] if p < rend else 0x80
        if x < 0x80:
            timestamp_delta = (x >> 1) ^ -(x & 1)
            p += 1
        elif p + 1 < rend and b[p + 1] < 0x80:
            timestamp_delta = (x & 0x7F) | b[p + 1] << 7
            timestamp_delta = (timestamp_delta >> 1) ^ -(timestamp_delta & 1)
            p += 2
        else:
            timestamp_delta, p = zz(b, p, rend)
        x = b[p] if p < rend else 0x80
        if x < 0x80:
            offset_delta = (x >> 1) ^ -(x & 1)
            p += 1
        elif p + 1 < rend and b[p + 1] < 0x80:
            offset_delta = (x & 0x7F) | b[p + 1] << 7
            offset_delta = (offset_delta >> 1) ^ -(offset_delta & 1)
            p += 2
        else:
            offset_delta, p = zz(b, p, rend)
        x = b[p] if p < rend else 0x80
        if x < 0x80:
            n = (x >> 1) ^ -(x & 1)
            p += 1
        elif p + 1 < rend and b[p + 1] < 0x80:
            n = (x & 0x7F) | b[p + 1] << 7
            n = (n >> 1) ^ -(n & 1)
            p += 2
        else:
            n, p = zz(b, p, rend)
        if n > rend - p:
            raise ValueError("a record's deltas or key do not fit its length")
        if n < 0:
            key = -1
        else:
            key = p
            p += n
        key_end = p
        x = b[p] if p < rend else 0x80
        if x < 0x80:
            n = (x >> 1) ^ -(x & 1)
            p += 1
        elif p + 1 < rend and b[p + 1] < 0x80:
            n = (x & 0x7F) | b[p + 1] << 7
            n = (n >> 1) ^ -(n & 1)
            p += 2
        else:
            n, p = zz(b, p, rend)
        if n > rend - p:
            raise ValueError("a record's value does not fit its length")
        if n < 0:
            value = -1
        else:
            value = p
            p += n
        value_end = p
        x = b[p] if p < rend else 0x80
        if x < 0x80:
            header_count = (x >> 1) ^ -(x & 1)
            p += 1
        elif p + 1 < rend and b[p + 1] < 0x80:
            header_count = (x & 0x7F) | b[p + 1] << 7
            header_count = (header_count >> 1) ^ -(header_count & 1)
            p += 2
        else:
            header_count, p = zz(b, p, rend)
        if header_count < 0 or (header_count == 0 and p != rend):
            raise ValueError("a record's headers do not fill its length")
        append((start, body, rend, attributes, timestamp_delta, offset_delta, key, key_end, value, value_end,
                header_count))  # fmt: skip
        p = rend
    if p != end:
        raise ValueError("the records do not fill the batch")
    return out


def python_record_values(
    b: bytes,
    p: int,
    count: int,
    end: int,
    loads: Callable[[bytes], Any],
    error: type[BaseException],
    fallback: Callable[[bytes], Any],
) -> list[Any]:
    """The value of each record, decoded (see :data:`RecordValues`): the walk of
    :func:`python_record_spans`, then the values."""
    out: list[Any] = []
    for span in python_record_spans(b, p, count, end):
        at = span[8]
        if at < 0:
            out.append(None)
            continue
        raw = bytes(b[at : span[9]])
        try:
            out.append(loads(raw))
        except error:
            out.append(fallback(raw))
    return out


def python_skip_records(b: bytes, p: int, count: int, end: int) -> int:
    """The position after ``count`` records from ``b[p]``, by their length prefixes only: each must be
    positive and end by ``end`` (their fields are not read; a walk of them checks those)."""
    _area(b, p, count, end)
    for _ in range(count):
        n, p = _zigzag(b, p, end)
        if n <= 0 or n > end - p:
            raise ValueError("a record length does not fit the batch")
        p += n
    return p


def python_record_headers(b: bytes, p: int, end: int) -> list[tuple[bytes, bytes | None]]:
    """The ``(key, value)`` headers of the header section ``b[p:end]`` (a span's ``value_end`` to
    ``end``), in order, duplicates kept, None for a null value. Keys are bytes, as written (the codec
    decodes them as UTF-8 with ``surrogateescape``). A negative count, a null key, or headers that
    do not fill the section exactly raise ``ValueError``."""
    _area(b, p, 0, end)
    count, p = _zigzag(b, p, end)
    if count < 0 or count > end - p:
        raise ValueError("a record's header count does not fit its headers")
    out: list[tuple[bytes, bytes | None]] = []
    for _ in range(count):
        n, p = _zigzag(b, p, end)
        if n < 0 or n > end - p:
            raise ValueError("a header key is null or does not fit the headers")
        key = bytes(b[p : p + n])
        n, p = _zigzag(b, p + n, end)
        if n > end - p:
            raise ValueError("a header value does not fit the headers")
        if n < 0:
            out.append((key, None))
        else:
            out.append((key, bytes(b[p : p + n])))
            p += n
    if p != end:
        raise ValueError("a record's headers do not fill its header section")
    return out


def python_encode_varint(n: int) -> bytes:
    """The zigzag varint of ``n``, a signed 64-bit integer (else ``OverflowError``), as records write
    lengths, deltas and counts."""
    if not -_INT64 <= n < _INT64:
        raise OverflowError("not a signed 64-bit integer")
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def python_write_record(out: bytearray, b: bytes, span: RecordSpan, value: bytes | None) -> None:
    """Append to ``out`` the record of ``span`` (from the walked ``b``) with ``value`` (None: null) as
    its value: its attributes, deltas, key and headers copied, its length and value length written
    anew. Nothing is written when the span is not within ``b`` (``ValueError``)."""
    if type(span) is not tuple or len(span) != 11:
        raise TypeError("write_record() takes a span of record_spans()")
    if not isinstance(out, bytearray):
        raise TypeError("write_record() writes to a bytearray")
    body, end, key_end, value_end = span[1], span[2], span[7], span[9]
    raw = None if value is None else memoryview(value).tobytes()
    if not 0 <= body <= key_end <= value_end <= end <= len(b):
        raise ValueError("the span is not within the buffer")
    new = python_encode_varint(-1) if raw is None else python_encode_varint(len(raw)) + raw
    size = key_end - body + len(new) + end - value_end
    out += b"".join((python_encode_varint(size), b[body:key_end], new, b[value_end:end]))


# --------------------------------------------------------------------------- compiled, when built


def _compiled() -> Any:
    try:
        from . import _values
    except ImportError:  # built without a C compiler: the reference walk
        return None
    return _values


_COMPILED: Final = _compiled()
#: Whether the walk is the compiled one.
ACCELERATED: Final = _COMPILED is not None


def record_walker() -> str:
    """``compiled`` when the C record walk is built (the install had a C compiler), else ``python``."""
    return "compiled" if ACCELERATED else "python"


#: :func:`python_record_values`, compiled when the extension is built.
record_values: Final[RecordValues] = python_record_values if _COMPILED is None else _COMPILED.record_values
#: :func:`python_record_spans`, compiled when the extension is built.
record_spans: Final[Callable[[bytes, int, int, int], list[RecordSpan]]] = (
    python_record_spans if _COMPILED is None else _COMPILED.record_spans
)
#: :func:`python_skip_records`, compiled when the extension is built.
skip_records: Final[Callable[[bytes, int, int, int], int]] = (
    python_skip_records if _COMPILED is None else _COMPILED.skip_records
)
#: :func:`python_record_headers`, compiled when the extension is built.
record_headers: Final[Callable[[bytes, int, int], list[tuple[bytes, bytes | None]]]] = (
    python_record_headers if _COMPILED is None else _COMPILED.record_headers
)
#: :func:`python_write_record`, compiled when the extension is built.
write_record: Final[Callable[[bytearray, bytes, RecordSpan, bytes | None], None]] = (
    python_write_record if _COMPILED is None else _COMPILED.write_record
)
#: :func:`python_encode_varint`, compiled when the extension is built.
encode_varint: Final[Callable[[int], bytes]] = python_encode_varint if _COMPILED is None else _COMPILED.encode_varint
