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

Why this is not written with :class:`kanal.protocol.records.RecordBatch`: a view rewrites every
record of every batch it serves, and building a ``Record`` object per record then re-encoding it
costs about twice as much as a single pass that reads each record's framing, hands the value to the
compiled statement and writes the kept record from slices of the original bytes (only the value is
new). Two such passes exist: the loop generated per view with the statement inlined
(:mod:`kanal_topicviews.fastloop`: JSON values, no record metadata, the batch not cut by the fetch
offset), and the general loop below for everything else. The wire format is Kafka's (magic 2);
compression goes through the core's codecs.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

import orjson
from crc32c import crc32c

from kanal.protocol.records import (
    HEADER_SIZE,
    NONE,
    ZIGZAG_TABLE,
    ZIGZAG_TABLE_SIZE,
    compress,
    decompress,
    read_zigzag,
    zigzag_bytes,
)

from . import fastloop
from .sql import KEEP, CompiledView, RecordMeta, ViewContext, now_context

__all__ = ["FetchFailed", "Transformer", "next_offset"]

_HDR: Final = struct.Struct(">qiibIhiqqqhii")  # baseOffset .. recordsCount
_TAIL: Final = struct.Struct(">hiqqqhii")  # attributes .. recordsCount (CRC-covered)
_PREFIX: Final = struct.Struct(">qiibI")  # baseOffset, batchLength, leaderEpoch, magic, crc
_LEN: Final = struct.Struct(">qi")
_LEGACY_OFFSET: Final = struct.Struct(">q")
_LAST_DELTA: Final = struct.Struct(">i")  # lastOffsetDelta, at byte 23 of a batch
_CRC_START: Final = 21
_LENGTH_FLOOR: Final = HEADER_SIZE - 12
_CONTROL: Final = 0x20
_LOG_APPEND_TIME: Final = 0x08


_varint = zigzag_bytes
_ZZ_N: Final = ZIGZAG_TABLE_SIZE
_ZZ: Final = ZIGZAG_TABLE
_zz = read_zigzag


def _headers(raw: bytes) -> list[tuple[str, bytes | None]]:
    out: list[tuple[str, bytes | None]] = []
    count, p = _zz(raw, 0)
    for _ in range(count):
        n, p = _zz(raw, p)
        name = raw[p : p + n].decode("utf-8", "replace")
        p += n
        n, p = _zz(raw, p)
        if n < 0:
            out.append((name, None))
        else:
            out.append((name, raw[p : p + n]))
            p += n
    return out


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
                out.append(_empty(offset, 0, -1, 0, 0, -1, -1, -1, 0))
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
        h = _HDR.unpack_from(data, pos)
        base_offset, attributes, last_delta, count = h[0], h[5], h[6], h[12]
        if attributes & _CONTROL:
            return None  # transaction markers
        min_delta = fetch_offset - base_offset
        if crc32c(memoryview(data)[pos + _CRC_START : end]) != h[4]:
            return self._unreadable(h, min_delta, "the record batch fails its CRC")
        if min_delta > last_delta:  # entirely before the fetch offset (brokers do not send these)
            return _assemble(h, attributes, last_delta, b"", 0)
        try:
            body, start, stop = _records_area(data, pos, end, attributes)
        except Exception as exc:  # any codec failure makes the batch unreadable
            return self._unreadable(h, min_delta, f"the record batch cannot be decompressed: {exc}")
        out = bytearray()
        try:
            if self._loop is not None and min_delta <= 0:
                kept, edited = self._loop(body, start, stop, count, out, ctx)
            else:
                kept, edited = self._general(body, start, stop, count, out, ctx, h, partition, max(min_delta, 0))
        except IndexError:
            return self._unreadable(h, min_delta, "the record batch is malformed")
        except _Bad as bad:
            if bad.delta > 0:  # deliver the records before it: the batch ends just before the failing record
                bad.head = _assemble(h, attributes, bad.delta - 1, out, bad.kept)
            raise
        if not edited:
            return None
        return _assemble(h, attributes, last_delta, out, kept)

    def _unreadable(self, h: tuple[int, ...], min_delta: int, reason: str) -> bytes:
        if not self._drop:
            raise _Bad(max(min_delta, 0), reason)
        return _assemble(h, h[5], h[6], b"", 0)

    def _general(
        self,
        b: bytes,
        p: int,
        stop: int,
        count: int,
        out: bytearray,
        ctx: ViewContext | None,
        h: tuple[int, ...],
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
        base_offset, base_ts, max_ts, attributes = h[0], h[7], h[8], h[5]
        append_time = bool(attributes & _LOG_APPEND_TIME)
        meta = RecordMeta(partition=partition) if needs_meta else None
        kept = 0
        edited = False
        for _ in range(count):
            rec = p
            n, p = _zz(b, p)
            rend = p + n
            tsd, q = _zz(b, p + 1)
            od, q = _zz(b, q)
            kl, q = _zz(b, q)
            key = b[q : q + kl] if kl >= 0 else None
            if kl > 0:
                q += kl
            head = q
            vl, q = _zz(b, q)
            value = b[q : q + vl] if vl >= 0 else None
            vend = q + max(vl, 0)
            if od < min_delta:
                edited = True  # before the fetch offset
                p = rend
                continue
            if meta is not None:
                meta.key = key
                meta.offset = base_offset + od
                meta.timestamp = max_ts if append_time else base_ts + tsd
                meta.headers = _headers(b[vend:rend]) if b[vend] else ()
            try:
                result = tf(loads(value) if value is not None else None, meta, ctx)
                if result is None:
                    edited = True
                elif result is KEEP and not recode:
                    out += b[rec:rend]
                    kept += 1
                else:
                    if result is KEEP:
                        result = loads(value) if value is not None else None
                    nv = dumps(result, default=_json_default)
                    ln = len(nv)
                    vlb = _ZZ[ln + 1] if ln < _ZZ_N else _varint(ln)
                    size = head - p + len(vlb) + ln + rend - vend
                    out += _ZZ[size + 1] if size < _ZZ_N else _varint(size)
                    out += b[p:head]
                    out += vlb
                    out += nv
                    out += b[vend:rend]
                    kept += 1
                    edited = True
            except (ValueError, TypeError) as exc:
                if not drop:
                    raise _Bad(od, _reason(exc), kept) from None
                edited = True
            p = rend
        if p != stop:
            raise IndexError("records do not fill the batch")
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


def _bad(b: bytes, p: int, exc: BaseException, kept: int) -> _Bad:
    """The failure of the record whose length ends at ``p`` (FAIL_FETCH), for the generated loops."""
    return _Bad(_zz(b, _skip(b, p + 1))[0], _reason(exc), kept)


def _skip(b: bytes, q: int) -> int:
    """The position after the varint at ``q``."""
    while b[q] > 0x7F:
        q += 1
    return q + 1


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


def _records_area(data: bytes, pos: int, end: int, attributes: int) -> tuple[bytes, int, int]:
    """The (decompressed) records of a batch: (buffer, start, stop)."""
    codec = attributes & 7
    if codec == NONE:
        return data, pos + HEADER_SIZE, end
    body = decompress(codec, memoryview(data)[pos + HEADER_SIZE : end])
    return body, 0, len(body)


def _assemble(h: tuple[int, ...], attributes: int, last_delta: int, body: bytes | bytearray, count: int) -> bytes:
    """A batch with the header fields of ``h``, these records and this lastOffsetDelta (CRC computed).

    ``maxTimestamp`` stays the original's: it still bounds the kept records, and with LogAppendTime
    it is every record's timestamp."""
    if not count:
        attributes &= ~7
        body = b""
    elif attributes & 7:
        body = compress(attributes & 7, body)
    tail = _TAIL.pack(attributes, last_delta, h[7], h[8], h[9], h[10], h[11], count)
    crc = crc32c(body, crc32c(tail))
    return b"".join((_PREFIX.pack(h[0], _LENGTH_FLOOR + len(body), h[2], 2, crc), tail, body))


def _empty(
    base_offset: int,
    last_delta: int,
    leader_epoch: int,
    base_ts: int,
    max_ts: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    attributes: int,
) -> bytes:
    """An empty magic-2 batch covering ``base_offset .. base_offset + last_delta``."""
    h = (base_offset, 0, leader_epoch, 2, 0, attributes, last_delta, base_ts, max_ts, producer_id, producer_epoch,
         base_sequence, 0)  # fmt: skip
    return _assemble(h, attributes, last_delta, b"", 0)
