"""The record loop of a JSON view, generated once per view with the view's statement inlined.

Most views read JSON values and no record metadata. For them the transformer runs one generated
function per batch, which walks the records, parses each value, runs the statement's code in place
and writes the kept records. Why generated: with a call of ``_view`` per record, the call and the
dispatch on its result cost about as much as the statement itself; inlined, the code also knows
statically whether the view projects or keeps (``SELECT *``), and reads the framing with fewer
operations (varints of one and two bytes inline, two-byte ones through a table, longer ones through
``read_zigzag``). On the benchmark's records a fetch costs 1.7 us per record this way, against 2.1
with the loop calling ``_view`` it replaced (``bench/topicviews_micro.py``).

The loop does exactly what the transformer's general loop does for these views (the tests compare
the two on generated batches): a null value reaches the statement as None, which refuses it; a kept
record is written from slices of the original bytes around its new value (``SELECT *``: its original
bytes), straight into the batch's ``bytearray``, so that orjson's output is freed at once (keeping
one output object per record alive costs more than the whole loop); a value that is not JSON or not
an object is dropped (onError DROP) or raised through ``bad`` (FAIL_FETCH).

Framing shortcuts, valid because the batch's CRC was checked and its records must fill it exactly
(else the batch is malformed): lengths are never below -1, so a one- or two-byte zigzag varint above
1 is an even number, twice the length.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from typing import Any, Final

import orjson

from kanal.protocol.records import ZIGZAG_TABLE, ZIGZAG_TABLE_SIZE, read_zigzag, zigzag_bytes

from .sql import CompiledView

__all__ = ["Bad", "LoopFn", "build"]

#: ``loop(buffer, start, stop, count, out, ctx) -> (kept, edited)``: the records of one batch, from
#: ``start`` to ``stop``, kept ones appended to ``out``. Raises IndexError for a malformed batch.
LoopFn = Callable[[bytes, int, int, int, bytearray, Any], tuple[int, bool]]
#: ``bad(buffer, position after the record's length, error, records kept before it)``: the exception
#: to raise for a record that cannot be transformed (onError FAIL_FETCH).
Bad = Callable[[bytes, int, BaseException, int], Exception]

_VALUES: Final = list(range(1 << 13))
#: ``_TWO[x][y]``: half the value of the two-byte varint ``x y`` (``x >= 0x80 > y``): the length it
#: holds (see the framing shortcuts above).
_TWO: Final = [[_VALUES[((x & 0x7F) | (y << 7)) >> 1] for y in range(0x80)] if x & 0x80 else [] for x in range(256)]

_FRAMING: Final = """\
def _batch(b, p, stop, count, out, ctx):
    loads = _loads
    zzt = _ZZT
    zn = _ZZN
    two = _TWO
    kept = 0
    edited = False
    for _ in _repeat(None, count):
        rec = p
        x = b[p]
        if x < 0x80:
            p += 1
            rend = p + (x >> 1)
        else:
            y = b[p + 1]
            if y < 0x80:
                p += 2
                rend = p + two[x][y]
            else:
                n, p = _zz(b, p)
                rend = p + n
        q = p + 1
        if b[q] > 0x7F:
            q += 1
            while b[q] > 0x7F:
                q += 1
        q += 1
        if b[q] > 0x7F:
            q += 1
            while b[q] > 0x7F:
                q += 1
        q += 1
        x = b[q]
        if x < 0x80:
            q += 1 if x & 1 else 1 + (x >> 1)
        else:
            n, q = _zz(b, q)
            if n > 0:
                q += n
        head = q
        x = b[q]
        if x < 0x80:
            q += 1
            vend = q + (x >> 1)
        else:
            y = b[q + 1]
            if y < 0x80:
                q += 2
                vend = q + two[x][y]
            else:
                n, q = _zz(b, q)
                vend = q + n
        try:
            v = loads(b[q:vend]) if x != 1 else None
"""
# The framing above: record length, attributes, timestamp delta, offset delta, key, value length
# (``x == 1``: a null value). Then the statement's code, then the kept record is written:
_KEEP: Final = """\
out += b[rec:rend]
kept += 1
"""
_PROJECT: Final = """\
nv = _dumps({result})
ln = len(nv)
vl = zzt[ln + 1] if ln < zn else _varint(ln)
size = head - p + len(vl) + ln + rend - vend
out += zzt[size + 1] if size < zn else _varint(size)
out += b[p:head]
out += vl
out += nv
out += b[vend:rend]
kept += 1
"""
_TAIL: Final = """\
        except (ValueError, TypeError) as exc:
            {on_error}
        p = rend
    if p != stop:
        raise IndexError("records do not fill the batch")
    return kept, {edited}
"""
_NAMES: Final = {
    "_loads": orjson.loads,
    "_dumps": orjson.dumps,
    "_ZZT": ZIGZAG_TABLE,
    "_ZZN": ZIGZAG_TABLE_SIZE,
    "_TWO": _TWO,
    "_zz": read_zigzag,
    "_varint": zigzag_bytes,
    "_repeat": repeat,
}


def source(view: CompiledView, drop: bool) -> str:
    """The loop's source for ``view`` (which must read the value and no metadata)."""
    body = view.body
    keep = body.result == "KEEP"
    lines = [_FRAMING if keep else _FRAMING.replace("        rec = p\n", "")]
    pad = " " * 12
    lines += [pad + line + "\n" for line in body.setup]
    emit = _KEEP if keep else _PROJECT.format(result=body.result)
    if body.condition is not None:
        lines.append(f"{pad}if {body.condition}:\n")
        pad += "    "
    lines += [pad + line + "\n" for line in body.rest]
    lines += [pad + line + "\n" for line in emit.splitlines()]
    if body.condition is not None and keep:
        lines.append(" " * 12 + "else:\n" + " " * 16 + "edited = True\n")
    # A projection changes every record it sees: the batch is rewritten whenever it has records.
    on_error = ("edited = True" if keep else "pass") if drop else "raise _bad(b, p, exc, kept) from None"
    lines.append(_TAIL.format(on_error=on_error, edited="edited" if keep else "count > 0"))
    return "".join(lines)


_BUILT: dict[tuple[str, bool, Bad], LoopFn | None] = {}
_BUILT_MAX: Final = 1024


def build(view: CompiledView, drop: bool, bad: Bad) -> LoopFn | None:
    """The generated loop of ``view``, or None when it has none (it reads record metadata, or no
    value, or Python cannot compile the loop): the transformer's general loop serves it then.
    Cached per statement (compiling costs about half a millisecond; views are rebuilt as a set)."""
    key = (view.statement, drop, bad)
    if key in _BUILT:
        return _BUILT[key]
    loop = _build(view, drop, bad)
    if len(_BUILT) >= _BUILT_MAX:
        _BUILT.clear()
    _BUILT[key] = loop
    return loop


def _build(view: CompiledView, drop: bool, bad: Bad) -> LoopFn | None:
    if view.needs_meta or not view.needs_value:
        return None
    names = dict(view.body.names)
    if names.keys() & _NAMES.keys() or "_bad" in names:
        return None  # cannot happen with the names the statement's code uses; never shadow them
    names.update(_NAMES, _bad=bad)
    try:
        code = compile(source(view, drop), f"<kanal view loop FROM {view.topic}>", "exec")
    except (SyntaxError, RecursionError, MemoryError):  # Python's limits on nesting
        return None
    exec(code, names)
    loop: LoopFn = names["_batch"]
    return loop
