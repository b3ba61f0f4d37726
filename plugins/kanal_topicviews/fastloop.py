"""The record loop of a JSON view, generated once per view with the view's statement inlined.

Most views read JSON values and no record metadata. For them the transformer runs one generated
function per batch, which walks the records, parses each value, runs the statement's code in place
and writes the kept records. Why generated: with a call of ``_view`` per record, the call and the
dispatch on its result cost about as much as the statement itself; inlined, the code also knows
statically whether the view projects or keeps (``SELECT *``). The records are walked by the core's
record walk (``kanal.api.record_spans``, compiled): one call per batch gives where each record's
value and bytes are, which is quicker than reading the framing in Python (``bench/topicviews_micro.py``).

The loop does exactly what the transformer's general loop does for these views (the tests compare
the two on generated batches): a null value reaches the statement as None, which refuses it; a kept
record is written from the original bytes with its new value (``kanal.api.write_record``;
``SELECT *``: its original bytes), straight into the batch's ``bytearray``, so that orjson's output
is freed at once (keeping one output object per record alive costs more than the whole loop); a
value that is not JSON or not an object is dropped (onError DROP) or raised through ``bad``
(FAIL_FETCH).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import orjson

from kanal.api import record_spans, write_record

from .sql import CompiledView

__all__ = ["Bad", "LoopFn", "build"]

#: ``loop(buffer, start, stop, count, out, ctx) -> (kept, edited)``: the records of one batch, from
#: ``start`` to ``stop``, kept ones appended to ``out``. Raises ValueError for a malformed batch (the
#: record walk's answer).
LoopFn = Callable[[bytes, int, int, int, bytearray, Any], tuple[int, bool]]
#: ``bad(offset delta, error, records kept before it)``: the exception to raise for a record that
#: cannot be transformed (onError FAIL_FETCH).
Bad = Callable[[int, BaseException, int], Exception]

_FRAMING: Final = """\
def _batch(b, p, stop, count, out, ctx):
    loads = _loads
    write = _write
    kept = 0
    edited = False
    for s in _spans(b, p, count, stop):
        i = s[8]
        try:
            v = loads(b[i:s[9]]) if i >= 0 else None
"""
# The walk gives each record's span (``kanal.api.RecordSpan``): ``s[8]`` is where the value starts
# (-1: a null value), ``s[9]`` where it ends. Then the statement's code, then the kept record is written:
_KEEP: Final = """\
out += b[s[0]:s[2]]
kept += 1
"""
_PROJECT: Final = """\
write(out, b, s, _dumps({result}))
kept += 1
"""
_TAIL: Final = """\
        except (ValueError, TypeError) as exc:
            {on_error}
    return kept, {edited}
"""
_NAMES: Final = {
    "_loads": orjson.loads,
    "_dumps": orjson.dumps,
    "_spans": record_spans,
    "_write": write_record,
}


def source(view: CompiledView, drop: bool) -> str:
    """The loop's source for ``view`` (which must read the value and no metadata)."""
    body = view.body
    keep = body.result == "KEEP"
    lines = [_FRAMING]
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
    on_error = ("edited = True" if keep else "pass") if drop else "raise _bad(s[5], exc, kept) from None"
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
