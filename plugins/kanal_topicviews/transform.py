"""Rewriting the records of one fetched partition through a view: filter, project, keep offsets.

The input is the ``records`` field of one partition of a Fetch response (magic-2 batches, possibly a
truncated last batch); the output is the same field as the view's consumer must see it:

* Kept records keep their offset and timestamp deltas, key and headers; a projected record gets the
  JSON of its projection as its value, a ``SELECT *`` record its original bytes.
* Filtered records are removed. Every batch keeps its base offset and its ``lastOffsetDelta``, so a
  consumer moves past the whole batch even when its last records, or all of them, were removed: an
  emptied batch is sent as a valid batch with no records (codec NONE, as Kafka's log cleaner writes
  them).
* Records before the fetch offset (the broker sends whole batches) are removed unread: the consumer
  would skip them anyway, and a record it never asked for must not fail its fetch.
* Transaction markers (control batches) and batches without a record a view could change are
  forwarded byte for byte; the truncated tail a broker may leave is kept as it is.
* A record the view cannot transform (its value is not JSON, not a JSON object, or its batch fails
  its CRC): with onError DROP it is removed like a filtered one; with FAIL_FETCH the records before
  it are delivered and the fetch fails at its offset (:class:`FetchFailed`), so the consumer's
  position stops exactly at the record it cannot read.

Why records are not ``kanal.api.Record`` objects: a view rewrites every record of every batch it
serves, and building a ``Record`` object per record then re-encoding it costs about twice as much as
a single pass over the core's record walk (``kanal.api.record_spans``: where each record's parts
are), which hands the value to the compiled statement and writes the kept record from the original
bytes (``write_record``: only the value is new). Two such passes exist: the loop generated per view
with the statement inlined (:mod:`kanal_topicviews.fastloop`: JSON values, no record metadata, the
batch not cut by the fetch offset), and the general loop below for everything else. The batch around
the kept records is framed by ``RecordBatch.with_records`` (the core's codecs and CRC).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

import orjson

from kanal.api import (
    CorruptRecordError,
    RecordBatch,
    encode_batch,
    record_headers,
    record_spans,
    records_area,
    write_record,
)

from . import fastloop
from .sql import KEEP, CompiledView, RecordMeta, ViewContext, now_context

__all__ = ["FetchFailed", "Transformer", "next_offset"]

_LEN: Final = struct.Struct(">qi")  # baseOffset, batchLength: the framing of magic 0, 1 and 2 alike
_LEGACY_OFFSET: Final = struct.Struct(">q")
_LAST_DELTA: Final = struct.Struct(">i")  # lastOffsetDelta, at byte 23 of a batch
_LENGTH_FLOOR: Final = 49  # the batchLength of a magic-2 batch without records (its header less 12 bytes)
_LOG_APPEND_TIME: Final = 0x08  # the timestamp type bit of a batch's attributes


def _headers(b: bytes, p: int, end: int) -> list[tuple[str, bytes | None]]:
    """The headers of the header section ``b[p:end]`` as a view reads them (names decoded)."""
    return [(name.decode("utf-8", "replace"), value) for name, value in record_headers(b, p, end)]


class FetchFailed(Exception):
    """A record at ``offset`` cannot be transformed and the view's onError is FAIL_FETCH.

    ``records`` is what may still be delivered before it (None when nothing is: the fetch of the
    partition fails)."""

    def __init__(self, offset: int, reason: str, records: bytes | None) -> None:
        super().__init__(f"record at offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason
        self.records = records


class _Bad(Exception):
    """Internal: a record (offset delta ``delta``) failed under FAIL_FETCH."""

    def __init__(self, delta: int, reason: str, kept: int = 0) -> None:
        self.delta = delta
        self.reason = reason
        self.kept = kept
        self.head: bytes | None = None  # the batch cut before the record, when it has records before it


Decode = Callable[[bytes], Any]


class Transformer:
    """Applies one compiled view to fetched partitions. ``drop``: onError DROP (else FAIL_FETCH).
    ``decode`` turns a value's bytes into the JSON-like value the statement reads (default: JSON);
    with a decoder, the output is always JSON (a kept ``SELECT *`` record is re-encoded).
    ``inline=False`` keeps every batch on the general loop (the tests compare the two loops)."""

    __slots__ = ("_decode", "_drop", "_loop", "_meta", "_tf", "_uses_now", "splittable")

    def __init__(self, sql: CompiledView, drop: bool, decode: Decode | None = None, *, inline: bool = True) -> None:
        self._tf = sql.transform
        self._drop = drop
        self._decode = decode
        self._meta = sql.needs_meta
        self._uses_now = sql.uses_now
        # The generated loop with the statement inlined (see fastloop): JSON values, no record metadata.
        self._loop = fastloop.build(sql, drop, _bad) if decode is None and inline else None
        #: whether a helper process can run it (it rebuilds it from the statement): JSON views only
        self.splittable = decode is None

    def fetch(self, data: bytes, partition: int, fetch_offset: int, stop: int | None = None) -> bytes:
        """The records field for the view's consumer. Raises :class:`FetchFailed` (FAIL_FETCH).

        With ``stop`` (a batch boundary), only the batches before it: the helper process does the
        rest, and the part is not copied out first. ``data`` itself is returned when nothing
        changed (with ``stop``: the answer is then ``data[:stop]``)."""
        ctx = now_context() if self._uses_now else None
        n = len(data) if stop is None else stop
        pos = 0
        out: list[bytes | memoryview] = []
        view = memoryview(data)
        changed = False
        while n - pos >= 17:
            base_offset, length = _LEN.unpack_from(data, pos)
            end = pos + 12 + length
            if length < 0 or end > n:
                break  # the truncated last batch: kept as it is, below
            if data[pos + 16] != 2 or length < _LENGTH_FLOOR:
                # A magic 0/1 message set: views read magic-2 batches only.
                offset = _LEGACY_OFFSET.unpack_from(data, pos)[0]
                if offset >= fetch_offset and not self._drop:
                    reason = "a magic 0/1 message set (views read magic-2 batches only)"
                    raise FetchFailed(offset, reason, b"".join(out) if offset > fetch_offset and out else None)
                out.append(encode_batch([], base_offset=offset, base_timestamp=0))  # an empty batch at its offset
                changed = True
                pos = end
                continue
            try:
                chunk = self._batch(data, pos, end, partition, fetch_offset, ctx)
            except _Bad as bad:
                offset = base_offset + bad.delta
                if offset <= fetch_offset:
                    raise FetchFailed(offset, bad.reason, None) from None
                if bad.head is not None:
                    out.append(bad.head)
                raise FetchFailed(offset, bad.reason, b"".join(out) if out else None) from None
            if chunk is None:
                out.append(view[pos:end])
            else:
                out.append(chunk)
                changed = True
            pos = end
        if not changed:
            return data
        if pos < n:
            out.append(view[pos:n])
        return b"".join(out)

    def _batch(
        self, data: bytes, pos: int, end: int, partition: int, fetch_offset: int, ctx: ViewContext | None
    ) -> bytes | None:
        """One magic-2 batch: the new batch, or None to forward the original bytes."""
        batch = RecordBatch(data, pos)
        if batch.is_control:
            return None  # transaction markers
        min_delta = fetch_offset - batch.base_offset
        try:
            batch.check_crc()
        except CorruptRecordError:
            return self._unreadable(batch, min_delta, "the record batch fails its CRC")
        if min_delta > batch.last_offset_delta:  # entirely before the fetch offset (brokers do not send these)
            return batch.with_records(b"", 0)
        try:
            body, start = records_area(batch)
        except Exception as exc:  # any codec failure makes the batch unreadable
            return self._unreadable(batch, min_delta, f"the record batch cannot be decompressed: {exc}")
        out = bytearray()
        count = batch.records_count
        try:
            if self._loop is not None and min_delta <= 0:
                kept, edited = self._loop(body, start, len(body), count, out, ctx)
            else:
                kept, edited = self._general(body, start, count, out, ctx, batch, partition, max(min_delta, 0))
        except ValueError:  # the record walk's answer for a malformed batch
            return self._unreadable(batch, min_delta, "the record batch is malformed")
        except _Bad as bad:
            if bad.delta > 0:  # deliver the records before it: the batch ends just before the failing record
                bad.head = batch.with_records(out, bad.kept, bad.delta - 1)
            raise
        if not edited:
            return None
        return batch.with_records(out, kept)

    def _unreadable(self, batch: RecordBatch, min_delta: int, reason: str) -> bytes:
        if not self._drop:
            raise _Bad(max(min_delta, 0), reason)
        return batch.with_records(b"", 0)

    def _general(
        self,
        b: bytes,
        p: int,
        count: int,
        out: bytearray,
        ctx: ViewContext | None,
        batch: RecordBatch,
        partition: int,
        min_delta: int,
    ) -> tuple[int, bool]:
        """Every other case: record metadata, a schema decoder, records before the fetch offset."""
        decode = self._decode
        loads = orjson.loads if decode is None else decode
        dumps = orjson.dumps
        tf = self._tf
        drop = self._drop
        needs_meta = self._meta
        recode = decode is not None  # the output of a decoded value is JSON, SELECT * included
        base_offset, base_ts, max_ts = batch.base_offset, batch.base_timestamp, batch.max_timestamp
        append_time = bool(batch.attributes & _LOG_APPEND_TIME)
        meta = RecordMeta(partition=partition) if needs_meta else None
        kept = 0
        edited = False
        for span in record_spans(b, p, count, len(b)):
            start, _, end, _, tsd, od, key, key_end, at, value_end, header_count = span
            if od < min_delta:
                edited = True  # before the fetch offset
                continue
            value = b[at:value_end] if at >= 0 else None
            if meta is not None:
                meta.key = b[key:key_end] if key >= 0 else None
                meta.offset = base_offset + od
                meta.timestamp = max_ts if append_time else base_ts + tsd
                meta.headers = _headers(b, value_end, end) if header_count else ()
            try:
                result = tf(loads(value) if value is not None else None, meta, ctx)
                if result is None:
                    edited = True
                elif result is KEEP and not recode:
                    out += b[start:end]
                    kept += 1
                else:
                    if result is KEEP:
                        result = loads(value) if value is not None else None
                    write_record(out, b, span, dumps(result, default=_json_default))
                    kept += 1
                    edited = True
            except (ValueError, TypeError) as exc:
                if not drop:
                    raise _Bad(od, _reason(exc), kept) from None
                edited = True
        return kept, edited


def next_offset(data: bytes) -> int | None:
    """The offset after the last complete batch of a records field (None when it holds none)."""
    n = len(data)
    pos = 0
    last = None
    while n - pos >= 17:
        base_offset, length = _LEN.unpack_from(data, pos)
        end = pos + 12 + length
        if length < 0 or end > n:
            break
        if data[pos + 16] == 2 and length >= _LENGTH_FLOOR:
            last = base_offset + _LAST_DELTA.unpack_from(data, pos + 23)[0] + 1
        else:  # a magic 0/1 entry: its offset is its last message's
            last = base_offset + 1
        pos = end
    return last


def _bad(delta: int, exc: BaseException, kept: int) -> _Bad:
    """The failure of the record at offset delta ``delta`` (FAIL_FETCH), for the generated loops."""
    return _Bad(delta, _reason(exc), kept)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, orjson.JSONDecodeError):
        return "the value is not JSON"
    return str(exc) or type(exc).__name__


def _json_default(value: Any) -> Any:
    """JSON for the values a schema decoder may produce that JSON has no type for."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("latin-1")
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    return str(value)
