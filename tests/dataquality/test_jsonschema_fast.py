"""The generated JSON schema check: never True for a value jsonschema-rs (the engine) or jsonschema refuses.

The check is one-sided (see ``kanal_dataquality.jsonschema_fast``): True means the value conforms,
anything else (False, an exception) leaves the decision to the engine. So the property here is
soundness against both engines, plus that it does decide the ordinary valid records.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kanal_dataquality.jsonschema_fast import generate_check
from kanal_dataquality.jsonschema_rule import compile_schema

DRAFT4 = "http://json-schema.org/draft-04/schema#"
DRAFT7 = "http://json-schema.org/draft-07/schema#"

ORDER: dict[str, Any] = {
    "type": "object",
    "required": ["id", "amount", "currency", "customer"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "string", "pattern": "^ord-[0-9]{2}$"},
        "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000},
        "currency": {"enum": ["EUR", "USD"]},
        "customer": {
            "type": "object",
            "required": ["id"],
            "properties": {"id": {"type": "string", "minLength": 2}, "tier": {"enum": ["gold", "silver", None, 1]}},
        },
        "items": {"type": "array", "items": {"type": "integer", "minimum": 1}, "maxItems": 3},
        "note": {"type": ["string", "null"], "maxLength": 5},
        "flag": {"const": True},
    },
}


def decides(schema: Any, value: Any, draft: str = "2020-12") -> bool:
    """Whether the check says True (an exception is "not decided")."""
    check = generate_check(schema, draft)
    assert check is not None, schema
    try:
        return check.function(value) is True
    except Exception:
        return False


def test_common_schemas_get_a_check() -> None:
    good = {"id": "ord-01", "amount": 10, "currency": "EUR", "customer": {"id": "c1", "tier": "gold"}, "items": [1]}
    assert decides(ORDER, good)
    assert decides(ORDER, {**good, "note": None, "flag": True, "amount": 999.5})
    bench = {
        "type": "object",
        "required": ["id", "name", "amount"],
        "properties": {
            "id": {"type": "integer", "minimum": 0},
            "name": {"type": "string", "minLength": 1},
            "amount": {"type": "integer", "minimum": 0, "maximum": 1_000_000},
            "pad": {"type": "string"},
        },
    }
    assert decides(bench, orjson.loads(b'{"id": 1, "name": "user-1", "amount": 7, "pad": "xx"}'))
    assert compile_schema(bench).check is not None
    nothing_asserted = {"properties": {"x": {"minLength": 0, "uniqueItems": False, "maximum": 5}}}
    assert decides(nothing_asserted, {"x": 3}) and decides(nothing_asserted, {"x": "long text"})


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#/$defs/a", "$defs": {"a": {"type": "string"}}},
        {"oneOf": [{"type": "string"}]},
        {"anyOf": [{"type": "string"}]},
        {"not": {"type": "string"}},
        {"type": "array", "uniqueItems": True},
        {"$schema": DRAFT7, "type": "array", "items": [{"type": "string"}]},
        {"patternProperties": {"^x": {"type": "string"}}},
        {"additionalProperties": {"type": "string"}},
        {"dependentRequired": {"a": ["b"]}},
        {"multipleOf": 2},
        {"enum": [{"a": 1}]},
        {"x-vendor": 1},  # unknown keywords are not assumed to be annotations
        {"type": "string", "pattern": r"^\S+$"},  # Python's \S is wider than jsonschema-rs's
        {"type": "string", "pattern": r"[^\s]"},
        {"type": "string", "pattern": r"\bword\b"},
        {"type": "string", "pattern": r"^\p{L}+$"},
        {"type": "string", "pattern": "^[a-z&&[^aeiou]]$"},  # a class intersection in jsonschema-rs
        {"type": "string", "pattern": "(a+)+b"},  # backtracking: never on Python re
        {"properties": {"a": {"$ref": "#"}}},
    ],
)
def test_outside_the_subset_there_is_no_check(schema: dict[str, Any]) -> None:
    assert compile_schema(schema).check is None


def test_format_is_an_annotation_only_from_2019_09() -> None:
    assert generate_check({"type": "string", "format": "email"}, "2020-12") is not None
    assert generate_check({"$schema": DRAFT7, "type": "string", "format": "email"}, "draft-07") is None
    rule = compile_schema({"$schema": DRAFT7, "type": "string", "format": "email"})
    assert rule.check is None and not rule.evaluate("nope").passed


def test_the_check_is_stricter_never_looser() -> None:
    assert not decides({"type": "integer"}, 1.0)  # an integer for JSON schema: the engine decides
    assert compile_schema({"type": "integer"}).evaluate(1.0).passed
    assert not decides({"type": "integer"}, True) and not decides({"type": "number"}, False)
    assert not decides({"enum": [1]}, True) and decides({"enum": [1]}, 1.0) and decides({"const": 0}, -0.0)
    assert not decides({"const": False}, 0) and decides({"const": None}, None)
    assert not decides({"exclusiveMaximum": 2**53 - 1}, 2**53 - 1) and decides({"maximum": 2**53 - 1.0}, 2**53 - 1)
    assert (
        decides({"maximum": 5}, -(2**70)) and not decides({"minimum": 5}, -(2**70)) and decides({"minimum": 5}, 2e300)
    )
    assert not decides({"required": ["a"], "properties": {"a": {"type": "string"}}}, {})
    assert not decides({"additionalProperties": False, "properties": {"a": {}}}, {"a": 1, "b": 2})
    assert decides({"additionalProperties": False, "properties": {"a": {}}}, {"a": 1})
    assert not decides({"type": "string", "maxLength": 1}, "ab") and decides({"maxLength": 1}, "👍")
    assert not decides({"type": "string", "pattern": "^a$"}, "a\n")  # $ is the end of the text
    assert not decides({"type": "string", "pattern": "x.*y.*z"}, "x" + "." * 40 + "yz")  # too long for Python re


def test_bounds_beyond_2_53_get_no_check_and_the_engine_decides() -> None:
    """jsonschema-rs up to 0.60 compared such bounds inexactly; the check must never disagree with any release."""
    for schema in ({"maximum": 2**64}, {"minimum": -(2**53)}, {"exclusiveMinimum": 1e20}, {"enum": ["a", 2**60]}):
        assert generate_check(schema, "2020-12") is None and compile_schema(schema).check is None


def test_draft_04_exclusive_bounds_are_booleans() -> None:
    schema = {"$schema": DRAFT4, "minimum": 0, "exclusiveMinimum": True, "maximum": 5}
    assert not decides(schema, 0, "draft-04") and decides(schema, 0.5, "draft-04") and decides(schema, 5, "draft-04")


# --- soundness on random schemas of the subset ---------------------------------------------------------

_KEYS = ["id", "amount", "currency", "tags", "note", "x"]
_PATTERNS = ["^ord-[0-9]{2}$", "^[A-Z]{3}$", "a", "^(EUR|USD)$", r"^\d+$", "^.$", "[^a-c]", r"\.", "^é"]
_LEAF_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "type": st.one_of(
        st.sampled_from(["string", "integer", "number", "boolean", "null", "object", "array"]),
        st.lists(st.sampled_from(["string", "integer", "number", "null"]), min_size=1, max_size=3, unique=True),
    ),
    "minimum": st.one_of(st.integers(-3, 5), st.floats(-3, 5, allow_nan=False)),
    "maximum": st.one_of(st.integers(-3, 1200), st.just(2**64)),
    "exclusiveMinimum": st.integers(-3, 5),
    "exclusiveMaximum": st.one_of(st.integers(0, 1200), st.floats(0, 1200, allow_nan=False)),
    "minLength": st.integers(0, 3),
    "maxLength": st.integers(0, 6),
    "pattern": st.sampled_from(_PATTERNS),
    "enum": st.lists(st.sampled_from(["EUR", "USD", "a", 1, 2.5, 0, True, False, None]), min_size=1, max_size=4),
    "const": st.sampled_from(["EUR", 1, 1.0, True, False, 0, None]),
    "title": st.just("annotation"),
    "minItems": st.integers(0, 2),
    "maxItems": st.integers(0, 3),
    "minProperties": st.integers(0, 2),
    "maxProperties": st.integers(1, 4),
}
# One to three keywords: a schema that says little is often met, so the check is tried on both outcomes.
_LEAF_KEYWORDS = st.lists(st.sampled_from(sorted(_LEAF_VALUES)), min_size=1, max_size=3, unique=True).flatmap(
    lambda keywords: st.fixed_dictionaries({k: _LEAF_VALUES[k] for k in keywords})
)


def _object(children: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"properties": st.dictionaries(st.sampled_from(_KEYS), children, max_size=4)},
        optional={
            "type": st.just("object"),
            "required": st.lists(st.sampled_from(_KEYS), max_size=4),
            "additionalProperties": st.booleans(),
        },
    )


SCHEMAS = st.recursive(
    st.one_of(_LEAF_KEYWORDS, st.booleans()),
    lambda children: st.one_of(
        _object(children),
        st.fixed_dictionaries({"items": children}, optional={"type": st.just("array"), "maxItems": st.integers(0, 3)}),
    ),
    max_leaves=6,
)
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=1200),
    st.sampled_from([2**64, 2**64 + 1, -(2**63) - 1]),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-10, max_value=2000),
    st.sampled_from(["ord-01", "ord-1x", "EUR", "USD", "GBP", "a", "", "ab", "abcd", "abcdef", "é", "7", "a\n", "👍"]),
    st.sampled_from([0, 1, 5, 1200, 0.0, 5.0, -3, -3.0, 2.5]),
)
DOCUMENTS = st.recursive(
    _LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.sampled_from(_KEYS), children, max_size=4)
    ),
    max_leaves=8,
)


def _sound(schema: Any, documents: list[Any], draft: str) -> None:
    if draft == "draft-07" and isinstance(schema, dict):
        schema = {"$schema": DRAFT7, **schema}
    try:
        rule = compile_schema(schema)
    except Exception:
        event("not a valid schema")
        return
    check = generate_check(schema, rule.draft)
    event("checked" if check is not None else "no check")
    if check is None:
        return
    oracle = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)
    for document in documents:
        try:
            decided = check.function(document) is True
        except Exception:
            decided = False
        if decided:
            event("decided")
            assert rule.is_valid(document), (schema, document, check.source)
            assert oracle.is_valid(document), (schema, document, check.source)
        elif rule.is_valid(document):
            event("left to the engine")


def near(schema: dict[str, Any]) -> list[Any]:
    """Values on and around every bound of a leaf schema, and look-alikes of its enum (True for 1)."""
    out: list[Any] = [None, True, False, [], {}, "", "a\n"]
    for keyword in ("minLength", "maxLength", "minItems", "maxItems"):
        if keyword in schema:
            for n in range(max(0, schema[keyword] - 1), schema[keyword] + 2):
                out += ["a" * n, "é" * n, "👍" * n, ["x"] * n]
    for keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if keyword in schema:
            b = schema[keyword]
            out += [b - 1, b - 0.5, b, b + 0.5, b + 1, int(b), float(b), int(b) + 1, int(b) - 1]
    for keyword in ("minProperties", "maxProperties"):
        if keyword in schema:
            out += [{k: 1 for k in _KEYS[:n]} for n in range(max(0, schema[keyword] - 1), schema[keyword] + 2)]
    for value in [*schema.get("enum", []), *([schema["const"]] if "const" in schema else [])]:
        out += [
            value,
            not value if isinstance(value, bool) else value,
            1 if value is True else 0 if value is False else value,
        ]
        if isinstance(value, int | float) and not isinstance(value, bool):
            out += [float(value), bool(value), str(value)]
    out += ["ord-01", "ord-012", "EUR", "eur", "1234", "12a", "x", "é", "d.", "ab"]
    return out


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=_LEAF_KEYWORDS, draft=st.sampled_from(["2020-12", "draft-07"]), data=st.data())
def test_a_true_check_means_both_engines_accept_leaves(schema: Any, draft: str, data: st.DataObject) -> None:
    documents = data.draw(st.lists(st.one_of(st.sampled_from(near(schema)), _LEAVES), min_size=1, max_size=8))
    _sound(schema, documents, draft)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    schema=SCHEMAS,
    documents=st.lists(DOCUMENTS, min_size=1, max_size=6),
    draft=st.sampled_from(["2020-12", "draft-07"]),
)
def test_a_true_check_means_both_engines_accept(schema: Any, documents: list[Any], draft: str) -> None:
    _sound(schema, documents, draft)
