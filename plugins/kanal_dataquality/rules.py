"""Rules compiled once from their manifests: CEL, JSON schema and the built-in EnforceAvro.

A :class:`CompiledRule` carries what the per-record loop needs: which engine (``mode``), the bound
evaluation function, which parts of the record it reads, and the violation text. The engines
themselves live in :mod:`kanal_dataquality.cel` and :mod:`kanal_dataquality.jsonschema_rule`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from kanal_dataquality.cel import CelCompileError, Outcome, compile_cel
from kanal_dataquality.jsonschema_rule import SchemaCompileError, compile_schema

__all__ = [
    "CEL",
    "ENFORCE_AVRO",
    "ENFORCE_AVRO_MODE",
    "JSON_SCHEMA",
    "CompiledRule",
    "RuleCompileError",
    "compile_rule",
    "default_message",
    "enforce_avro",
]

CEL = "Cel"
JSON_SCHEMA = "JsonSchema"
ENFORCE_AVRO = "EnforceAvro"  # the built-in rule's name (and type)

# Per-record modes, tested in the record loop (an int comparison is cheaper than isinstance).
CEL_MODE = 0
SCHEMA_MODE = 1
ENFORCE_AVRO_MODE = 2

_WORD_KEY = re.compile(r"\bkey\b")
_WORD_HEADERS = re.compile(r"\bheaders\b")
_WORD_VALUE = re.compile(r"\bvalue\b")


class RuleCompileError(ValueError):
    """A rule cannot be compiled: invalid CEL, invalid JSON schema, unknown type."""


def default_message(name: str) -> str:
    """The violation text of a rule without a custom message."""
    return f"{name} did not pass"


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """One rule, ready for the record loop.

    ``evaluate`` is ``(key, value, headers) -> Outcome`` for CEL, ``(value) -> Outcome`` for a JSON
    schema, and unused for EnforceAvro (the decoder computes the schema-id verdict).
    """

    name: str
    type: str
    mode: int
    evaluate: Callable[..., Outcome]
    message: str
    uses_key: bool
    uses_value: bool
    uses_headers: bool
    source: str  # the expression, or the schema as JSON, for tests and the API
    fast: Callable[..., Any] | None = None  # the engine's fastest entry point (see fast_entry)
    header_names: frozenset[str] | None = frozenset()  # headers the rule reads; None: it may read any
    # A generated check the record loop may paste in instead of calling ``fast``: its source
    # (``lambda <params>: <expression>``) and compiled function (see kanal_dataquality.inline).
    inline: tuple[str, Callable[..., Any]] | None = None


def _never(*_: Any) -> Outcome:  # pragma: no cover - EnforceAvro is decided by the decoder
    raise AssertionError("EnforceAvro is evaluated by the decoder")


def enforce_avro(message: str | None = None) -> CompiledRule:
    """The built-in EnforceAvro rule: the value carries a schema id that the registry knows as AVRO."""
    return CompiledRule(
        name=ENFORCE_AVRO,
        type=ENFORCE_AVRO,
        mode=ENFORCE_AVRO_MODE,
        evaluate=_never,
        message=message or default_message(ENFORCE_AVRO),
        uses_key=False,
        uses_value=False,
        uses_headers=False,
        source=ENFORCE_AVRO,
    )


def compile_rule(name: str, spec: Mapping[str, Any]) -> CompiledRule:
    """A rule from the canonical spec of a DataQualityRule; raises RuleCompileError."""
    kind = spec.get("type")
    message = spec.get("message") or default_message(name)
    if kind == CEL:
        expression = spec.get("celExpression")
        if not isinstance(expression, str) or not expression.strip():
            raise RuleCompileError("spec.celExpression is required for a Cel rule")
        try:
            rule = compile_cel(expression)
        except CelCompileError as exc:
            raise RuleCompileError(f"invalid CEL expression: {exc}") from None
        fast = fast_entry(rule)
        return CompiledRule(
            name=name,
            type=CEL,
            mode=CEL_MODE,
            evaluate=rule.evaluate,
            message=message,
            uses_key=bool(_WORD_KEY.search(expression)),
            uses_value=bool(_WORD_VALUE.search(expression)),
            uses_headers=bool(_WORD_HEADERS.search(expression)),
            source=expression,
            fast=fast,
            header_names=header_names(expression),
            inline=(rule.source, fast) if fast is not None and rule.source else None,
        )
    if kind == JSON_SCHEMA:
        schema = spec.get("schema")
        try:
            compiled = compile_schema(schema)  # type: ignore[arg-type]
        except SchemaCompileError as exc:
            raise RuleCompileError(f"invalid JSON schema: {exc}") from None
        return CompiledRule(
            name=name,
            type=JSON_SCHEMA,
            mode=SCHEMA_MODE,
            evaluate=compiled.evaluate,
            message=message,
            uses_key=False,
            uses_value=True,
            uses_headers=False,
            source=orjson.dumps(schema).decode(),
            fast=fast_entry(compiled),
            inline=(compiled.check.source, compiled.check.function) if compiled.check is not None else None,
        )
    raise RuleCompileError(f"spec.type must be {CEL} or {JSON_SCHEMA}, got {kind!r}")


def fast_entry(rule: Any) -> Callable[..., Any] | None:
    """The engine's own fast function behind a compiled rule, or None.

    The rule engines' public API is ``evaluate`` (an ``Outcome``); the record loop wants the call that
    decides a passing record with no wrapper frame: a CEL rule's generated function (``True`` means the
    expression holds; anything else, or an exception, is decided again by ``evaluate``) and a JSON
    schema's ``is_valid``. Neither engine exposes it publicly yet, so it is read here, defensively: when
    the attribute is missing, the loop calls ``evaluate`` and compares with ``PASSED``.
    """
    candidate = getattr(rule, "_fast", None) if hasattr(rule, "expression") else getattr(rule, "_is_valid", None)
    return candidate if callable(candidate) else None


_LITERAL = r"""(?:'([^'\\\n]*)'|"([^"\\\n]*)")"""
_INDEX = re.compile(r"\s*\[\s*" + _LITERAL + r"\s*\]")
_SELECT = re.compile(r"\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)\b(?!\s*\()")
_IN = re.compile(_LITERAL + r"\s+in\s+$")


def header_names(expression: str) -> frozenset[str] | None:
    """The header names an expression reads, when it reads them only by literal name.

    ``headers['a-b']``, ``headers["a"]``, ``headers.a`` / ``has(headers.a)`` and ``'a' in headers`` name
    their header; any other use of ``headers`` (a method, a comprehension, a computed key, the word in
    a string) gives None: the record loop then builds the whole map. Only the named headers are decoded
    otherwise, which is exact for these forms (a header that is absent is absent either way).
    """
    names: set[str] = set()
    for match in _WORD_HEADERS.finditer(expression):
        after = expression[match.end() :]
        before = expression[: match.start()]
        found = _INDEX.match(after) or _SELECT.match(after)
        if found is not None:
            names.add(next(g for g in found.groups() if g is not None))
            continue
        found = _IN.search(before)
        if found is not None:
            names.add(next(g for g in found.groups() if g is not None))
            continue
        return None
    return frozenset(names)
