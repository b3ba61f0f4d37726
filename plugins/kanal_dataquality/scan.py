"""The hot path: a record loop generated per plan, reading values straight from a batch's bytes.

For the common case (payloads without schema ids, batches no earlier interceptor changed), the loop
reads the batch's records area itself (``RecordBatch.to_bytes()``, decompressed with the gateway's own
codecs when needed) and creates no ``Record`` objects. The records are walked by the core's compiled
record walk, in one call per batch (walking records in Python costs as much as decoding their
values): when the rules read only the value, the values come decoded (``kanal.api.record_values``);
when a CEL rule mentions the key or headers, the loop gets where each record's parts are
(``kanal.api.record_spans``) and slices out only the parts the rules read. It runs each rule's
fastest check, and the public ``evaluate`` only for a record some check did not pass, to get the
outcome. Records are decoded by the gateway's codec (``batch.records()``) only for batches that
need marking, so a batch whose records all pass is forwarded as its original bytes.

What the generated loop does per record (``rules`` = the plan's rules in order)::

    key = <the key's bytes, decoded>            # when a rule reads it, from the record's span
    value = orjson.loads(value bytes)           # text or bytes when not JSON; None for a null value
    headers = <the header section>              # when a rule reads headers: only the names it reads
    try:
        if <rule 0's CEL expression> is True and <rule 1's schema check>: continue   # every rule passed
    except Exception: pass                       # a CEL error or a value the fast path does not model
    o0 = rule0.evaluate(key, value, headers); o1 = rule1.evaluate(value)     # the exact outcomes
    if o0 is PASSED and o1 is PASSED: continue
    if failed(index, (o0, o1)): return True      # the plan's slow path; True when the batch is blocked

The checks: a CEL rule's generated expression (True, False, or an exception where CEL semantics need
the reference evaluator) and a JSON schema's generated check (True only for a conforming value, see
:mod:`kanal_dataquality.jsonschema_fast`), both pasted into the loop (:mod:`kanal_dataquality.inline`)
so that a passing record costs no call; a rule whose check cannot be pasted is called (the CEL
function, jsonschema-rs ``is_valid``). A record no check clearly passes goes through ``evaluate``, so
the outcomes are the engines' own.

The walk reads what the gateway's codec reads, or gives up: a record whose length prefix disagrees with
its fields, records that do not fill the batch, or a header section the loop reads that does not fill
its record raise ``ValueError``, and the caller hands the batch to the codec.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from kanal.api import encode_varint, record_headers, record_spans, record_values
from kanal_dataquality.cel import PASSED, Outcome
from kanal_dataquality.evaluate import NO_SCHEMA_ID, decode_key, text_or_bytes
from kanal_dataquality.inline import inline
from kanal_dataquality.policies import Plan
from kanal_dataquality.rules import CEL_MODE, SCHEMA_MODE, CompiledRule

__all__ = ["Checker", "Failed", "Scanner", "compile_checker", "compile_scanner"]

Failed = Callable[[int, tuple[Outcome, ...]], bool]
#: ``scan(b, p, first, stop, failed, end)``: records ``first`` to ``stop`` (indexes in the batch) start at
#: ``b[p]`` and end at ``end``; True when ``failed`` blocked the batch.
Scanner = Callable[[bytes, int, int, int, Failed, int], bool]
#: ``check(b, p, count, end)``: the index of each record the checks did not clearly pass, of ``count``
#: records from ``b[p]`` to ``end``.
Checker = Callable[[bytes, int, int, int], list[int]]

_EMPTY: dict[str, str] = {}


def _headers(b: bytes, p: int, end: int) -> dict[str, str]:
    """The header section ``b[p:end]`` as CEL's map of name to text (the last value wins)."""
    return {
        name.decode("utf-8", "surrogateescape"): "" if value is None else value.decode("utf-8", "replace")
        for name, value in record_headers(b, p, end)
    }


def _named_headers(b: bytes, p: int, end: int, wanted: dict[bytes, str]) -> dict[str, str]:
    """Like :func:`_headers`, with only the ``wanted`` names decoded (the rules read no other)."""
    out: dict[str, str] = {}
    for raw, value in record_headers(b, p, end):
        name = wanted.get(raw)
        if name is not None:
            out[name] = "" if value is None else value.decode("utf-8", "replace")
    return out


def _one_header(b: bytes, p: int, end: int, raw: bytes, name: str) -> dict[str, str]:
    """:func:`_named_headers` for one name."""
    return _named_headers(b, p, end, {raw: name})


# The loop of rules reading the key or headers: each record's span from the record walk (see
# ``kanal.api.RecordSpan``): where it ends, its key (``ks``: -1 when null), value (``vs``: -1 when null)
# and header section (from ``ve``, ``hc`` headers). The walk checked that they fill the record.
_SPANS = """\
    for index, (_, _, rend, _, _, _, ks, ke, vs, ve, hc) in enumerate(spans(b, p, {count}, end), {first}):"""

_KEY_READ = """\
        key = decode_key(b[ks:ke]) if ks >= 0 else None
"""

_VALUE_READ = """\
        if vs < 0:
            value = None
        else:
            try:
                value = loads(b[vs:ve])
            except JSONDecodeError:
                value = text_or_bytes(b[vs:ve])
"""

# The loop of rules reading the value only: the values decoded by the record walk in one call.
_VALUES = """\
    for index, value in enumerate(values(b, p, {count}, end, loads, JSONDecodeError, text_or_bytes), {first}):"""

# The header section when a rule reads headers, read by ``{read}`` (it starts at ``ve``).
_HEADERS_READ = """\
        if hc == 0:
            headers = EMPTY
        else:
{read}
"""

# One header name: ``W`` is how it is written (its length varint, then its bytes); the first header's
# name, when it is that one, ends at index ``WL`` of the section, its value starts at ``WV``. Those bytes
# absent from the section: no such header. Present once, as the first header (after a positive one-byte
# count) with a value of at most 63 bytes of valid UTF-8: that header, and no later one of that name.
# Anything else: the headers are read. The headers not read are not parsed (nor does the codec parse
# a record's headers before they are read).
_HEADERS_ONE = """\
            hs = b[ve:rend]
            k = hs.count(W)
            if k == 0:
                headers = EMPTY
            else:
                x = hs[0]
                headers = None
                if k == 1 and x < 0x80 and not x & 1 and hs[1:WL] == W:
                    x = hs[WL]
                    if x < 0x80 and not x & 1:
                        q = WV + (x >> 1)
                        if q <= len(hs):
                            try:
                                headers = {NAME_ONE: hs[WV:q].decode()}
                            except UnicodeDecodeError:
                                pass
                if headers is None:
                    headers = one_header_at(b, ve, rend, RAW_ONE, NAME_ONE)"""


def compile_scanner(plan: Plan) -> Scanner:
    """The record loop of one plan (EnforceAvro excluded: schema ids go through the registry path).

    The rules' checks are pasted in; should the loop not compile with them (an expression nested too
    deep for the parser once inside the loop), they are called instead.
    """
    scan: Scanner = _compile(plan, checker=False)
    return scan


def compile_checker(plan: Plan) -> Checker:
    """The record loop of one plan without the exact path: it lists the records no check clearly
    passed, for :func:`compile_scanner`'s loop to decide (the helper process's part of a batch)."""
    check: Checker = _compile(plan, checker=True)
    return check


def _compile(plan: Plan, checker: bool) -> Any:
    try:
        return _build(plan, paste=True, checker=checker)
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        return _build(plan, paste=False, checker=checker)


def _build(plan: Plan, paste: bool, checker: bool) -> Any:
    name = "check" if checker else "scan"
    if checker:
        lines = ["def check(b, p, count, end):", "    out = []", "    key = None", "    headers = EMPTY"]
    else:
        lines = ["def scan(b, p, first, stop, failed, end):", "    key = None", "    headers = EMPTY"]
    namespace: dict[str, Any] = {
        "values": record_values,
        "loads": orjson.loads,
        "JSONDecodeError": orjson.JSONDecodeError,
        "text_or_bytes": text_or_bytes,
        "EMPTY": _EMPTY,
        "PASSED": PASSED,
        "NO_ID": Outcome(False, NO_SCHEMA_ID),
    }
    count, first = ("count", "0") if checker else ("stop - first", "first")
    if plan.uses_key or plan.uses_headers or not plan.uses_value:
        lines.append(_SPANS.replace("{count}", count).replace("{first}", first))
        lines += _parts(plan, namespace)
    else:
        lines.append(_VALUES.replace("{count}", count).replace("{first}", first))
    fast_terms = []
    exact = []
    names = []
    for i, (rule, (mode, evaluate)) in enumerate(zip(plan.rules, plan.calls, strict=True)):
        names.append(f"o{i}")
        namespace[f"f{i}"] = evaluate
        if mode == CEL_MODE:
            exact.append(f"        o{i} = f{i}(key, value, headers)")
            fast_terms.append(_check(rule, ("key", "value", "headers"), i, namespace, "is True", paste))
        elif mode == SCHEMA_MODE:
            exact.append(f"        o{i} = f{i}(value)")
            fast_terms.append(_check(rule, ("value",), i, namespace, "", paste))
        else:
            exact.append(f"        o{i} = NO_ID")
            fast_terms.append("False")
    lines += [
        "        try:",
        "            if " + " and ".join(fast_terms) + ":",
        "                continue",
        "        except Exception:",
        "            pass",
    ]
    if checker:
        lines.append("        out.append(index)")
    else:
        lines += [
            *exact,
            "        if " + " and ".join(f"{n} is PASSED" for n in names) + ":",
            "            continue",
            f"        if failed(index, ({', '.join(names)},)):",
            "            return True",
        ]
    lines.append("    return out" if checker else "    return False")
    source = "\n".join(line.rstrip("\n") for line in lines)
    exec(compile(source, f"<data-quality {name}, {len(plan.rules)} rules>", "exec"), namespace)
    return namespace[name]


def _parts(plan: Plan, namespace: dict[str, Any]) -> list[str]:
    """The reading of the parts of a record the rules read (key, value, headers) from its span, and the
    names it uses."""
    lines = [_KEY_READ] if plan.uses_key else []
    lines.append(_VALUE_READ if plan.uses_value else "        value = None\n")
    wanted = {name.encode("utf-8", "surrogateescape"): name for name in plan.header_names or ()}
    one = next((encode_varint(len(raw)) + raw for raw in wanted), b"")
    if plan.uses_headers:
        if plan.header_names is None:
            read = "            headers = headers_at(b, ve, rend)"
        elif len(wanted) == 1:
            read = _HEADERS_ONE
        else:
            read = "            headers = named_headers_at(b, ve, rend, WANTED)"
        lines.append(_HEADERS_READ.replace("{read}", read))
    namespace.update(
        spans=record_spans,
        decode_key=decode_key,
        headers_at=_headers,
        named_headers_at=_named_headers,
        one_header_at=_one_header,
        WANTED=wanted,
        W=one,
        WL=len(one) + 1,
        WV=len(one) + 2,
        RAW_ONE=next(iter(wanted), b""),
        NAME_ONE=next(iter(wanted.values()), ""),
    )
    return lines


def _check(
    rule: CompiledRule, params: tuple[str, ...], i: int, namespace: dict[str, Any], test: str, paste: bool
) -> str:
    """The loop's test that rule ``i`` passes: its check pasted in, else a call (else ``evaluate``)."""
    args = ", ".join(params)
    if paste and rule.inline is not None:
        pasted = inline(*rule.inline, params, f"_r{i}")
        if pasted is not None:
            expression, names = pasted
            namespace.update(names)
            return f"{expression} {test}".rstrip()
    fast = rule.fast
    if fast is None:
        return f"f{i}({args}) is PASSED"
    namespace[f"fast{i}"] = fast
    return f"fast{i}({args}) {test}".rstrip()
