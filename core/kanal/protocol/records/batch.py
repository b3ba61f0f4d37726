"""Kafka magic-v2 record batches (Java's ``DefaultRecordBatch``): lazy parse, fast codec, exact bytes.

Why hand-written: ``kio.records`` is 4x slower, has no compression and cuts timestamps to seconds
(library-measurements.md section 5). The design goals, in order:

* A gateway forwards most batches untouched, so parsing reads only the 61-byte headers; records
  are decoded (and the CRC checked) on first use, and an unchanged batch is re-emitted as the very
  bytes it came from. Only batches a caller changed are re-encoded, with their own codec.
* Anything that is not a well-formed magic-2 batch (magic 0/1 message sets, the truncated last
  batch of a Fetch response) is kept as opaque bytes and re-emitted in place, never decoded.
* Timestamps are integer milliseconds, never ``datetime``.

Offsets rule for edited batches (why: consumers advance by ``base_offset + last_offset_delta + 1``
and a fetch must never stall or re-deliver): re-encoding keeps ``base_offset``, the offset deltas
of the records that remain, and the batch's ``last_offset_delta`` (raised only if a record carries
a larger delta). So dropping the last records, or all of them, still lets a consumer move past the
whole batch; an emptied batch is emitted with ``recordsCount`` 0, no records area and codec
NONE (as Kafka's log cleaner writes them). Brokers validating a *Produce*
batch want dense deltas ``0..n-1`` instead: call :meth:`RecordBatch.renumber` there.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

import cramjam
from crc32c import crc32c

from ._varint import ZIGZAG_TABLE, ZIGZAG_TABLE_SIZE, read_zigzag, zigzag_bytes
from .compression import CODEC_NAMES, NONE, BytesLike, UnsupportedCodecError, compress, decompress
from .errors import CorruptRecordError

__all__ = [
    "CONTROL_ABORT",
    "CONTROL_COMMIT",
    "CREATE_TIME",
    "HEADER_SIZE",
    "LOG_APPEND_TIME",
    "CorruptRecordError",
    "Headers",
    "Record",
    "RecordBatch",
    "RecordSet",
    "encode_batch",
]

Headers = list[tuple[str, bytes | None]]

HEADER_SIZE = 61
_HDR = struct.Struct(">qiibIhiqqqhii")  # baseOffset .. recordsCount
_PREFIX = struct.Struct(">qiibI")  # baseOffset, batchLength, leaderEpoch, magic, crc: not CRC-covered
_TAIL = struct.Struct(">hiqqqhii")  # attributes .. recordsCount: start of the CRC-covered part
_LEN = struct.Struct(">qi")  # baseOffset, batchLength: the framing shared with magic 0/1 message sets
_CONTROL_KEY = struct.Struct(">hh")  # control record key: version, type
_CRC_START = 21  # the CRC covers bytes [21:end] of a batch
_LENGTH_FLOOR = HEADER_SIZE - 12  # smallest batchLength of a magic-2 batch (no records)

CREATE_TIME = 0
LOG_APPEND_TIME = 1
CONTROL_ABORT = 0
CONTROL_COMMIT = 1
_TIMESTAMP_TYPE_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20


# --------------------------------------------------------------------------- varints


# Pre-encoded varints for -1 .. _ZZ_N-1 (index n + 1) live in ``varint``: lengths, deltas and
# counts almost always fall there, and a list lookup is several times cheaper than the encoder loop.
_varint = zigzag_bytes
_ZZ_N = ZIGZAG_TABLE_SIZE
_ZZ = ZIGZAG_TABLE
_BYTE: list[bytes] = [bytes((i,)) for i in range(256)]
_NULL = _ZZ[0]  # length -1: null key/value
_HKEY: dict[str, bytes] = {}  # header key -> varint length + UTF-8 bytes, bounded
_HKEY_MAX = 4096


_read_zz = read_zigzag


# --------------------------------------------------------------------------- records


class Record:
    """One record of a batch; offset and timestamp are deltas from the batch's base values.

    Mutable on purpose: a view edits records in place, then calls ``RecordBatch.mark_changed``.
    ``headers`` keeps Kafka's semantics: ordered, duplicate keys allowed, values may be None.
    Decoded records keep their headers as wire bytes until ``headers`` is first read (most filters
    look at values only); untouched headers are re-encoded by copying those bytes.
    """

    __slots__ = ("_headers", "_raw_headers", "attributes", "key", "offset_delta", "timestamp_delta", "value")

    def __init__(
        self,
        offset_delta: int = 0,
        timestamp_delta: int = 0,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: Headers | None = None,
        attributes: int = 0,
        raw_headers: bytes | None = None,
    ) -> None:
        """``raw_headers`` (the encoded header count and headers) is for the decoder only."""
        self.offset_delta = offset_delta
        self.timestamp_delta = timestamp_delta
        self.key = key
        self.value = value
        self.attributes = attributes
        self._headers = headers
        self._raw_headers = raw_headers

    @property
    def headers(self) -> Headers:
        h = self._headers
        if h is None:
            raw = self._raw_headers
            h = self._headers = [] if raw is None else _parse_headers(raw)
        return h

    @headers.setter
    def headers(self, value: Headers) -> None:
        self._headers = value

    def _fields(self) -> tuple[object, ...]:
        return (self.offset_delta, self.timestamp_delta, self.key, self.value, self.headers, self.attributes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (
            f"Record(offset_delta={self.offset_delta}, timestamp_delta={self.timestamp_delta}, "
            f"key={self.key!r}, value={self.value!r}, headers={self.headers!r})"
        )


def _parse_headers(raw: bytes) -> Headers:
    """Decode a record's header section (count, then key/value pairs), which must fill ``raw``."""
    out: Headers = []
    append = out.append
    zz = _read_zz
    try:
        count, p = zz(raw, 0)
        if count < 0:
            raise CorruptRecordError(f"negative header count {count}")
        for _ in range(count):
            x = raw[p]
            if x < 0x80:
                n = (x >> 1) ^ -(x & 1)
                p += 1
            else:
                n, p = zz(raw, p)
            if n < 0:
                raise CorruptRecordError(f"negative header key length {n}")
            # surrogateescape: a key that is not UTF-8 still re-encodes to the same bytes
            hk = raw[p : p + n].decode("utf-8", "surrogateescape")
            p += n
            x = raw[p]
            if x < 0x80:
                n = (x >> 1) ^ -(x & 1)
                p += 1
            else:
                n, p = zz(raw, p)
            if n < 0:
                append((hk, None))
            else:
                append((hk, raw[p : p + n]))
                p += n
    except IndexError as e:
        raise CorruptRecordError("truncated record headers") from e
    if p != len(raw):
        raise CorruptRecordError("record headers do not fill the record")
    return out


def _decode_records(b: bytes, p: int, end: int, count: int) -> list[Record]:
    """Decode ``count`` records from ``b[p:end]``.

    Speed: bytes indexing, the common 1- and 2-byte varints inlined, and one constructor call per
    record (library-measurements.md section 5, "fast decoder").
    """
    out: list[Record] = []
    append = out.append
    zz = _read_zz
    rec = Record
    for _ in range(count):
        x = b[p]
        if x < 0x80:
            n = (x >> 1) ^ -(x & 1)
            p += 1
        elif b[p + 1] < 0x80:
            n = (x & 0x7F) | (b[p + 1] << 7)
            n = (n >> 1) ^ -(n & 1)
            p += 2
        else:
            n, p = zz(b, p)
        rend = p + n
        attrs = b[p]
        x = b[p + 1]
        if x < 0x80:
            tsd = (x >> 1) ^ -(x & 1)
            p += 2
        elif b[p + 2] < 0x80:
            tsd = (x & 0x7F) | (b[p + 2] << 7)
            tsd = (tsd >> 1) ^ -(tsd & 1)
            p += 3
        else:
            tsd, p = zz(b, p + 1)
        x = b[p]
        if x < 0x80:
            od = (x >> 1) ^ -(x & 1)
            p += 1
        else:
            od, p = zz(b, p)
        x = b[p]
        if x < 0x80:
            n = (x >> 1) ^ -(x & 1)
            p += 1
        else:
            n, p = zz(b, p)
        if n < 0:
            key = None
        else:
            key = b[p : p + n]
            p += n
        x = b[p]
        if x < 0x80:
            n = (x >> 1) ^ -(x & 1)
            p += 1
        elif b[p + 1] < 0x80:
            n = (x & 0x7F) | (b[p + 1] << 7)
            n = (n >> 1) ^ -(n & 1)
            p += 2
        else:
            n, p = zz(b, p)
        if n < 0:
            value = None
        else:
            value = b[p : p + n]
            p += n
        if b[p] == 0:  # no headers
            if p + 1 != rend:
                raise CorruptRecordError(f"record length mismatch at byte {p}")
            p = rend
            append(rec(od, tsd, key, value, None, attrs, None))
        else:  # headers stay encoded until read: the record length bounds them
            if rend > end or rend <= p:
                raise CorruptRecordError(f"record length mismatch at byte {p}")
            append(rec(od, tsd, key, value, None, attrs, b[p:rend]))
            p = rend
    if p != end:
        raise CorruptRecordError(f"{end - p} bytes left after {count} records")
    return out


def _encode_headers(headers: Headers) -> bytes:
    n = len(headers)
    out: list[bytes] = [_ZZ[n + 1] if n < _ZZ_N else _varint(n)]
    append = out.append
    cache = _HKEY
    for hk, hv in headers:
        kb = cache.get(hk)
        if kb is None:
            raw = hk.encode("utf-8", "surrogateescape")
            kb = _varint(len(raw)) + raw
            if len(cache) < _HKEY_MAX:
                cache[hk] = kb
        append(kb)
        if hv is None:
            append(_NULL)
        else:
            n = len(hv)
            append(_ZZ[n + 1] if n < _ZZ_N else _varint(n))
            append(hv)
    return b"".join(out)


def _encode_records(records: Iterable[Record]) -> tuple[bytes, int, int, int]:
    """Encode records; returns (records area, count, max offset delta, max timestamp delta)."""
    parts: list[bytes] = []
    extend = parts.extend
    zzt, zzn, var, byte = _ZZ, _ZZ_N, _varint, _BYTE
    empty = b""
    join = empty.join
    zero = zzt[1]
    count = 0
    max_od = max_tsd = -(1 << 63)
    for r in records:
        count += 1
        x = r.timestamp_delta
        if x > max_tsd:
            max_tsd = x
        tsd = zzt[x + 1] if -1 <= x < zzn else var(x)
        x = r.offset_delta
        if x > max_od:
            max_od = x
        od = zzt[x + 1] if -1 <= x < zzn else var(x)
        key = r.key
        if key is None:
            kl = _NULL
            key = empty
        else:
            x = len(key)
            kl = zzt[x + 1] if x < zzn else var(x)
        value = r.value
        if value is None:
            vl = _NULL
            value = empty
        else:
            x = len(value)
            vl = zzt[x + 1] if x < zzn else var(x)
        h = r._headers
        if h:
            hb = _encode_headers(h)
        elif h is None:  # never read since decoding: copy the wire bytes
            hb = r._raw_headers or zero
        else:
            hb = zero
        body = join((byte[r.attributes & 0xFF], tsd, od, kl, key, vl, value, hb))
        x = len(body)
        extend((zzt[x + 1] if x < zzn else var(x), body))
    return join(parts), count, max_od, max_tsd


def _compressed(attributes: int, count: int, body: BytesLike) -> tuple[int, BytesLike]:
    """Compress a records area with the codec in ``attributes``.

    A batch without records gets no records area and codec NONE, as Kafka's own emptied batches
    (``writeEmptyHeader``): readers then never try to decompress an empty payload.
    """
    if not count:
        return attributes & ~7, b""
    codec = attributes & 7
    return attributes, compress(codec, body) if codec else body


def _assemble(
    base_offset: int,
    partition_leader_epoch: int,
    attributes: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    records_count: int,
    body: BytesLike,
) -> bytes:
    """Frame a (possibly compressed) records area as a batch, computing batchLength and CRC-32C."""
    tail = _TAIL.pack(
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        records_count,
    )
    crc = crc32c(body, crc32c(tail))
    prefix = _PREFIX.pack(base_offset, _LENGTH_FLOOR + len(body), partition_leader_epoch, 2, crc)
    return b"".join((prefix, tail, body))


def encode_batch(
    records: Iterable[Record],
    *,
    base_offset: int = 0,
    base_timestamp: int,
    compression: int = NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
    timestamp_type: int = CREATE_TIME,
    partition_leader_epoch: int = -1,
    last_offset_delta: int | None = None,
) -> bytes:
    """Build a new magic-2 batch from records, whose offset/timestamp deltas are written as given.

    ``last_offset_delta`` defaults to the largest offset delta (0 for no records); ``max_timestamp`` is
    ``base_timestamp`` plus the largest timestamp delta.
    """
    if compression not in CODEC_NAMES:
        raise UnsupportedCodecError(compression)
    body, count, max_od, max_tsd = _encode_records(records)
    attributes = compression
    if timestamp_type == LOG_APPEND_TIME:
        attributes |= _TIMESTAMP_TYPE_BIT
    if transactional:
        attributes |= _TRANSACTIONAL_BIT
    if control:
        attributes |= _CONTROL_BIT
    if last_offset_delta is None:
        last_offset_delta = max_od if count else 0
    max_timestamp = base_timestamp + max_tsd if count else base_timestamp
    attributes, area = _compressed(attributes, count, body)
    return _assemble(
        base_offset,
        partition_leader_epoch,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
        area,
    )


# --------------------------------------------------------------------------- batches


class RecordBatch:
    """A magic-2 batch over a slice of a larger buffer; header fields are plain attributes.

    Editing a header field (e.g. ``base_offset`` or ``partition_leader_epoch``) only re-frames the
    batch around its original records area; changing records (``replace_records``, or in-place edits
    followed by ``mark_changed``) re-encodes it with the codec in ``attributes & 7``.
    """

    __slots__ = (
        "_buf",
        "_dirty",
        "_end",
        "_orig",
        "_pos",
        "_records",
        "attributes",
        "base_offset",
        "base_sequence",
        "base_timestamp",
        "batch_length",
        "crc",
        "last_offset_delta",
        "magic",
        "max_timestamp",
        "partition_leader_epoch",
        "producer_epoch",
        "producer_id",
        "records_count",
    )

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    def __init__(self, buf: bytes, pos: int = 0) -> None:
        """Wrap the batch starting at ``buf[pos]``; reads its header only."""
        if len(buf) - pos < HEADER_SIZE:
            raise CorruptRecordError("buffer shorter than a record batch header")
        h = _HDR.unpack_from(buf, pos)
        (
            self.base_offset,
            self.batch_length,
            self.partition_leader_epoch,
            self.magic,
            self.crc,
            self.attributes,
            self.last_offset_delta,
            self.base_timestamp,
            self.max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self.records_count,
        ) = h
        if self.magic != 2:
            raise CorruptRecordError(f"not a magic-2 record batch (magic {self.magic})")
        end = pos + 12 + self.batch_length
        if self.batch_length < _LENGTH_FLOOR or end > len(buf):
            raise CorruptRecordError(f"bad batch length {self.batch_length}")
        self._buf = buf
        self._pos = pos
        self._end = end
        self._orig: tuple[int, ...] = h
        self._records: list[Record] | None = None
        self._dirty = False

    @classmethod
    def from_bytes(cls, data: BytesLike) -> RecordBatch:
        """Wrap exactly one batch."""
        buf = data if isinstance(data, bytes) else bytes(data)
        batch = cls(buf)
        if batch._end != len(buf):
            raise CorruptRecordError(f"{len(buf) - batch._end} bytes after the batch")
        return batch

    # -- attributes bits
    @property
    def compression(self) -> int:
        """Codec code (``attributes & 7``); setting it recompresses the batch on ``to_bytes``."""
        return self.attributes & 7

    @compression.setter
    def compression(self, codec: int) -> None:
        if codec not in CODEC_NAMES:
            raise UnsupportedCodecError(codec)
        self.attributes = (self.attributes & ~7) | codec

    @property
    def timestamp_type(self) -> int:
        """``CREATE_TIME`` (0) or ``LOG_APPEND_TIME`` (1)."""
        return (self.attributes >> 3) & 1

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)

    @property
    def control_type(self) -> int | None:
        """``CONTROL_ABORT``/``CONTROL_COMMIT`` for a transaction marker batch, else None."""
        if not self.is_control:
            return None
        recs = self.records()
        key = recs[0].key if recs else None
        if key is None or len(key) < 4:
            return None
        return int(_CONTROL_KEY.unpack_from(key)[1])

    @property
    def size(self) -> int:
        """Size in bytes of the batch as parsed."""
        return self._end - self._pos

    @property
    def next_offset(self) -> int:
        """The offset a consumer continues from after this batch."""
        return self.base_offset + self.last_offset_delta + 1

    def offset_of(self, r: Record) -> int:
        """Absolute offset of one of this batch's records."""
        return self.base_offset + r.offset_delta

    def timestamp_of(self, r: Record) -> int:
        """Record timestamp in ms; with LogAppendTime every record carries the batch's max timestamp."""
        if self.attributes & _TIMESTAMP_TYPE_BIT:
            return self.max_timestamp
        return self.base_timestamp + r.timestamp_delta

    # -- records
    def check_crc(self) -> None:
        """Raise CorruptRecordError unless the stored CRC-32C matches the original bytes."""
        actual = crc32c(memoryview(self._buf)[self._pos + _CRC_START : self._end])
        if actual != self._orig[4]:
            raise CorruptRecordError(f"CRC mismatch: stored {self._orig[4]:#010x}, computed {actual:#010x}")

    def records(self) -> list[Record]:
        """Decode the records once (checking the CRC first) and cache them; the list is live."""
        recs = self._records
        if recs is None:
            recs = self._records = self._decode()
        return recs

    def _decode(self) -> list[Record]:
        self.check_crc()
        count = self._orig[12]
        codec = self._orig[5] & 7
        start = self._pos + HEADER_SIZE
        try:
            if codec == NONE:
                return _decode_records(self._buf, start, self._end, count)
            data = decompress(codec, memoryview(self._buf)[start : self._end])
            return _decode_records(data, 0, len(data), count)
        except (IndexError, cramjam.DecompressionError, UnsupportedCodecError) as e:
            raise CorruptRecordError(f"cannot decode records: {e}") from e

    def replace_records(self, records: list[Record]) -> None:
        """Swap in a new record list (e.g. a filtered one); the batch will be re-encoded."""
        self._records = records
        self._dirty = True

    def mark_changed(self) -> None:
        """Declare that records were edited in place, so ``to_bytes`` must re-encode."""
        self.records()
        self._dirty = True

    def renumber(self) -> None:
        """Make offset deltas dense (0..n-1) and set last_offset_delta to n-1, as Produce requires.

        Use only on batches a client sends: on fetched batches it would move records to other offsets.
        """
        recs = self.records()
        for i, r in enumerate(recs):
            r.offset_delta = i
        self.last_offset_delta = len(recs) - 1
        self._dirty = True

    def _header(self) -> tuple[int, ...]:
        return (
            self.base_offset,
            self.batch_length,
            self.partition_leader_epoch,
            self.magic,
            self.crc,
            self.attributes,
            self.last_offset_delta,
            self.base_timestamp,
            self.max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self.records_count,
        )

    def changed(self) -> bool:
        """True when ``to_bytes`` would differ from the parsed bytes (records or header edited)."""
        return self._dirty or self._header() != self._orig

    def _chunk(self) -> BytesLike:
        """The batch's wire bytes; a zero-copy view when unchanged."""
        if not self._dirty:
            h = self._header()
            if h == self._orig:
                return memoryview(self._buf)[self._pos : self._end]
            if (h[5] & 7) == (self._orig[5] & 7):  # header-only edit: re-frame the same records area
                return _assemble(
                    self.base_offset,
                    self.partition_leader_epoch,
                    self.attributes,
                    self.last_offset_delta,
                    self.base_timestamp,
                    self.max_timestamp,
                    self.producer_id,
                    self.producer_epoch,
                    self.base_sequence,
                    self.records_count,
                    memoryview(self._buf)[self._pos + HEADER_SIZE : self._end],
                )
        return self._encode()

    def _encode(self) -> bytes:
        recs = self.records()
        body, count, max_od, max_tsd = _encode_records(recs)
        last_offset_delta = max(self.last_offset_delta, max_od) if count else self.last_offset_delta
        if count and not self.attributes & _TIMESTAMP_TYPE_BIT:
            max_timestamp = self.base_timestamp + max_tsd
        else:  # LogAppendTime or no records: the broker-set value stays
            max_timestamp = self.max_timestamp
        attributes, area = _compressed(self.attributes, count, body)
        return _assemble(
            self.base_offset,
            self.partition_leader_epoch,
            attributes,
            last_offset_delta,
            self.base_timestamp,
            max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            count,
            area,
        )

    def with_records(self, records: BytesLike, count: int, last_offset_delta: int | None = None) -> bytes:
        """The batch's wire bytes around another records area: ``count`` records already encoded
        (``records``, uncompressed; e.g. some of this batch's records, copied or rewritten with
        ``write_record``), compressed with the batch's codec, its CRC computed.

        For plugins that rewrite records without ``Record`` objects. The header fields stay as they
        are, ``maxTimestamp`` included (it still bounds a subset of the records, and with LogAppendTime
        it is every record's timestamp), and ``lastOffsetDelta`` unless given, so that consumers still
        move past the whole batch (see the offsets rule above). No records: no records area and codec
        NONE, as Kafka's emptied batches.
        """
        attributes, area = _compressed(self.attributes, count, records)
        return _assemble(
            self.base_offset,
            self.partition_leader_epoch,
            attributes,
            self.last_offset_delta if last_offset_delta is None else last_offset_delta,
            self.base_timestamp,
            self.max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            count,
            area,
        )

    def to_bytes(self) -> bytes:
        """The batch on the wire: the original bytes when unchanged, else a fresh encoding."""
        if self._pos == 0 and self._end == len(self._buf) and not self.changed():
            return self._buf
        chunk = self._chunk()
        return chunk if isinstance(chunk, bytes) else bytes(chunk)

    def __repr__(self) -> str:
        return (
            f"RecordBatch(base_offset={self.base_offset}, records_count={self.records_count}, "
            f"compression={self.compression}, attributes={self.attributes:#x}, size={self.size})"
        )


# --------------------------------------------------------------------------- record sets


class RecordSet:
    """The ``records`` field of one partition in a Produce request or Fetch response.

    Holds the magic-2 batches in ``batches`` and, in order between them, opaque spans: magic 0/1
    message sets and unknown data (forwarded untouched, never decoded) and the truncated tail a
    broker may leave at the end of a Fetch response.
    """

    __slots__ = ("_data", "_parts", "_removed", "_tail_start", "batches", "has_legacy")

    def __init__(self, data: bytes | None) -> None:
        self._data = data
        self._parts: list[RecordBatch | tuple[int, int]] = []
        self.batches: list[RecordBatch] = []
        self.has_legacy = False
        self._removed = False
        self._tail_start = 0 if data is None else len(data)
        if data:
            self._scan(data)

    @classmethod
    def parse(cls, data: BytesLike | None) -> RecordSet:
        """Index the batches of a records blob, reading their headers only."""
        if data is not None and not isinstance(data, bytes):
            data = bytes(data)  # bytes indexing is what the fast decoder wants
        return cls(data)

    def _scan(self, b: bytes) -> None:
        n = len(b)
        pos = 0
        parts = self._parts
        while n - pos >= 17:  # room for the magic byte at offset 16
            length = _LEN.unpack_from(b, pos)[1]
            end = pos + 12 + length
            if length < 0 or end > n:
                break  # truncated last batch (or garbage): the rest is the opaque tail
            magic = b[pos + 16]
            if magic == 2 and length >= _LENGTH_FLOOR:
                batch = RecordBatch(b, pos)
                parts.append(batch)
                self.batches.append(batch)
            else:
                if magic < 2:
                    self.has_legacy = True
                last = parts[-1] if parts else None
                if isinstance(last, tuple) and last[1] == pos:
                    parts[-1] = (last[0], end)  # merge adjacent opaque entries
                else:
                    parts.append((pos, end))
            pos = end
        self._tail_start = pos
        if pos < n:
            parts.append((pos, n))

    @property
    def tail(self) -> bytes:
        """The truncated trailing bytes (a partial batch), or b"" when there are none."""
        if self._data is None:
            return b""
        return self._data[self._tail_start :]

    @property
    def is_null(self) -> bool:
        """A null records field (Kafka distinguishes it from an empty one)."""
        return self._data is None

    def changed(self) -> bool:
        """True when some batch was edited or removed, so ``to_bytes`` must splice."""
        return self._removed or any(b.changed() for b in self.batches)

    def remove(self, batch: RecordBatch) -> None:
        """Drop a whole batch (e.g. one a Produce filter emptied: brokers reject empty batches)."""
        self.batches.remove(batch)
        self._parts.remove(batch)
        self._removed = True

    def replace(self, batch: RecordBatch, data: BytesLike) -> RecordBatch:
        """Put another batch's wire bytes (e.g. ``batch.with_records(...)``: records rewritten without
        ``Record`` objects) in place of ``batch``; returns the new batch, which the hooks after this
        one see. Raises CorruptRecordError when ``data`` is not exactly one batch."""
        new = RecordBatch.from_bytes(data)
        at = next(i for i, b in enumerate(self.batches) if b is batch)
        self.batches[at] = new
        self._parts[next(i for i, p in enumerate(self._parts) if p is batch)] = new
        self._removed = True  # (the set changed: to_bytes splices)
        return new

    def to_bytes(self) -> bytes | None:
        """The records blob: the original object when nothing changed; None stays None."""
        data = self._data
        if data is None or not self.changed():
            return data
        mv = memoryview(data)
        return b"".join(p._chunk() if isinstance(p, RecordBatch) else mv[p[0] : p[1]] for p in self._parts)

    def __iter__(self) -> Iterator[tuple[RecordBatch, Record]]:
        """Data records with their batch; control batches (transaction markers) are skipped."""
        for batch in self.batches:
            if not batch.attributes & _CONTROL_BIT:
                for r in batch.records():
                    yield batch, r

    def __repr__(self) -> str:
        return f"RecordSet(batches={len(self.batches)}, legacy={self.has_legacy}, tail={len(self.tail)}B)"
