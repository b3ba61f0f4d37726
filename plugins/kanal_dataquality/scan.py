"""The hot path: a record loop generated per plan, reading values straight from a batch's bytes.

For the common case (payloads without schema ids, batches no earlier interceptor changed), the loop
walks the batch's records area itself (``RecordBatch.to_bytes()``, decompressed with the gateway's own
codecs when needed), slicing out only the parts the rules read (the value; the key and the headers
when a CEL rule mentions them), and creates no ``Record`` objects. It calls each rule's fastest entry
point, and the public ``evaluate`` only for a record some rule did not pass, to get the outcome.
Records are decoded by the gateway's codec (``batch.records()``) only for batches that need marking,
so a batch whose records all pass is forwarded as its original bytes.

What the generated loop does per record (``rules`` = the plan's rules in order)::

    <walk the record: length, attributes, timestamp and offset deltas skipped, key, value, headers>
    value = orjson.loads(value bytes)           # text or bytes when not JSON; None for a null value
    try:
        if fast0(key, value, headers) is True and valid1(value): continue   # every rule passed
    except Exception: pass                       # a CEL error or a value the fast path does not model
    o0 = rule0.evaluate(key, value, headers); o1 = rule1.evaluate(value)     # the exact outcomes
    if o0 is PASSED and o1 is PASSED: continue
    if failed(index, (o0, o1)): return            # the plan's slow path; True when the batch is blocked

Fast entry points (see :func:`kanal_dataquality.rules.fast_entry`): a CEL rule's generated function
(True/False, or an exception where CEL semantics need the reference evaluator) and a JSON schema's
``is_valid``. A record the fast path does not clearly pass goes through ``evaluate``, so the outcomes
are the engines' own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from kanal.protocol.records import HEADER_SIZE, NONE, RecordBatch, decompress, read_zigzag
from kanal_dataquality.cel import PASSED, Outcome
from kanal_dataquality.evaluate import NO_SCHEMA_ID, decode_key
from kanal_dataquality.policies import Plan
from kanal_dataquality.rules import CEL_MODE, SCHEMA_MODE

__all__ = ["Failed", "Scanner", "compile_scanner", "records_area"]

Failed = Callable[[int, tuple[Outcome, ...]], bool]
Scanner = Callable[[bytes, int, int, Failed], bool]

_EMPTY: dict[str, str] = {}


def records_area(batch: RecordBatch) -> tuple[bytes, int]:
    """(bytes, start) of a batch's records, decompressed."""
    data = batch.to_bytes()
    codec = batch.compression
    if codec == NONE:
        return data, HEADER_SIZE
    return decompress(codec, memoryview(data)[HEADER_SIZE:]), 0


_zz = read_zigzag


def _headers(b: bytes, p: int) -> dict[str, str]:
    """The header section at ``b[p]`` as CEL's map of name to text (the last value wins)."""
    x = b[p]
    if x < 0x80:
        count = (x >> 1) ^ -(x & 1)
        p += 1
    else:
        count, p = _zz(b, p)
    out: dict[str, str] = {}
    for _ in range(count):
        x = b[p]
        if x < 0x80:
            n = (x >> 1) ^ -(x & 1)
            p += 1
        else:
            n, p = _zz(b, p)
        name = b[p : p + n].decode("utf-8", "surrogateescape")
        p += n
        x = b[p]
        if x < 0x80:
            n = (x >> 1) ^ -(x & 1)
            p += 1
        else:
            n, p = _zz(b, p)
        if n < 0:
            out[name] = ""
        else:
            out[name] = b[p : p + n].decode("utf-8", "replace")
            p += n
    return out


def _named_headers(b: bytes, p: int, wanted: dict[bytes, str], lengths: frozenset[int]) -> dict[str, str]:
    """Like :func:`_headers`, with only the ``wanted`` names decoded (the rules read no other)."""
    x = b[p]
    if x < 0x80:
        count = (x >> 1) ^ -(x & 1)
        p += 1
    else:
        count, p = _zz(b, p)
    out: dict[str, str] = {}
    for _ in range(count):
        x = b[p]
        if x < 0x80:
            n = (x >> 1) ^ -(x & 1)
            p += 1
        else:
            n, p = _zz(b, p)
        name = wanted.get(b[p : p + n]) if n in lengths else None
        p += n
        x = b[p]
        if x < 0x80:
            n = (x >> 1) ^ -(x & 1)
            p += 1
        else:
            n, p = _zz(b, p)
        if n < 0:
            if name is not None:
                out[name] = ""
        else:
            if name is not None:
                out[name] = b[p : p + n].decode("utf-8", "replace")
            p += n
    return out


def _text_or_bytes(raw: bytes) -> Any:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return bytes(raw)


# The record walk, inlined: record length (-> rend), attributes (1 byte), timestamp delta and offset
# delta (varints, skipped), key length + key (a null key is the single byte 1), value length; the value
# and the headers follow.
_WALK = """\
        x = b[p]
        if x < 0x80:
            rend = p + 1 + ((x >> 1) ^ -(x & 1))
            p += 2
        elif b[p + 1] < 0x80:
            n = (x & 0x7F) | (b[p + 1] << 7)
            rend = p + 2 + ((n >> 1) ^ -(n & 1))
            p += 3
        else:
            n, p = zz(b, p)
            rend = p + n
            p += 1
        if b[p] < 0x80 and b[p + 1] < 0x80:
            p += 2
        else:
            while b[p] & 0x80:
                p += 1
            p += 1
            while b[p] & 0x80:
                p += 1
            p += 1
        if b[p] == 1:
            kraw = None
            p += 1
        else:
            n, p = zz(b, p)
            if n < 0:
                kraw = None
            else:
                kraw = b[p : p + n]
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
"""


def compile_scanner(plan: Plan) -> Scanner:
    """The record loop of one plan (EnforceAvro excluded: schema ids go through the registry path)."""
    lines = ["def scan(b, p, count, failed):", "    for index in range(count):", _WALK.rstrip("\n")]
    if plan.uses_value:
        lines += [
            "        if n < 0:",
            "            value = None",
            "        else:",
            "            raw = b[p : p + n]",
            "            p += n",
            "            try:",
            "                value = loads(raw)",
            "            except JSONDecodeError:",
            "                value = text_or_bytes(raw)",
        ]
    else:
        lines += ["        value = None", "        if n > 0:", "            p += n"]
    lines.append("        key = decode_key(kraw)" if plan.uses_key else "        key = None")
    if not plan.uses_headers:
        lines.append("        headers = EMPTY")
    elif plan.header_names is None:
        lines.append("        headers = headers_at(b, p)")
    else:
        lines.append("        headers = named_headers_at(b, p, WANTED, LENGTHS)")
    lines.append("        p = rend")
    namespace: dict[str, Any] = {
        "zz": _zz,
        "loads": orjson.loads,
        "JSONDecodeError": orjson.JSONDecodeError,
        "text_or_bytes": _text_or_bytes,
        "decode_key": decode_key,
        "headers_at": _headers,
        "named_headers_at": _named_headers,
        "WANTED": {name.encode("utf-8", "surrogateescape"): name for name in plan.header_names or ()},
        "LENGTHS": frozenset(len(name.encode("utf-8", "surrogateescape")) for name in plan.header_names or ()),
        "EMPTY": _EMPTY,
        "PASSED": PASSED,
        "NO_ID": Outcome(False, NO_SCHEMA_ID),
    }
    fast_terms = []
    exact = []
    names = []
    for i, (rule, (mode, evaluate)) in enumerate(zip(plan.rules, plan.calls, strict=True)):
        names.append(f"o{i}")
        namespace[f"f{i}"] = evaluate
        entry = rule.fast
        if mode == CEL_MODE:
            exact.append(f"        o{i} = f{i}(key, value, headers)")
            if entry is not None:
                namespace[f"fast{i}"] = entry
                fast_terms.append(f"fast{i}(key, value, headers) is True")
            else:
                fast_terms.append(f"f{i}(key, value, headers) is PASSED")
        elif mode == SCHEMA_MODE:
            exact.append(f"        o{i} = f{i}(value)")
            if entry is not None:
                namespace[f"fast{i}"] = entry
                fast_terms.append(f"fast{i}(value)")
            else:
                fast_terms.append(f"f{i}(value) is PASSED")
        else:
            exact.append(f"        o{i} = NO_ID")
            fast_terms.append("False")
    lines += [
        "        try:",
        "            if " + " and ".join(fast_terms) + ":",
        "                continue",
        "        except Exception:",
        "            pass",
        *exact,
        "        if " + " and ".join(f"{n} is PASSED" for n in names) + ":",
        "            continue",
        f"        if failed(index, ({', '.join(names)},)):",
        "            return True",
        "    return False",
    ]
    exec(compile("\n".join(lines), f"<data-quality scan, {len(plan.rules)} rules>", "exec"), namespace)
    scan: Scanner = namespace["scan"]
    return scan
