"""The protocol firewall: request frames checked against the Kafka schemas before a broker sees them.

Why: a broker that panics, aborts or stalls on a malformed request takes every client with it, and
the gateway forwards most requests unread. The check walks the body of a request as the schema of
its (api key, version) lays it out, exactly to its end, and decodes nothing:

* every length and count fits in the bytes left (of the frame, of a tagged field, of a record set);
  no negative length but a nullable field's -1; no array counts more elements than the bytes left
  could hold at their smallest (so no count makes the walk, or a broker's allocation, blow up);
* varints end within 5 bytes and fit a non-negative int32; tagged fields ascend and a known tag's
  value fills its length exactly; strings are valid UTF-8 of at most 32767 bytes (what Kafka's own
  readers allow), booleans 0 or 1, and values the gateway's decoder (kio) would refuse are refused;
* record sets (Produce's ``records``) are opaque except for the headers of their batches: each
  batch fits, magic 2, a known codec, a batchLength of at least the v2 header's, a non-negative
  record count that an uncompressed batch has room for (optionally its CRC);
* nothing follows the body.

Unknown tagged fields are skipped, as Kafka does (``unknown_tags=False`` refuses them, as kio does).
Versions kio has no schema for are not judged (the connection refuses them itself, except ApiVersions,
which clients send in versions the broker may not know).

Two engines share the schema walk (:func:`request_schema`) and the messages:

* :func:`validate_request`, for a whole frame: per (api key, version), Python source generated from
  the schema once (straight-line code, fixed-size runs checked at once): 0.5 to 2.5 us for the usual
  Produce, Fetch and Metadata requests (``bench/validate_micro.py``), 1 to 2% of what the gateway
  spends on a request; ``_Codegen().source(request_schema(key, version))`` shows one;
* :class:`RequestScan`, for a large request forwarded while it arrives: fed the frame's bytes in
  order, it raises on the first malformed byte and keeps only structure (record bodies pass unread),
  so a caller that feeds each chunk before forwarding it never lets a malformed frame complete.

A reason reads ``Produce v9: topic_data[0].partition_data[0].records: length 9999 exceeds the 120
bytes left``.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
from collections.abc import Callable, Generator
from functools import cache
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from crc32c import crc32c
from kio.schema.errors import ErrorCode

from kanal.protocol.api import api_name, request_class
from kanal.protocol.headers import RequestHeader

__all__ = ["MalformedRequest", "RequestScan", "prepare", "request_schema", "validate_request"]


class MalformedRequest(ValueError):
    """A request that does not follow its schema; the message is the reason, for the log."""


class _Bad(Exception):
    """A check failed; the walker that raised it knows the field."""


class _Located(Exception):
    """(field path, reason) out of a generated walker."""


# --------------------------------------------------------------------------- schema


@dataclasses.dataclass(frozen=True, slots=True)
class Prim:
    """A primitive field: ``kind`` is kio's ``kafka_type`` (int32, string, records, ...)."""

    kind: str
    nullable: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Array:
    item: Node
    nullable: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Struct:
    name: str
    flexible: bool
    nullable: bool
    fields: tuple[tuple[str, Node], ...]
    tagged: tuple[tuple[int, str, Node], ...]  # ascending tags


Node = Prim | Array | Struct

# Fixed-size kinds whose every value is valid: runs of them are checked with one comparison.
_FIXED = {
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "uuid": 16,
    "timedelta_i32": 4,
}
# Fixed-size kinds with invalid values (for kio: booleans other than 0/1, out-of-range durations...).
_CHECKED = {"bool": 1, "timedelta_i64": 8, "datetime_i64": 8, "error_code": 2}
# kio's reader holds a duration in 64-bit microseconds: a longer one (about 292 years) does not decode.
_DURATION_MS_MAX = (2**63 - 1) // 1000
_VARLEN = ("string", "bytes", "records")
_STRING_MAX = 0x7FFF  # Kafka's readers refuse longer strings
_VARINT_MAX = 0x7FFFFFFF


def _node(hint: Any, kafka_type: str | None, tagged: bool, where: str) -> Node:
    optional = False
    if get_origin(hint) in (Union, UnionType) and NoneType in get_args(hint):
        optional = True
        (hint,) = (a for a in get_args(hint) if a is not NoneType)
    if get_origin(hint) is tuple:
        item_hint = get_args(hint)[0]
        if dataclasses.is_dataclass(item_hint):
            return Array(_entity(item_hint, False), optional)  # type: ignore[arg-type]
        return Array(_prim(kafka_type, False, where), optional)
    if dataclasses.is_dataclass(hint):
        return _entity(hint, optional)  # type: ignore[arg-type]
    # kio reads a tagged primitive as not nullable: a tagged field is left out rather than null.
    return _prim(kafka_type, optional and not tagged, where)


def _prim(kafka_type: str | None, nullable: bool, where: str) -> Prim:
    if kafka_type is None or (kafka_type not in _FIXED and kafka_type not in _CHECKED and kafka_type not in _VARLEN):
        raise TypeError(f"{where}: unsupported kafka_type {kafka_type!r}")
    return Prim(kafka_type, nullable)


@cache
def _entity(cls: type, nullable: bool) -> Struct:
    hints = get_type_hints(cls)
    plain: list[tuple[str, Node]] = []
    tagged: list[tuple[int, str, Node]] = []
    for f in dataclasses.fields(cls):
        tag = f.metadata.get("tag")
        node = _node(hints[f.name], f.metadata.get("kafka_type"), tag is not None, f"{cls.__name__}.{f.name}")
        if tag is None:
            plain.append((f.name, node))
        else:
            tagged.append((int(tag), f.name, node))
    return Struct(cls.__name__, bool(cls.__flexible__), nullable, tuple(plain), tuple(sorted(tagged)))  # type: ignore[attr-defined]


@cache
def request_schema(api_key: int, version: int) -> Struct | None:
    """The body layout of a request, from kio's schema, or None when kio does not know the version."""
    cls = request_class(api_key, version)
    return None if cls is None else _entity(cls, False)


def _min_size(node: Node, flexible: bool) -> int:
    """The fewest bytes a value can take: bounds array counts by the bytes left."""
    if isinstance(node, Prim):
        if node.kind in _FIXED:
            return _FIXED[node.kind]
        if node.kind in _CHECKED:
            return _CHECKED[node.kind]
        if flexible:
            return 1  # a compact length
        return 2 if node.kind == "string" else 4
    if isinstance(node, Array):
        return 1 if flexible else 4
    if node.nullable:
        return 1
    return sum(_min_size(n, node.flexible) for _, n in node.fields) + (1 if node.flexible else 0)


# --------------------------------------------------------------------------- shared checks

_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from
_I64 = struct.Struct(">q").unpack_from
_U32 = struct.Struct(">I").unpack_from
_BATCH = struct.Struct(">qiibIhiqqqhii").unpack_from  # the v2 batch header, baseOffset .. recordsCount
BATCH_HEADER_SIZE = 61
_LENGTH_FLOOR = BATCH_HEADER_SIZE - 12  # batchLength of a batch without records
_MIN_RECORD_SIZE = 7  # length, attributes, timestamp delta, offset delta, key, value, header count
_ERROR_CODES = frozenset(int(e.value) for e in ErrorCode)


def _short(need: int, left: int) -> str:
    return f"needs {need} bytes, {left} left"


def _truncated(run: tuple[tuple[int, int], ...], left: int) -> tuple[int, str]:
    """The first field of a fixed-size run that does not fit: (its id, the reason)."""
    for field, size in run:
        if size > left:
            return field, _short(size, left)
        left -= size
    raise AssertionError("the run fits")


def _negative(n: int) -> str:
    return "null, but the field is not nullable" if n == -1 else f"negative length {n}"


def _too_long(n: int, left: int) -> str:
    return f"length {n} exceeds the {left} bytes left"


def _too_many(n: int, each: int, left: int) -> str:
    return f"count {n} needs at least {n * each} bytes, {left} left"


def _uvarint(buf: bytes | bytearray, pos: int, end: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes that fits an int32, within ``end``."""
    value = shift = 0
    start = pos
    while True:
        if pos >= end:
            raise _Bad(f"varint runs past the {end - start} bytes left")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift == 35:
            raise _Bad("varint longer than 5 bytes")
    if value > _VARINT_MAX:
        raise _Bad(f"varint {value} exceeds {_VARINT_MAX}")
    return value, pos


def _tag_head(buf: bytes | bytearray, pos: int, end: int, last: int) -> tuple[int, int, int]:
    """(tag, size, position after them) of a tagged field, checked: ascending, within ``end``."""
    tag, pos = _uvarint(buf, pos, end)
    size, pos = _uvarint(buf, pos, end)
    if tag <= last:
        raise _Bad(f"tag {tag} after tag {last}: tags must ascend")
    if size > end - pos:
        raise _Bad(f"tag {tag}: " + _too_long(size, end - pos))
    return tag, size, pos


def _skip_tags(buf: bytes | bytearray, pos: int, end: int, unknown_tags: bool) -> int:
    """Checks a tagged-field section of a struct that defines no tags (all are unknown)."""
    count, pos = _uvarint(buf, pos, end)
    if count * 2 > end - pos:
        raise _Bad(_too_many(count, 2, end - pos))
    last = -1
    for _ in range(count):
        last, size, pos = _tag_head(buf, pos, end, last)
        if not unknown_tags:
            raise _Bad(f"unknown tag {last}")
        pos += size
    return pos


def _check_value(kind: str, nullable: bool, buf: bytes | bytearray, pos: int) -> None:
    """The checked fixed-size kinds, as kio decodes them (it refuses what does not convert)."""
    if kind == "bool":
        if buf[pos] > 1:
            raise _Bad(f"boolean {buf[pos]}, expected 0 or 1")
    elif kind == "error_code":
        (code,) = _I16(buf, pos)
        if code not in _ERROR_CODES:
            raise _Bad(f"unknown error code {code}")
    elif kind == "timedelta_i64":
        (ms,) = _I64(buf, pos)
        if not -_DURATION_MS_MAX <= ms <= _DURATION_MS_MAX:
            raise _Bad(f"duration {ms} ms out of range")
    else:  # datetime_i64
        (ms,) = _I64(buf, pos)
        if ms == -1 and nullable:
            return
        try:
            if ms < 0:
                raise ValueError
            datetime.datetime.fromtimestamp(ms // 1000, datetime.UTC)
        except (OverflowError, ValueError, OSError):
            raise _Bad(f"timestamp {ms} out of range") from None


def _check_batch_header(buf: bytes | bytearray, pos: int, index: int, left: int) -> int:
    """Checks the magic-v2 header of the batch at ``pos`` (``left`` bytes to the end of its record
    set, at least the header's 61); returns its batchLength."""
    _base, length, _epoch, magic, _crc, attributes, _delta, _t0, _t1, _pid, _pep, _seq, count = _BATCH(buf, pos)
    if magic != 2:
        raise _Bad(f"batch {index}: magic {magic}, expected 2")
    if length < _LENGTH_FLOOR:
        raise _Bad(f"batch {index}: batchLength {length} is less than the v2 header's {_LENGTH_FLOOR}")
    if length > left - 12:
        raise _Bad(f"batch {index}: batchLength {length} exceeds the {left - 12} bytes left")
    codec = attributes & 0x07
    if codec > 4:
        raise _Bad(f"batch {index}: unknown compression codec {codec}")
    if count < 0:
        raise _Bad(f"batch {index}: negative record count {count}")
    if codec == 0 and count * _MIN_RECORD_SIZE > length - _LENGTH_FLOOR:
        raise _Bad(f"batch {index}: {count} records cannot fit in {length - _LENGTH_FLOOR} bytes")
    return int(length)


def _batch_short(index: int, left: int) -> str:
    return f"batch {index}: {left} bytes left, fewer than a batch header's {BATCH_HEADER_SIZE}"


def _check_batches(buf: bytes | bytearray, pos: int, stop: int, crc: bool) -> None:
    """The batch headers of a record set spanning ``buf[pos:stop]`` (and their CRCs if asked)."""
    index = 0
    while pos < stop:
        left = stop - pos
        if left < BATCH_HEADER_SIZE:
            raise _Bad(_batch_short(index, left))
        length = _check_batch_header(buf, pos, index, left)
        if crc:
            (expected,) = _U32(buf, pos + 17)
            if crc32c(memoryview(buf)[pos + 21 : pos + 12 + length]) != expected:
                raise _Bad(f"batch {index}: CRC mismatch")
        pos += 12 + length
        index += 1


def _join(prefix: str, path: str, reason: str) -> str:
    return f"{prefix}: {path}: {reason}" if path else f"{prefix}: {reason}"


def _client_id_reason(frame: bytes | bytearray | memoryview) -> str | None:
    """The header's client id must be UTF-8 too (the header parser replaces bad bytes)."""
    (n,) = _I16(frame, 8)
    try:
        bytes(frame[10 : 10 + n]).decode()
    except UnicodeDecodeError:
        return "not valid UTF-8"
    return None


# --------------------------------------------------------------------------- whole frames: generated walkers

_Walker = Callable[[bytes | bytearray, int, int, bool, bool], int]


class _Codegen:
    """Writes the walker of one request schema as Python source.

    The walker keeps ``pos``, the field id ``f`` (an index into ``PATHS``, set before each field's
    checks) and the array indexes ``i0``, ``i1``...; a failed check raises ``_Bad`` and the single
    handler names the field from those.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.paths: list[str] = [""]
        self.consts: dict[str, object] = {}
        self.depth = 0
        self.max_depth = 0
        self._names = 0

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    def field(self, path: str) -> int:
        self.paths.append(path)
        return len(self.paths) - 1

    def name(self, stem: str) -> str:
        self._names += 1
        return f"{stem}{self._names}"

    def const(self, value: object) -> str:
        name = self.name("K")
        self.consts[name] = value
        return name

    def uvarint(self, ind: int, var: str, end: str) -> None:
        self.emit(ind, f"if pos >= {end}:")
        self.emit(ind + 1, 'raise _Bad("varint runs past the 0 bytes left")')
        self.emit(ind, f"{var} = buf[pos]")
        self.emit(ind, "pos += 1")
        self.emit(ind, f"if {var} > 127:")
        self.emit(ind + 1, f"{var}, pos = _uvarint(buf, pos - 1, {end})")

    def run(self, ind: int, run: list[tuple[int, int]], end: str) -> None:
        total = sum(size for _, size in run)
        self.emit(ind, f"if {end} - pos < {total}:")
        self.emit(ind + 1, f"f, r = _truncated({self.const(tuple(run))}, {end} - pos)")
        self.emit(ind + 1, "raise _Bad(r)")
        self.emit(ind, f"pos += {total}")

    def length(self, ind: int, compact: bool, size: int, end: str) -> None:
        """Reads a length or count into ``n`` (-1 for null)."""
        if compact:
            self.uvarint(ind, "n", end)
            self.emit(ind, "n -= 1")
        else:
            self.emit(ind, f"if {end} - pos < {size}:")
            self.emit(ind + 1, f"raise _Bad(_short({size}, {end} - pos))")
            self.emit(ind, f"n = {'_I16' if size == 2 else '_I32'}(buf, pos)[0]")
            self.emit(ind, f"pos += {size}")

    def null_branch(self, ind: int, nullable: bool) -> None:
        self.emit(ind, "if n < 0:")
        if nullable:
            self.emit(ind + 1, "if n != -1:")
            self.emit(ind + 2, "raise _Bad(_negative(n))")
        else:
            self.emit(ind + 1, "raise _Bad(_negative(n))")

    def node(self, node: Node, path: str, ind: int, end: str, flexible: bool) -> None:
        """Code that walks one value of ``node`` at ``pos`` (``path`` is its name, a template)."""
        if isinstance(node, Struct):
            self.struct(node, path, ind, end)
        elif isinstance(node, Array):
            self.array(node, path, ind, end, flexible)
        elif node.kind in _FIXED:
            self.run(ind, [(self.field(path), _FIXED[node.kind])], end)
        elif node.kind in _CHECKED:
            size = _CHECKED[node.kind]
            self.emit(ind, f"f = {self.field(path)}")
            self.emit(ind, f"if {end} - pos < {size}:")
            self.emit(ind + 1, f"raise _Bad(_short({size}, {end} - pos))")
            self.emit(ind, f"_check_value({node.kind!r}, {node.nullable}, buf, pos)")
            self.emit(ind, f"pos += {size}")
        else:
            self.varlen(node, path, ind, end, flexible)

    def varlen(self, node: Prim, path: str, ind: int, end: str, flexible: bool) -> None:
        string = node.kind == "string"
        self.emit(ind, f"f = {self.field(path)}")
        self.length(ind, flexible, 2 if string else 4, end)
        self.null_branch(ind, node.nullable)
        self.emit(ind, f"elif n > {end} - pos:")
        self.emit(ind + 1, f"raise _Bad(_too_long(n, {end} - pos))")
        self.emit(ind, "else:")
        if string:
            self.emit(ind + 1, f"if n > {_STRING_MAX}:")
            self.emit(ind + 2, f'raise _Bad(f"length {{n}} exceeds the string limit {_STRING_MAX}")')
        self.emit(ind + 1, "q = pos + n")
        if string:
            self.emit(ind + 1, "if n:")
            self.emit(ind + 2, "try:")
            self.emit(ind + 3, "buf[pos:q].decode()")
            self.emit(ind + 2, "except UnicodeDecodeError:")
            self.emit(ind + 3, 'raise _Bad("not valid UTF-8") from None')
        elif node.kind == "records":
            self.emit(ind + 1, "_check_batches(buf, pos, q, crc)")
        self.emit(ind + 1, "pos = q")

    def array(self, node: Array, path: str, ind: int, end: str, flexible: bool) -> None:
        item = node.item
        each = max(_min_size(item, flexible), 1)
        self.emit(ind, f"f = {self.field(path)}")
        self.length(ind, flexible, 4, end)
        self.null_branch(ind, node.nullable)
        self.emit(ind, f"elif n * {each} > {end} - pos:")
        self.emit(ind + 1, f"raise _Bad(_too_many(n, {each}, {end} - pos))")
        self.emit(ind, "else:")
        if isinstance(item, Prim) and item.kind in _FIXED:
            self.emit(ind + 1, f"pos += n * {_FIXED[item.kind]}")  # the count check covered it
            return
        depth = self.depth
        self.depth += 1
        self.max_depth = max(self.max_depth, self.depth)
        self.emit(ind + 1, f"for i{depth} in range(n):")
        self.node(item, f"{path}[{{{depth}}}]", ind + 2, end, flexible)
        self.depth -= 1

    def struct(self, node: Struct, path: str, ind: int, end: str) -> None:
        prefix = f"{path}." if path else ""
        if node.nullable:
            self.emit(ind, f"f = {self.field(path)}")
            self.emit(ind, f"if pos >= {end}:")
            self.emit(ind + 1, f"raise _Bad(_short(1, {end} - pos))")
            self.emit(ind, "m = buf[pos]")
            self.emit(ind, "pos += 1")
            self.emit(ind, "if m != 1 and m != 255:")
            self.emit(ind + 1, 'raise _Bad(f"presence marker {m if m < 128 else m - 256}, expected -1 or 1")')
            self.emit(ind, "if m == 1:")
            ind += 1
        run: list[tuple[int, int]] = []
        for name, child in node.fields:
            if isinstance(child, Prim) and child.kind in _FIXED:
                run.append((self.field(prefix + name), _FIXED[child.kind]))
                continue
            if run:
                self.run(ind, run, end)
                run = []
            self.node(child, prefix + name, ind, end, node.flexible)
        if run:
            self.run(ind, run, end)
        if node.flexible:
            self.tagged(node, prefix, ind, end)
        elif not node.fields:
            self.emit(ind, "pass")

    def tagged(self, node: Struct, prefix: str, ind: int, end: str) -> None:
        section = self.field(prefix + "<tagged fields>")
        self.emit(ind, f"if pos < {end} and buf[pos] == 0:")  # the usual empty section
        self.emit(ind + 1, "pos += 1")
        self.emit(ind, "else:")
        ind += 1
        self.emit(ind, f"f = {section}")
        if not node.tagged:
            self.emit(ind, f"pos = _skip_tags(buf, pos, {end}, unknown_tags)")
            return
        count, last, stop = self.name("c"), self.name("last"), self.name("stop")
        self.uvarint(ind, count, end)
        self.emit(ind, f"if {count} * 2 > {end} - pos:")
        self.emit(ind + 1, f"raise _Bad(_too_many({count}, 2, {end} - pos))")
        self.emit(ind, f"{last} = -1")
        self.emit(ind, f"for _ in range({count}):")
        body = ind + 1
        self.emit(body, f"f = {section}")
        self.emit(body, f"t, s, pos = _tag_head(buf, pos, {end}, {last})")
        self.emit(body, f"{last} = t")
        self.emit(body, f"{stop} = pos + s")
        keyword = "if"
        for tag, name, child in node.tagged:
            self.emit(body, f"{keyword} t == {tag}:")
            keyword = "elif"
            self.node(child, prefix + name, body + 1, stop, node.flexible)
            self.emit(body + 1, f"if pos != {stop}:")
            self.emit(body + 2, f"f = {self.field(prefix + name)}")
            self.emit(body + 2, f'raise _Bad(f"tagged value ends {{{stop} - pos}} bytes before its length")')
        self.emit(body, "else:")
        self.emit(body + 1, "if not unknown_tags:")
        self.emit(body + 2, 'raise _Bad(f"unknown tag {t}")')
        self.emit(body + 1, f"pos = {stop}")

    def source(self, schema: Struct) -> str:
        self.struct(schema, "", 2, "end")
        depth = max(self.max_depth, 1)
        indexes = ", ".join(f"i{d}" for d in range(depth))
        head = [
            "def walk(buf, pos, end, unknown_tags, crc):",
            "    f = 0",
            f"    {' = '.join(f'i{d}' for d in range(depth))} = 0",
            "    try:",
        ]
        tail = [
            "    except _Bad as exc:",
            f"        raise _Located(PATHS[f].format({indexes}), exc.args[0]) from None",
            "    return pos",
        ]
        return "\n".join(head + self.lines + tail) + "\n"


@cache
def _walker(api_key: int, version: int) -> _Walker | None:
    schema = request_schema(api_key, version)
    if schema is None:
        return None
    gen = _Codegen()
    source = gen.source(schema)
    namespace: dict[str, Any] = {
        "_Bad": _Bad,
        "_Located": _Located,
        "PATHS": tuple(gen.paths),
        "_I16": _I16,
        "_I32": _I32,
        "_uvarint": _uvarint,
        "_short": _short,
        "_truncated": _truncated,
        "_negative": _negative,
        "_too_long": _too_long,
        "_too_many": _too_many,
        "_check_value": _check_value,
        "_check_batches": _check_batches,
        "_tag_head": _tag_head,
        "_skip_tags": _skip_tags,
        **gen.consts,
    }
    exec(compile(source, f"<request walker {api_name(api_key)} v{version}>", "exec"), namespace)
    walk: _Walker = namespace["walk"]
    return walk


def validate_request(
    frame: bytes | bytearray, header: RequestHeader, *, unknown_tags: bool = True, check_crc: bool = False
) -> str | None:
    """Why the request ``frame`` (without its length prefix; ``header`` parsed from it) does not
    follow its schema, or None when it does (or when its version has no schema to judge it by).

    ``check_crc`` also checks the CRC of each record batch (off by default: it reads every record
    byte, where the rest of the walk reads only structure).
    """
    walk = _walkers.get((header.api_key, header.api_version))
    if walk is None:
        walk = _walker(header.api_key, header.api_version)
        if walk is None:
            return None
        _walkers[header.api_key, header.api_version] = walk
    reason: str | None
    if header.client_id is not None and not header.client_id.isascii():
        reason = _client_id_reason(frame)
        if reason is not None:
            return _join(_prefix(header), "header.client_id", reason)
    end = len(frame)
    try:
        walk(frame, header.body_offset, end, unknown_tags, check_crc)
    except _Located as exc:
        return _join(_prefix(header), exc.args[0], exc.args[1])
    # Bytes after the end (pos < end) are let through: Kafka's brokers ignore them, and a client
    # library sends some (a librdkafka Metadata v12 request carries 3).
    return None


_walkers: dict[tuple[int, int], _Walker] = {}  # a plain dict: cheaper to look up than the cache


def prepare(api_key: int, version: int) -> bool:
    """Compiles the walker of a request version now (about a millisecond, once), rather than on the
    first such request; returns whether the version has a schema to be checked against."""
    return _walker(api_key, version) is not None


def _prefix(header: RequestHeader) -> str:
    return f"{api_name(header.api_key)} v{header.api_version}"


# --------------------------------------------------------------------------- streamed frames

# A walk yields n > 0 for the next n bytes (sent back), VARINT for the next unsigned varint (sent
# back, read within ``RequestScan._limit``), and -n to pass over the next n bytes unread.
VARINT = 0
_Walk = Generator[int, Any, None]


class RequestScan:
    """Checks a request frame (without length prefix) fed in order as it arrives, for requests
    forwarded while they arrive; ``size`` is the frame's length and ``header`` was parsed from its
    first bytes.

    ``feed`` raises :class:`MalformedRequest` (the same reason :func:`validate_request` gives) at the
    first byte that shows the frame malformed; as ``size`` is known, the chunk that completes the
    frame is checked whole when fed. A caller that forwards each chunk only after ``feed`` returns
    never lets a malformed frame reach the broker whole, but the chunks before the damage did reach
    it: it must close that upstream connection too, which now holds a partial frame. Bytes reported
    :attr:`opaque` (record bodies, opaque byte fields) may instead be passed over unread with
    :meth:`skip`. Only structure is kept in memory (at most one string or batch header). Record
    CRCs are not checked.
    """

    __slots__ = ("_done", "_failed", "_limit", "_partial", "_path", "_prefix", "_size", "_walk", "_want", "position")

    def __init__(self, header: RequestHeader, size: int, *, unknown_tags: bool = True) -> None:
        self._prefix = f"{api_name(header.api_key)} v{header.api_version}"
        self._size = size
        self.position = 0  # frame bytes consumed so far
        self._limit = size
        self._path: list[str] = []
        self._partial = bytearray()
        self._failed: str | None = None
        self._done = False
        schema = request_schema(header.api_key, header.api_version)
        self._walk: _Walk = self._unjudged() if schema is None else self._frame(schema, header, unknown_tags)
        self._want = 0
        self._resume(None, first=True)

    @property
    def opaque(self) -> int:
        """How many of the next bytes the check need not see."""
        return min(-self._want, self._size - self.position) if self._want < 0 else 0

    @property
    def done(self) -> bool:
        """Whether the whole frame has been fed and found well-formed."""
        return self._done and self.position == self._size

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Consumes the next bytes of the frame; raises MalformedRequest if they break the schema."""
        if self._failed is not None:
            raise MalformedRequest(self._failed)
        n = len(data)
        if self.position + n > self._size:
            raise ValueError(f"fed {self.position + n} bytes of a {self._size}-byte frame")
        i = 0
        partial = self._partial
        while i < n:
            want = self._want
            if want < 0:
                k = min(-want, n - i)
                i += k
                self.position += k
                if want + k:
                    self._want = want + k
                else:
                    self._resume(None)
            elif want == VARINT:
                if self.position >= self._limit:
                    self._fail(f"varint runs past the {self._limit - self.position + len(partial)} bytes left")
                b = data[i]
                i += 1
                self.position += 1
                partial.append(b)
                if b >= 0x80:
                    if len(partial) == 5:
                        self._fail("varint longer than 5 bytes")
                    continue
                value = 0
                for shift, byte in enumerate(partial):
                    value |= (byte & 0x7F) << (7 * shift)
                partial.clear()
                if value > _VARINT_MAX:
                    self._fail(f"varint {value} exceeds {_VARINT_MAX}")
                self._resume(value)
            else:
                k = min(want - len(partial), n - i)
                partial += data[i : i + k]
                i += k
                self.position += k
                if len(partial) == want:
                    value_bytes = bytes(partial)
                    partial.clear()
                    self._resume(value_bytes)
        if self.position == self._size and not self._done:
            # Every read is bounded by the bytes left, so only a varint can still be wanting here.
            self._fail(f"varint runs past the {self._limit - self.position + len(partial)} bytes left")

    def skip(self, n: int) -> None:
        """Passes over ``n`` opaque bytes (at most :attr:`opaque`) without seeing them."""
        if not 0 < n <= self.opaque:
            raise ValueError(f"cannot skip {n} bytes, {self.opaque} are opaque")
        self.position += n
        if self._want + n:
            self._want += n
        else:
            self._resume(None)

    def finish(self) -> None:
        """Raises MalformedRequest unless the whole frame was fed and found well-formed."""
        if self._failed is not None:
            raise MalformedRequest(self._failed)
        if not self.done:
            raise MalformedRequest(f"{self._prefix}: the frame ends after {self.position} of its {self._size} bytes")

    def _fail(self, reason: str) -> None:
        self._failed = _join(self._prefix, ".".join(self._path), reason)
        self._walk.close()
        raise MalformedRequest(self._failed)

    def _resume(self, value: Any, first: bool = False) -> None:
        try:
            self._want = next(self._walk) if first else self._walk.send(value)
        except StopIteration:
            self._done = True
            if self.position != self._size:  # bytes after the end: let through, as Kafka does
                self._want = self.position - self._size
        except _Bad as exc:
            self._fail(exc.args[0])

    # -- the walk: the same checks, in the same order, as the generated walkers

    def _unjudged(self) -> _Walk:
        if self._size:
            yield -self._size

    def _frame(self, schema: Struct, header: RequestHeader, unknown_tags: bool) -> _Walk:
        skipped = 0
        if header.header_version >= 1 and header.client_id is not None and not header.client_id.isascii():
            yield -8
            n = _I16((yield 2), 0)[0]  # at least 1: the client id has a non-ASCII character
            try:
                (yield n).decode()
            except UnicodeDecodeError:
                self._path.append("header.client_id")
                raise _Bad("not valid UTF-8") from None
            skipped = 10 + n
        if header.body_offset > skipped:
            yield skipped - header.body_offset
        yield from self._struct(schema, self._size, unknown_tags)

    def _length(self, compact: bool, size: int, end: int) -> Generator[int, Any, int]:
        if compact:
            return int((yield from self._uvarint(end))) - 1
        left = end - self.position
        if left < size:
            raise _Bad(_short(size, left))
        data = yield size
        return int((_I16 if size == 2 else _I32)(data, 0)[0])

    def _uvarint(self, end: int) -> Generator[int, Any, int]:
        if self.position >= end:
            raise _Bad("varint runs past the 0 bytes left")
        self._limit = end
        value: int = yield VARINT
        return value

    def _null(self, n: int, nullable: bool) -> bool:
        """Whether length ``n`` is a null (raising when it may not be)."""
        if n < 0:
            if n != -1 or not nullable:
                raise _Bad(_negative(n))
            return True
        return False

    def _node(self, node: Node, end: int, unknown_tags: bool, flexible: bool) -> _Walk:
        if isinstance(node, Struct):
            yield from self._struct(node, end, unknown_tags)
        elif isinstance(node, Array):
            yield from self._array(node, end, unknown_tags, flexible)
        elif node.kind in _FIXED or node.kind in _CHECKED:
            size = _FIXED.get(node.kind) or _CHECKED[node.kind]
            left = end - self.position
            if left < size:
                raise _Bad(_short(size, left))
            if node.kind in _FIXED:
                yield -size
            else:
                _check_value(node.kind, node.nullable, (yield size), 0)
        else:
            string = node.kind == "string"
            n = yield from self._length(flexible, 2 if string else 4, end)
            if self._null(n, node.nullable):
                return
            left = end - self.position
            if n > left:
                raise _Bad(_too_long(n, left))
            if string:
                if n > _STRING_MAX:
                    raise _Bad(f"length {n} exceeds the string limit {_STRING_MAX}")
                if n:
                    try:
                        (yield n).decode()
                    except UnicodeDecodeError:
                        raise _Bad("not valid UTF-8") from None
            elif node.kind == "records":
                yield from self._batches(self.position + n)
            elif n:
                yield -n

    def _batches(self, stop: int) -> _Walk:
        index = 0
        while self.position < stop:
            left = stop - self.position
            if left < BATCH_HEADER_SIZE:
                raise _Bad(_batch_short(index, left))
            length = _check_batch_header((yield BATCH_HEADER_SIZE), 0, index, left)
            if length > _LENGTH_FLOOR:
                yield _LENGTH_FLOOR - length
            index += 1

    def _array(self, node: Array, end: int, unknown_tags: bool, flexible: bool) -> _Walk:
        item = node.item
        each = max(_min_size(item, flexible), 1)
        n = yield from self._length(flexible, 4, end)
        if self._null(n, node.nullable):
            return
        left = end - self.position
        if n * each > left:
            raise _Bad(_too_many(n, each, left))
        if isinstance(item, Prim) and item.kind in _FIXED:
            if n:
                yield -n * _FIXED[item.kind]
            return
        path = self._path
        name = path[-1]
        for i in range(n):
            path[-1] = f"{name}[{i}]"
            yield from self._node(item, end, unknown_tags, flexible)
        path[-1] = name

    def _struct(self, node: Struct, end: int, unknown_tags: bool) -> _Walk:
        path = self._path
        if node.nullable:
            left = end - self.position
            if left < 1:
                raise _Bad(_short(1, left))
            m = (yield 1)[0]
            if m != 1 and m != 255:
                raise _Bad(f"presence marker {m if m < 128 else m - 256}, expected -1 or 1")
            if m == 255:
                return
        for name, child in node.fields:
            path.append(name)
            yield from self._node(child, end, unknown_tags, node.flexible)
            path.pop()
        if not node.flexible:
            return
        path.append("<tagged fields>")
        count = yield from self._uvarint(end)
        left = end - self.position
        if count * 2 > left:
            raise _Bad(_too_many(count, 2, left))
        known = {tag: (name, child) for tag, name, child in node.tagged}
        last = -1
        for _ in range(count):
            tag = yield from self._uvarint(end)
            size = yield from self._uvarint(end)
            if tag <= last:
                raise _Bad(f"tag {tag} after tag {last}: tags must ascend")
            last = tag
            left = end - self.position
            if size > left:
                raise _Bad(f"tag {tag}: " + _too_long(size, left))
            stop = self.position + size
            entry = known.get(tag)
            if entry is None:
                if not unknown_tags:
                    raise _Bad(f"unknown tag {tag}")
                if size:
                    yield -size
                continue
            path[-1] = entry[0]
            yield from self._node(entry[1], stop, unknown_tags, node.flexible)
            if self.position != stop:
                raise _Bad(f"tagged value ends {stop - self.position} bytes before its length")
            path[-1] = "<tagged fields>"
        path.pop()
