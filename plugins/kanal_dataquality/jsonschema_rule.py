"""JSON schema rules: compile a schema once, validate each record's value.

    rule = compile_schema({"type": "object", "required": ["id"]})   # SchemaCompileError if invalid
    outcome = rule.evaluate(value)                                   # Outcome(passed, error)

Drafts. Without ``$schema`` the schema is draft 2020-12 (spec). A declared ``$schema`` selects its draft:
draft-04, draft-06, draft-07, 2019-09 or 2020-12 (``http``/``https`` and a trailing ``#`` do not matter).
Any other ``$schema`` (draft-03 included) is a compile error.

Compile time. The schema is checked against its draft's meta-schema with ``jsonschema`` (``check_schema``),
then built with jsonschema-rs, which also resolves every ``$ref``. References are resolved inside the
schema only: the gateway never fetches a remote schema, so a remote ``$ref`` is a compile error.

Per record. jsonschema-rs ``is_valid`` (about 0.5 µs); on failure, the reason is the first error that
jsonschema-rs reports, with the JSON path of the offending value: ``$.customer.tier: 1 is not of type
"string"``. A value that is not JSON (bytes, datetime, a map with non-string keys) fails with a reason.
``jsonschema`` is the test oracle, and the per-record engine only when jsonschema-rs is not installed.

Formats. As the JSON Schema specification says for each draft: in 2019-09 and 2020-12 ``format`` is an
annotation and is not checked; in draft-04, -06 and -07 the formats the engine knows are checked (jsonschema-rs
knows all of the draft's formats; ``jsonschema`` as a fallback checks only those whose optional libraries
are installed).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jsonschema
import jsonschema.exceptions

from kanal_dataquality.cel import PASSED, Outcome
from kanal_dataquality.jsonschema_fast import SchemaCheck, generate_check

jsonschema_rs: Any
try:
    import jsonschema_rs
except ImportError:  # the per-record engine falls back to jsonschema
    jsonschema_rs = None

__all__ = ["DRAFTS", "SchemaCompileError", "SchemaRule", "compile_schema", "draft_of"]

# Draft name -> (canonical $schema URI, jsonschema class, jsonschema-rs class name, formats asserted).
DRAFTS: dict[str, tuple[str, Any, str, bool]] = {
    "draft-04": ("http://json-schema.org/draft-04/schema#", jsonschema.Draft4Validator, "Draft4Validator", True),
    "draft-06": ("http://json-schema.org/draft-06/schema#", jsonschema.Draft6Validator, "Draft6Validator", True),
    "draft-07": ("http://json-schema.org/draft-07/schema#", jsonschema.Draft7Validator, "Draft7Validator", True),
    "2019-09": (
        "https://json-schema.org/draft/2019-09/schema",
        jsonschema.Draft201909Validator,
        "Draft201909Validator",
        False,
    ),
    "2020-12": (
        "https://json-schema.org/draft/2020-12/schema",
        jsonschema.Draft202012Validator,
        "Draft202012Validator",
        False,
    ),
}
DEFAULT_DRAFT = "2020-12"

_URI_TO_DRAFT = {uri.split("://", 1)[1].rstrip("#"): name for name, (uri, _cls, _rs, _fmt) in DRAFTS.items()}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_REASON = 300


class SchemaCompileError(ValueError):
    """The schema is not a valid JSON schema, or cannot be used by the gateway."""


def draft_of(schema: Mapping[str, Any] | bool) -> str:
    """The draft that applies to ``schema``: its declared ``$schema``, else 2020-12."""
    if not isinstance(schema, Mapping) or "$schema" not in schema:
        return DEFAULT_DRAFT
    declared = schema["$schema"]
    if not isinstance(declared, str):
        raise SchemaCompileError("$schema must be a string (a meta-schema URI)")
    key = declared.strip().split("://", 1)[-1].rstrip("#")
    if key in _URI_TO_DRAFT:
        return _URI_TO_DRAFT[key]
    if "draft-03" in key:
        raise SchemaCompileError("draft-03 schemas are not supported: use draft-04 or later")
    known = ", ".join(uri for uri, _c, _r, _f in DRAFTS.values())
    raise SchemaCompileError(f"unknown $schema {declared!r}: the supported meta-schemas are {known}")


def json_path(path: Any) -> str:
    """``['customer', 'tier', 0]`` -> ``$.customer.tier[0]``."""
    out = ["$"]
    for part in path:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif _IDENTIFIER.fullmatch(str(part)):
            out.append(f".{part}")
        else:
            escaped = str(part).replace("\\", "\\\\").replace("'", "\\'")
            out.append(f"['{escaped}']")
    return "".join(out)


def _reason(path: Any, message: str) -> str:
    reason = f"{json_path(path)}: {message}"
    return reason if len(reason) <= _MAX_REASON else reason[: _MAX_REASON - 3] + "..."


class SchemaRule:
    """A compiled JSON schema. Build it with ``compile_schema``; thread-safe."""

    __slots__ = ("_is_valid", "_iter_errors", "check", "draft", "engine", "schema")

    def __init__(self, schema: Mapping[str, Any] | bool, draft: str, engine: str, validator: Any) -> None:
        self.schema = schema
        self.draft = draft
        self.engine = engine  # "jsonschema-rs", or "jsonschema" when jsonschema-rs is missing
        self._is_valid = validator.is_valid
        self._iter_errors = validator.iter_errors
        # The generated Python check for decoded JSON values (True only when valid), or None.
        self.check: SchemaCheck | None = generate_check(schema, draft)

    def is_valid(self, value: Any) -> bool:
        """Whether ``value`` conforms; a value that is not JSON does not."""
        try:
            return bool(self._is_valid(value))
        except (ValueError, TypeError):
            return False

    def evaluate(self, value: Any) -> Outcome:
        """``value`` is the record's value already parsed (dict, list, str, int, float, bool, None)."""
        try:
            if self._is_valid(value):
                return PASSED
        except (ValueError, TypeError) as exc:
            return Outcome(False, f"the value is not JSON: {exc}"[:_MAX_REASON])
        return self.explain(value)

    def explain(self, value: Any) -> Outcome:
        """The outcome with its reason: the first error, with the path of the offending value."""
        try:
            for error in self._iter_errors(value):
                if self.engine == "jsonschema-rs":
                    return Outcome(False, _reason(error.instance_path, error.message))
                return Outcome(False, _reason(error.absolute_path, error.message))
        except (ValueError, TypeError) as exc:
            return Outcome(False, f"the value is not JSON: {exc}"[:_MAX_REASON])
        return PASSED if self.is_valid(value) else Outcome(False, "$: the value does not conform to the schema")

    def __repr__(self) -> str:
        return f"SchemaRule(draft={self.draft!r}, engine={self.engine!r})"


def compile_schema(schema: Mapping[str, Any] | bool) -> SchemaRule:
    """Check ``schema`` and build its validator. Raises SchemaCompileError with a readable message."""
    if not isinstance(schema, Mapping | bool):
        raise SchemaCompileError(f"a JSON schema is an object or a boolean, not {type(schema).__name__}")
    draft = draft_of(schema)
    canonical_uri, oracle_cls, rs_name, formats = DRAFTS[draft]
    if isinstance(schema, Mapping) and "$schema" in schema:
        schema = {**schema, "$schema": canonical_uri}
    try:
        # format_checker=None: the meta-schema's "format": "regex" would be checked with Python's re, which
        # rejects valid ECMA-262 patterns such as \p{L}; jsonschema-rs checks patterns with its own engine.
        oracle_cls.check_schema(schema, format_checker=None)
    except jsonschema.exceptions.SchemaError as exc:
        raise SchemaCompileError(f"invalid {draft} schema: {_reason(exc.absolute_path, exc.message)}") from None
    if jsonschema_rs is None:
        checker = oracle_cls.FORMAT_CHECKER if formats else None
        return SchemaRule(schema, draft, "jsonschema", oracle_cls(schema, format_checker=checker))
    try:
        validator = getattr(jsonschema_rs, rs_name)(schema, validate_formats=formats, offline=True)
    except jsonschema_rs.ValidationError as exc:
        message = str(exc).split("\n", 1)[0]
        raise SchemaCompileError(f"invalid {draft} schema: {message}") from None
    except (ValueError, TypeError) as exc:
        raise SchemaCompileError(f"invalid {draft} schema: {exc}") from None
    return SchemaRule(schema, draft, "jsonschema-rs", validator)
