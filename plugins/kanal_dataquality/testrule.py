"""Testing a rule against a sample record: passed, failed, or evaluation error.

Shared by the admin API (``POST /gateway/v2/data-quality/test-rule``) and ``kanal test-rule --local``.

The sample: ``key`` and ``value`` are either text (the payload as a producer would send it: parsed as
JSON when it is JSON, else kept as text) or any other JSON value (used as the decoded payload);
``valueBase64``/``keyBase64`` give binary payloads (a schema-id prefix then goes through the
registry); ``headers`` is a map of name to text.

Results: ``passed``; ``failed`` with the violation text (and the schema's reason for JSON schema
rules); ``evaluationError`` with the reason when the rule cannot be compiled (bad CEL syntax, invalid
schema) or evaluated (a missing field or header, a value of the wrong type, a value that is not JSON
for a JSON schema rule: "wrong data format").
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

import orjson

from kanal_dataquality.avro import SchemaRegistry, prefix_ref
from kanal_dataquality.cel import headers_map
from kanal_dataquality.evaluate import decode_key, decode_value
from kanal_dataquality.rules import CEL_MODE, ENFORCE_AVRO, SCHEMA_MODE, CompiledRule, RuleCompileError, compile_rule

__all__ = ["ERROR", "FAILED", "PASSED", "SampleError", "run_test", "sample"]

PASSED = "passed"
FAILED = "failed"
ERROR = "evaluationError"


class SampleError(ValueError):
    """The request itself is malformed (400)."""


def _payload(body: Mapping[str, Any], name: str) -> tuple[bytes | None, Any, bool]:
    """(raw bytes or None, decoded value, whether the text failed to parse as JSON)."""
    encoded = body.get(f"{name}Base64")
    if encoded is not None:
        if not isinstance(encoded, str):
            raise SampleError(f"{name}Base64 must be a base64 string")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise SampleError(f"{name}Base64 is not valid base64") from None
        return raw, None, False
    if name not in body or body[name] is None:
        return None, None, False
    value = body[name]
    if isinstance(value, str):
        raw = value.encode()
        try:
            return raw, orjson.loads(raw), False
        except orjson.JSONDecodeError:
            return raw, value, True
    return None, value, False


def sample(body: Mapping[str, Any]) -> tuple[Any, Any, dict[str, str], bytes | None, bool]:
    """(key, value, headers, raw value, value-is-not-JSON) of a test request."""
    headers = body.get("headers") or {}
    if isinstance(headers, list):
        try:
            headers = {
                str(h["name"] if isinstance(h, Mapping) else h[0]): str(h["value"] if isinstance(h, Mapping) else h[1])
                for h in headers
            }
        except (KeyError, IndexError, TypeError):
            raise SampleError("headers must be a map of name to text") from None
    if not isinstance(headers, Mapping):
        raise SampleError("headers must be a map of name to text")
    raw_key, key, _ = _payload(body, "key")
    if raw_key is not None:
        key = decode_key(raw_key)  # text or base64: decoded as the keys of produced records are
    raw_value, value, not_json = _payload(body, "value")
    if raw_value is not None and body.get("valueBase64") is not None:
        value = decode_value(raw_value)
        not_json = isinstance(value, str | bytes)
    header_map = headers_map((str(k), None if v is None else str(v).encode()) for k, v in headers.items())
    return key, value, header_map, raw_value, not_json


def compile_for_test(rule: Mapping[str, Any]) -> CompiledRule:
    """A rule from an inline spec (or manifest); raises RuleCompileError."""
    spec = rule.get("spec", rule)
    name = str((rule.get("metadata") or {}).get("name") or "test-rule")
    if not isinstance(spec, Mapping):
        raise RuleCompileError("the rule must be a DataQualityRule manifest or its spec")
    kind = spec.get("type")
    if isinstance(kind, str):
        lowered = kind.lower()
        kind = "Cel" if lowered == "cel" else "JsonSchema" if lowered in ("jsonschema", "json-schema") else kind
    schema = spec.get("schema")
    if isinstance(schema, str):
        try:
            schema = orjson.loads(schema)
        except orjson.JSONDecodeError as exc:
            raise RuleCompileError(f"invalid JSON schema: not JSON: {exc}") from None
    return compile_rule(name, {**spec, "type": kind, **({"schema": schema} if "schema" in spec else {})})


async def run_test(rule: CompiledRule, body: Mapping[str, Any], registry: SchemaRegistry | None) -> dict[str, Any]:
    """The outcome of one rule on the sample in ``body``."""
    key, value, headers, raw_value, not_json = sample(body)
    if rule.name == ENFORCE_AVRO or rule.mode not in (CEL_MODE, SCHEMA_MODE):
        ref = prefix_ref(raw_value)
        if ref is None:
            return {"result": FAILED, "message": rule.message, "reason": "no schema id in the value"}
        if registry is None:
            return {"result": ERROR, "message": "no schema registry is configured on the gateway"}
        info = await registry.get(ref)
        if info.error:
            return {"result": ERROR if info.unreachable else FAILED, "message": rule.message, "reason": info.error}
        if info.schema_type != "AVRO":
            return {"result": FAILED, "message": rule.message, "reason": f"schema id {ref} is {info.schema_type}"}
        return {"result": PASSED}
    if raw_value is not None and prefix_ref(raw_value) is not None and registry is not None:
        info = await registry.get(prefix_ref(raw_value) or 0)
        if info.decode is not None:
            try:
                value = info.decode(raw_value[5:])
                not_json = False
            except Exception as exc:
                return {"result": ERROR, "message": f"wrong data format: the value does not decode as Avro: {exc}"}
    if rule.mode == SCHEMA_MODE:
        if not_json:
            return {"result": ERROR, "message": "wrong data format: the value is not JSON"}
        outcome = rule.evaluate(value)
        if outcome.passed:
            return {"result": PASSED}
        if outcome.error and outcome.error.startswith("the value is not JSON"):
            return {"result": ERROR, "message": f"wrong data format: {outcome.error}"}
        return {"result": FAILED, "message": rule.message, "reason": outcome.error}
    outcome = rule.evaluate(key, value, headers)
    if outcome.passed:
        return {"result": PASSED}
    if outcome.error:
        return {"result": ERROR, "message": outcome.error}
    return {"result": FAILED, "message": rule.message}
