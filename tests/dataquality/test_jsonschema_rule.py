"""JSON schema rules: drafts, compile errors, reasons, and jsonschema-rs against jsonschema (the oracle)."""

from __future__ import annotations

import datetime
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kanal_dataquality import jsonschema_rule
from kanal_dataquality.cel import PASSED
from kanal_dataquality.jsonschema_rule import SchemaCompileError, compile_schema, draft_of, json_path

DRAFT7 = "http://json-schema.org/draft-07/schema#"
DRAFT2020 = "https://json-schema.org/draft/2020-12/schema"

ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "amount", "currency"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "string", "pattern": "^ord-[0-9]{2}$"},
        "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000},
        "currency": {"enum": ["EUR", "USD"]},
        "customer": {
            "type": "object",
            "required": ["id"],
            "properties": {"id": {"type": "string", "minLength": 2}, "tier": {"enum": ["gold", "silver"]}},
        },
        "items": {"type": "array", "items": {"type": "integer", "minimum": 1}, "maxItems": 3, "uniqueItems": True},
        "note": {"type": ["string", "null"], "maxLength": 5},
    },
}


# --- drafts --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("declared", "draft"),
    [
        (None, "2020-12"),
        (DRAFT2020, "2020-12"),
        ("https://json-schema.org/draft/2020-12/schema#", "2020-12"),
        ("https://json-schema.org/draft/2019-09/schema", "2019-09"),
        (DRAFT7, "draft-07"),
        ("http://json-schema.org/draft-07/schema", "draft-07"),
        ("https://json-schema.org/draft-07/schema#", "draft-07"),
        ("http://json-schema.org/draft-06/schema#", "draft-06"),
        ("http://json-schema.org/draft-04/schema#", "draft-04"),
    ],
)
def test_draft_selection(declared: str | None, draft: str) -> None:
    schema: dict[str, Any] = {"type": "string"} if declared is None else {"$schema": declared, "type": "string"}
    assert draft_of(schema) == draft
    rule = compile_schema(schema)
    assert rule.draft == draft
    assert rule.evaluate("x") is PASSED
    assert not rule.evaluate(1).passed


def test_prefix_items_follow_2020_12_without_schema_and_are_ignored_by_draft_07() -> None:
    schema: dict[str, Any] = {"prefixItems": [{"type": "string"}], "items": {"type": "integer"}}
    rule = compile_schema(schema)
    assert rule.evaluate(["a", 1]).passed
    assert rule.evaluate(["a"]).passed
    assert not rule.evaluate([1, 1]).passed
    assert not rule.evaluate(["a", "b"]).passed
    draft7 = compile_schema({"$schema": DRAFT7, **schema})  # prefixItems unknown; items applies to every item
    assert draft7.evaluate([1, 1]).passed
    assert not draft7.evaluate(["a", 1]).passed
    for doc in (["a", 1], [1, 1], ["a", "b"], []):
        assert rule.is_valid(doc) is jsonschema.Draft202012Validator(schema).is_valid(doc)


def test_draft_04_exclusive_minimum_is_a_boolean() -> None:
    rule = compile_schema(
        {"$schema": "http://json-schema.org/draft-04/schema#", "minimum": 0, "exclusiveMinimum": True}
    )
    assert not rule.evaluate(0).passed
    assert rule.evaluate(0.5).passed
    with pytest.raises(SchemaCompileError, match="invalid 2020-12 schema"):
        compile_schema({"minimum": 0, "exclusiveMinimum": True})  # a number in 2020-12


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": 12}, "invalid 2020-12 schema: $.type:"),
        ({"$schema": DRAFT7, "required": "id"}, "invalid draft-07 schema: $.required:"),
        ({"properties": {"a": {"minLength": -1}}}, "$.properties.a.minLength"),
        ({"$schema": "http://json-schema.org/draft-03/schema#"}, "draft-03 schemas are not supported"),
        ({"$schema": "http://example.com/my-meta"}, "unknown $schema"),
        ({"$schema": 7}, "$schema must be a string"),
        ({"$ref": "http://127.0.0.1:9/remote.json"}, "Retrieval is disabled"),
        ({"$ref": "#/$defs/missing"}, "does not exist"),
        ({"pattern": "(a"}, "invalid 2020-12 schema"),
        ("not a schema", "an object or a boolean"),
    ],
)
def test_compile_errors(schema: Any, message: str) -> None:
    with pytest.raises(SchemaCompileError) as info:
        compile_schema(schema)
    assert message in str(info.value)


def test_boolean_schemas_and_local_refs() -> None:
    assert compile_schema(True).evaluate({"any": 1}).passed
    assert not compile_schema(False).evaluate(1).passed
    rule = compile_schema({"$defs": {"id": {"type": "string"}}, "properties": {"id": {"$ref": "#/$defs/id"}}})
    assert rule.evaluate({"id": "x"}).passed
    assert rule.evaluate({"id": 1}) == (False, '$.id: 1 is not of type "string"')


def test_ecma_patterns_that_python_re_rejects_are_accepted() -> None:
    rule = compile_schema({"type": "string", "pattern": "^\\p{L}+$"})
    assert rule.evaluate("été").passed
    assert not rule.evaluate("e1").passed


# --- per-record outcomes -------------------------------------------------------------------------------------


def test_reasons_carry_the_path_of_the_first_error() -> None:
    rule = compile_schema(ORDER_SCHEMA)
    good = {"id": "ord-01", "amount": 10, "currency": "EUR", "customer": {"id": "c1", "tier": "gold"}, "items": [1]}
    assert rule.evaluate(good) is PASSED
    assert rule.evaluate({**good, "customer": {"id": "c1", "tier": 1}}) == (
        False,
        '$.customer.tier: 1 is not one of "gold" or "silver"',
    )
    assert rule.evaluate({**good, "items": [1, 0]}).error == "$.items[1]: 0 is less than the minimum of 1"
    assert rule.evaluate({"amount": 1, "currency": "EUR"}).error == '$: "id" is a required property'
    assert rule.evaluate({**good, "amount": 0}).error == "$.amount: 0 is less than or equal to the minimum of 0"
    error = rule.evaluate({**good, "x-y": 1}).error
    assert error is not None and error.startswith("$: Additional properties are not allowed")
    assert json_path(["x-y", 0, "a", "it's"]) == "$['x-y'][0].a['it\\'s']"


def test_long_reasons_are_cut() -> None:
    rule = compile_schema({"type": "string"})
    error = rule.evaluate({"k": "v" * 1000}).error
    assert error is not None and len(error) <= 300 and error.endswith("...")


def test_values_that_are_not_json() -> None:
    rule = compile_schema({"type": "object", "properties": {"b": {"type": "string"}}})
    outcome = rule.evaluate({"b": b"raw"})
    assert not outcome.passed and outcome.error is not None and "not JSON" in outcome.error
    assert not rule.evaluate({"b": datetime.datetime(2024, 1, 1)}).passed
    assert not rule.is_valid({"b": b"raw"})


def test_formats_are_annotations_in_2020_12_and_assertions_in_draft_07() -> None:
    assert compile_schema({"format": "email"}).evaluate("not-an-email").passed
    assert compile_schema({"$schema": DRAFT2020, "format": "date-time"}).evaluate("nope").passed
    draft7 = compile_schema({"$schema": DRAFT7, "format": "email"})
    assert not draft7.evaluate("not-an-email").passed
    assert draft7.evaluate("a@example.com").passed
    assert not compile_schema({"$schema": DRAFT7, "format": "date-time"}).evaluate("nope").passed


def test_integers_and_numbers() -> None:
    rule = compile_schema({"type": "integer", "maximum": 10})
    assert rule.evaluate(1.0).passed  # 1.0 is an integer in JSON schema
    assert not rule.evaluate(1.5).passed
    assert not rule.evaluate(True).passed
    assert not rule.evaluate(2**70).passed


def test_fallback_engine_without_jsonschema_rs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonschema_rule, "jsonschema_rs", None)
    rule = compile_schema(ORDER_SCHEMA)
    assert rule.engine == "jsonschema"
    assert rule.evaluate({"id": "ord-01", "amount": 10, "currency": "EUR"}) is PASSED
    assert rule.evaluate({"id": "ord-01", "amount": 10, "currency": "GBP"}) == (
        False,
        "$.currency: 'GBP' is not one of ['EUR', 'USD']",
    )
    assert not compile_schema({"$schema": DRAFT7, "format": "email"}).evaluate("nope").passed


# --- differential: jsonschema-rs against jsonschema -----------------------------------------------------------

DIFFERENTIAL_SCHEMAS: list[dict[str, Any]] = [
    ORDER_SCHEMA,
    {
        "$schema": DRAFT7,
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": [{"type": "string"}], "additionalItems": {"type": "number"}},
            "id": {"type": ["string", "integer"], "minLength": 2, "multipleOf": 2},
        },
        "dependencies": {"id": ["tags"]},
        "propertyNames": {"maxLength": 4},
        "if": {"required": ["kind"]},
        "then": {"properties": {"kind": {"const": "a"}}},
        "else": {"minProperties": 1},
    },
    {
        "$defs": {"pos": {"type": "number", "exclusiveMinimum": 0}},
        "type": "object",
        "properties": {
            "tags": {"prefixItems": [{"type": "string"}, {"$ref": "#/$defs/pos"}], "items": False},
            "id": {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "integer"}]},
            "note": {"not": {"type": "null"}},
            "list": {"contains": {"type": "boolean"}, "minContains": 1, "maxContains": 2},
        },
        "dependentRequired": {"id": ["kind"]},
        "unevaluatedProperties": {"type": ["string", "number"]},
        "anyOf": [{"required": ["id"]}, {"required": ["tags"]}, {"maxProperties": 2}],
    },
    {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "object",
        "properties": {"n": {"type": "number", "minimum": 1, "exclusiveMinimum": True, "maximum": 5}},
        "patternProperties": {"^x": {"type": "boolean"}},
        "additionalProperties": {"type": ["string", "null"]},
        "required": ["n"],
    },
]

_KEYS = st.sampled_from(["id", "amount", "currency", "customer", "items", "note", "tags", "kind", "n", "x1", "list"])
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=1200),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-10, max_value=2000),
    st.sampled_from(["ord-01", "ord-1x", "EUR", "USD", "GBP", "gold", "c", "c1", "a", "", "abcdef", "é"]),
)
DOCUMENTS = st.recursive(
    _LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(_KEYS, children, max_size=5),
    ),
    max_leaves=12,
)


# Valid documents per schema; the test mutates them so that both outcomes are common.
SEEDS: list[list[Any]] = [
    [{"id": "ord-01", "amount": 10, "currency": "EUR", "customer": {"id": "c1", "tier": "gold"}, "items": [1, 2]}],
    [{"tags": ["a", 1, 2.5], "id": 4, "kind": "a"}, {"x1": 1}],
    [{"tags": ["a", 1], "id": "ab", "kind": "x", "list": [True, 1]}, {"tags": ["b"], "n": 2}],
    [{"n": 3, "x1": True, "other": "s", "note": None}],
]
_DELETE = object()


def _mutate(args: tuple[Any, list[tuple[str, Any]]]) -> Any:
    seed, changes = args
    doc = dict(seed)
    for key, new in changes:
        if new is _DELETE:
            doc.pop(key, None)
        else:
            doc[key] = new
    return doc


def documents_for(index: int) -> st.SearchStrategy[Any]:
    changes = st.lists(st.tuples(_KEYS, st.one_of(st.just(_DELETE), DOCUMENTS)), max_size=2)
    mutated = st.tuples(st.sampled_from(SEEDS[index]), changes).map(_mutate)
    return st.one_of(mutated, mutated, DOCUMENTS, st.dictionaries(_KEYS, DOCUMENTS, max_size=6))


def _oracle(schema: dict[str, Any]) -> Any:
    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)


def test_seeds_are_valid() -> None:
    for schema, seeds in zip(DIFFERENTIAL_SCHEMAS, SEEDS, strict=True):
        for seed in seeds:
            assert _oracle(schema).is_valid(seed), seed
            assert compile_schema(schema).evaluate(seed) is PASSED


@pytest.mark.parametrize("index", range(len(DIFFERENTIAL_SCHEMAS)))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_jsonschema_rs_agrees_with_jsonschema(index: int, data: st.DataObject) -> None:
    schema = DIFFERENTIAL_SCHEMAS[index]
    document = data.draw(documents_for(index))
    rule = compile_schema(schema)
    oracle = _oracle(schema)
    expected = oracle.is_valid(document)
    event("valid" if expected else "invalid")
    outcome = rule.evaluate(document)
    assert outcome.passed is expected, (schema, document, outcome, [e.message for e in oracle.iter_errors(document)])
    assert (outcome.error is None) is expected
