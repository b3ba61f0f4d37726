"""The per-record work: decode a record once, run every rule of a plan on it, decide per policy.

Decoding (once per record, shared by every rule and policy):

* ``value``: with a schema id (payload prefix or ``__value_schema_id`` header) and a registry, the
  Avro body converted to JSON (see :mod:`kanal_dataquality.avro`); otherwise the payload parsed as
  JSON (orjson); a payload that is not JSON is given as text (UTF-8), and one that is not text as
  bytes. A null value (tombstone) is ``null``.
* ``key``: Avro as for the value (``__key_schema_id``); otherwise JSON when it looks like a JSON
  object, array or string (starts with ``{``, ``[`` or ``"``), else text, else bytes. So a key
  ``order-1`` or ``42`` is the string ``"order-1"`` or ``"42"``.
* ``headers``: a map of name to UTF-8 text (the last value of a repeated header wins), built only
  when a CEL rule mentions ``headers``.

Everything here is plain, synchronous Python, called once per partition batch by the interceptor
(or by the observer for clusters without a gateway). Schema lookups are done before, by the caller
(:func:`schema_refs` lists what a batch needs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from kanal_schemas import AVRO, KEY_HEADER, VALUE_HEADER, SchemaRef, describe_ref, header_ref, prefix_ref

from kanal.api import Record, RecordBatch
from kanal_dataquality.avro import SchemaRegistry
from kanal_dataquality.cel import PASSED, Outcome, headers_map
from kanal_dataquality.policies import Plan

__all__ = [
    "NO_SCHEMA_ID",
    "BatchResult",
    "Violation",
    "decode_key",
    "decode_value",
    "evaluate",
    "fast_headers",
    "schema_refs",
    "text_or_bytes",
]

NO_SCHEMA_ID = (
    "no schema id: the value neither starts with a schema id (magic byte 0 and a 4-byte id) nor carries a "
    f"{VALUE_HEADER} header"
)
NO_REGISTRY = "no schema registry is configured on the gateway (DATA_QUALITY_SCHEMA_REGISTRY_URL)"

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError
_EMPTY: dict[str, str] = {}
_JSON_START = frozenset(b'{["')


def decode_value(raw: bytes | None) -> Any:
    """A payload without a schema id: JSON, else text, else bytes."""
    if raw is None:
        return None
    try:
        return _loads(raw)
    except _JSONDecodeError:
        return text_or_bytes(raw)


def text_or_bytes(raw: bytes) -> Any:
    """A payload that is not JSON: its text, else its bytes."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return bytes(raw)


def decode_key(raw: bytes | None) -> Any:
    """A key without a schema id: JSON when it looks like an object, array or string, else text."""
    if raw is None:
        return None
    if raw and raw[0] in _JSON_START:
        try:
            return _loads(raw)
        except _JSONDecodeError:
            pass
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return bytes(raw)


@dataclass(slots=True)
class Violation:
    """One record breaking one policy: the failed rules (indexes into the plan's rules) and their outcomes.

    ``index`` is the record's position among the partition's records; ``record`` and ``batch`` are set
    when the record was decoded (always when a marking policy needs it).
    """

    policy: int
    record: Record | None
    rules: tuple[int, ...]
    outcomes: tuple[Outcome, ...]
    index: int = 0
    batch: RecordBatch | None = None


@dataclass(slots=True)
class BatchResult:
    """``blocked``: the violation that blocks the batch (nothing else is counted). Otherwise every
    policy evaluated ``evaluated`` records and ``violations`` lists each (record, policy) that failed."""

    evaluated: int
    blocked: Violation | None
    violations: list[Violation]


# -- schema ids -----------------------------------------------------------------------------------


def _ref(record: Record, header: str, raw: bytes | None) -> tuple[SchemaRef | None, bytes | None]:
    """(schema reference, body) of a key or value: the header wins over a payload prefix."""
    ref: SchemaRef | None = None
    if record.headers:
        for name, value in record.headers:
            if name == header:
                ref = header_ref(value)
        if ref is not None:
            return ref, raw
    ref = prefix_ref(raw)
    if ref is not None:
        return ref, raw[5:] if raw is not None else None
    return None, raw


def schema_refs(plan: Plan, records: Sequence[Record], avro_keys: bool) -> list[tuple[Any, Any]]:
    """Per record, ((value ref, value body), (key ref, key body) or None): what the registry must know."""
    out: list[tuple[Any, Any]] = []
    append = out.append
    for r in records:
        value_ref = _ref(r, VALUE_HEADER, r.value)
        key_ref = _ref(r, KEY_HEADER, r.key) if avro_keys else None
        append((value_ref, key_ref))
    return out


def needed(refs: Sequence[tuple[Any, Any]]) -> set[SchemaRef]:
    wanted: set[SchemaRef] = set()
    for value_ref, key_ref in refs:
        if value_ref[0] is not None:
            wanted.add(value_ref[0])
        if key_ref is not None and key_ref[0] is not None:
            wanted.add(key_ref[0])
    return wanted


def _with_schema(
    ref: SchemaRef | None, body: bytes | None, registry: SchemaRegistry | None, decode: bool
) -> tuple[Any, str | None]:
    """(decoded value, EnforceAvro verdict: None when it passes, else the reason)."""
    if ref is None:
        return (decode_value(body) if decode else None), NO_SCHEMA_ID
    if registry is None:
        return (decode_value(body) if decode else None), NO_REGISTRY
    info = registry.cached(ref)
    if info is None:
        return (
            decode_value(body) if decode else None
        ), f"schema registry unreachable: {describe_ref(ref)} not resolved"
    if info.error is not None:
        return (decode_value(body) if decode else None), info.error
    if info.schema_type != AVRO:
        return (decode_value(body) if decode else None), f"{describe_ref(ref)} is a {info.schema_type} schema, not AVRO"
    if not decode or body is None:
        return None, None
    if info.decode is None:
        return bytes(body), None
    try:
        return info.decode(body), None
    except Exception:
        return bytes(body), None


# -- the loop ---------------------------------------------------------------------------------------


def evaluate(
    plan: Plan,
    records: Sequence[Record],
    registry: SchemaRegistry | None = None,
    refs: Sequence[tuple[Any, Any]] | None = None,
) -> BatchResult:
    """Runs a plan on the records of one batch (``refs`` from :func:`schema_refs` when the plan uses
    schema ids). Stops at the first record that breaks a blocking policy."""
    if refs is None and plan.enforce_avro:
        refs = schema_refs(plan, records, False)  # EnforceAvro never passes without its verdict
    calls = plan.calls
    policy_rules = plan.policy_rules
    blockers = plan.blockers
    uses_key = plan.uses_key
    uses_headers = plan.uses_headers
    uses_value = plan.uses_value
    violations: list[Violation] = []
    key: Any = None
    headers: Any = _EMPTY
    avro: str | None = None
    ranged = range(len(calls))
    for n, record in enumerate(records):
        if refs is None:
            value = decode_value(record.value) if uses_value else None
            if uses_key:
                key = decode_key(record.key)
        else:
            (value_ref, value_body), key_ref = refs[n]
            value, avro = _with_schema(value_ref, value_body, registry, uses_value)
            if uses_key:
                if key_ref is not None and key_ref[0] is not None:
                    key = _with_schema(key_ref[0], key_ref[1], registry, True)[0]
                else:
                    key = decode_key(record.key)
        if uses_headers:
            headers = headers_map(record.headers)
        failed: dict[int, Outcome] | None = None
        for i in ranged:
            mode, fn = calls[i]
            if mode == 0:
                outcome = fn(key, value, headers)
            elif mode == 1:
                outcome = fn(value)
            else:
                outcome = PASSED if avro is None else Outcome(False, avro)
            if outcome is not PASSED and not outcome[0]:
                if failed is None:
                    failed = {}
                failed[i] = outcome
        if failed is None:
            continue
        for p in blockers:
            broken = tuple(i for i in policy_rules[p] if i in failed)
            if broken:
                return BatchResult(0, Violation(p, record, broken, tuple(failed[i] for i in broken), n), [])
        for p, indexes in enumerate(policy_rules):
            broken = tuple(i for i in indexes if i in failed)
            if broken:
                violations.append(Violation(p, record, broken, tuple(failed[i] for i in broken), n))
    return BatchResult(len(records), None, violations)


def fast_headers(headers: Sequence[tuple[str, bytes | None]]) -> dict[str, str]:
    """``headers_map`` for the common case (every value present and UTF-8), falling back to it."""
    try:
        return {k: v.decode() for k, v in headers}  # type: ignore[union-attr]
    except (AttributeError, UnicodeDecodeError):
        return headers_map(headers)
