"""The values of a batch's records, decoded in one call: the record walk of plugins that read values only.

A plugin that checks or projects record values needs each value, not ``Record`` objects::

    data, start = records_area(batch)
    values = record_values(data, start, batch.records_count, len(data), orjson.loads, orjson.JSONDecodeError, bytes)

Walking records in Python costs about as much as decoding their values, so the walk is compiled
(``_values.c``, built with the package when a C compiler is there). :func:`python_record_values` is
its reference: used when the extension is not built, and held by the tests to the same answers.

The walk reads what the gateway's codec reads and checks that every record adds up: its length is
positive and within the batch, its deltas, key and value end within it, and a record without headers
ends right after the header count (the headers of other records are not parsed). Anything else raises
``ValueError``, and the caller hands the batch to the codec.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from .batch import HEADER_SIZE, RecordBatch
from .compression import NONE, decompress

__all__ = ["ACCELERATED", "python_record_values", "record_values", "records_area"]

#: ``record_values(b, p, count, end, loads, error, fallback)``: the value of each of ``count`` records
#: from ``b[p]`` to ``b[end]``: ``loads(value)``, ``fallback(value)`` when ``loads`` raised ``error``,
#: None for a null value.
RecordValues = Callable[
    [bytes, int, int, int, Callable[[bytes], Any], type[BaseException], Callable[[bytes], Any]], list[Any]
]


def records_area(batch: RecordBatch) -> tuple[bytes, int]:
    """``(bytes, start)`` of a batch's records, decompressed; the records end with the bytes."""
    data = batch.to_bytes()
    codec = batch.compression
    if codec == NONE:
        return data, HEADER_SIZE
    return decompress(codec, memoryview(data)[HEADER_SIZE:]), 0


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


def python_record_values(
    b: bytes,
    p: int,
    count: int,
    end: int,
    loads: Callable[[bytes], Any],
    error: type[BaseException],
    fallback: Callable[[bytes], Any],
) -> list[Any]:
    """The reference walk (see the module docstring); the compiled one answers the same."""
    if p < 0 or count < 0 or end > len(b) or p > end:
        raise ValueError("the records area is out of the buffer")
    out: list[Any] = []
    for _ in range(count):
        n, p = _zigzag(b, p, end)
        if n <= 0 or n > end - p:
            raise ValueError("a record length does not fit the batch")
        rend = p + n
        p += 1  # attributes
        _, p = _zigzag(b, p, rend)  # timestamp delta
        _, p = _zigzag(b, p, rend)  # offset delta
        n, p = _zigzag(b, p, rend)  # key length
        if n > 0:
            if n > rend - p:
                raise ValueError("a record's deltas or key do not fit its length")
            p += n
        n, p = _zigzag(b, p, rend)
        if n > rend - p:
            raise ValueError("a record's value does not fit its length")
        if n < 0:
            out.append(None)
        else:
            raw = bytes(b[p : p + n])
            try:
                out.append(loads(raw))
            except error:
                out.append(fallback(raw))
            p += n
        if p >= rend or (b[p] == 0 and p + 1 != rend):
            raise ValueError("a record's headers do not fill its length")
        p = rend
    if p != end:
        raise ValueError("the records do not fill the batch")
    return out


def _compiled() -> RecordValues | None:
    try:
        from ._values import record_values as compiled
    except ImportError:  # built without a C compiler: the reference walk
        return None
    return compiled


_COMPILED: Final = _compiled()
#: Whether :func:`record_values` is the compiled walk.
ACCELERATED: Final = _COMPILED is not None
#: The walk: compiled when the extension is built, else :func:`python_record_values`.
record_values: Final[RecordValues] = _COMPILED or python_record_values
