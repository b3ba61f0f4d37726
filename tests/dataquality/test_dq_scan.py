"""The generated record loop against the gateway's codec: headers read by name, pasted rule checks.

``scan_batches`` reads the batch bytes through the core's record walk (``kanal_dataquality.scan``:
``record_values``, or ``record_spans`` when rules read the key or headers); ``evaluate`` on
``RecordBatch.records()`` is the reference. Both must find the same violations, with the compiled walk
and with its pure-Python reference.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kanal_dataquality import scan
from kanal_dataquality.batches import scan_batches
from kanal_dataquality.evaluate import evaluate
from kanal_dataquality.inline import inline
from kanal_dataquality.policies import Plan, build_plan, compile_policy
from kanal_dataquality.rules import compile_rule
from kanal_dataquality.scan import compile_scanner

from kanal.api import Record, RecordSet, encode_batch, record_spans, record_values
from kanal.protocol.records.values import python_record_spans, python_record_values

LONG = "h" * 70  # a name whose length takes a two-byte varint
RULES = {
    "web": compile_rule("web", {"type": "Cel", "celExpression": "headers['x-source'] == 'web'"}),
    "long": compile_rule(
        "long", {"type": "Cel", "celExpression": f"!('{LONG}' in headers) || headers['{LONG}'] != ''"}
    ),
    "keyed": compile_rule("keyed", {"type": "Cel", "celExpression": "key != 'bad' && key != 7"}),
    "few": compile_rule("few", {"type": "Cel", "celExpression": "size(headers) < 2"}),
    "pair": compile_rule("pair", {"type": "Cel", "celExpression": "!('a' in headers && headers['x'] == 'web')"}),
    "amount": compile_rule("amount", {"type": "Cel", "celExpression": "value.amount > 0 && value.c in ['EUR', 'USD']"}),
    "euro": compile_rule(
        "euro", {"type": "Cel", "celExpression": "value.c.matches('^(EUR|GBP)$') && value.amount < 9"}
    ),
    "shape": compile_rule(
        "shape",
        {
            "type": "JsonSchema",
            "schema": {
                "type": "object",
                "required": ["amount", "c"],
                "additionalProperties": False,
                "properties": {"amount": {"type": "integer", "maximum": 8}, "c": {"enum": ["EUR", "USD"]}},
            },
        },
    ),
}


def plan_of(*names: str, mark: bool = True) -> Plan:
    manifest = {
        "metadata": {"name": "p", "group": "g"},
        "spec": {
            "rules": list(names),
            "targets": [{"cluster": "gateway", "topic": "t"}],
            "actions": {"mark": {"enabled": mark}},
        },
    }
    return build_plan([compile_policy(manifest, RULES, frozenset())])


def violations(plan: Plan, data: bytes) -> tuple[list[Any], list[Any]]:
    scanned = scan_batches(plan, RecordSet.parse(data).batches)
    reference = evaluate(plan, RecordSet.parse(data).batches[0].records())
    assert scanned.evaluated == reference.evaluated
    return [(v.index, v.rules) for v in scanned.violations], [(v.index, v.rules) for v in reference.violations]


_NAMES = st.sampled_from(["x-source", "x-sourcf", "a", LONG, "x", "\x10x-source"])
_VALUES = st.sampled_from(
    [None, b"", b"web", b"app", b"w" * 100, b"\xff\xfe", b"\x10x-sourceweb", b"\x06web", b"x-source"]
)
HEADERS = st.lists(st.tuples(_NAMES, _VALUES), max_size=4)


@settings(max_examples=150, deadline=None)
@given(records=st.lists(HEADERS, min_size=1, max_size=12), plan=st.sampled_from(["web", "long", "both"]))
def test_headers_read_by_name_as_the_codec_reads_them(records: list[list[tuple[str, bytes | None]]], plan: str) -> None:
    data = encode_batch(
        [Record(offset_delta=i, value=b'{"amount": 1}', headers=h) for i, h in enumerate(records)],
        base_timestamp=1,
    )
    names = ["web", "long"] if plan == "both" else [plan]
    found, expected = violations(plan_of(*names), data)
    assert found == expected


def test_one_header_cases() -> None:
    cases: list[list[tuple[str, bytes | None]]] = [
        [],
        [("x-source", b"web")],  # first and only: read without walking
        [("x-source", b"app"), ("x-source", b"web")],  # the last value wins
        [("x-source", b"web"), ("x-source", b"app")],
        [("a", b"\x10x-source"), ("x-source", b"web")],  # the name's bytes inside another header first
        [("x-source", b"w" * 100)],  # a value longer than 63 bytes: walked
        [("x-source", None)],  # a null value is the empty string
        [("b", b"1"), ("x-source", b"web")],
    ]
    data = encode_batch([Record(offset_delta=i, value=b"{}", headers=h) for i, h in enumerate(cases)], base_timestamp=1)
    found, expected = violations(plan_of("web"), data)
    assert found == expected == [(0, (0,)), (3, (0,)), (5, (0,)), (6, (0,))]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "amount": st.one_of(st.integers(-2, 10), st.floats(-2, 10), st.booleans(), st.none()),
                "c": st.sampled_from(["EUR", "USD", "GBP", "", 1]),
                "x": st.just(1),
            },
        ),
        min_size=1,
        max_size=20,
    )
)
def test_pasted_checks_decide_as_the_engines(values: list[dict[str, Any]]) -> None:
    data = encode_batch([Record(offset_delta=i, value=orjson.dumps(v)) for i, v in enumerate(values)], base_timestamp=1)
    found, expected = violations(plan_of("amount", "euro", "shape"), data)
    assert found == expected


@pytest.mark.parametrize("walk", [python_record_values, record_values])
def test_rules_on_values_read_them_from_the_record_walk(walk: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rules reading only the value get the values of the compiled walk (or of its reference)."""
    counts: list[int] = []

    def counted(*args: Any) -> list[Any]:
        counts.append(args[2])
        return walk(*args)  # type: ignore[no-any-return]

    monkeypatch.setattr(scan, "record_values", counted)
    values = [b'{"amount": 1, "c": "EUR"}', None, b"not json", b'{"amount": 9, "c": "EUR"}', b"", b'{"amount": 2}']
    data = encode_batch(
        [Record(offset_delta=i, key=b"k", value=v, headers=[("h", b"v")]) for i, v in enumerate(values)],
        base_timestamp=1,
    )
    plan = plan_of("amount", "shape")
    found, expected = violations(plan, data)
    assert found == expected == [(1, (0, 1)), (2, (0, 1)), (3, (1,)), (4, (0, 1)), (5, (0, 1))]
    assert counts == [6]  # one call for the batch


_KEYS = st.sampled_from([None, b"", b"k", b"bad", b'"bad"', b"7", b"\xff\xfe", b"{", b"k" * 70])


@pytest.mark.parametrize("walk", [python_record_spans, record_spans])
@settings(max_examples=100, deadline=None)
@given(
    records=st.lists(st.tuples(_KEYS, _VALUES, HEADERS), min_size=1, max_size=12),
    rules=st.sampled_from([("keyed",), ("few",), ("pair",), ("keyed", "web", "amount"), ("few", "pair", "shape")]),
)
def test_key_and_headers_are_read_from_the_record_spans(
    walk: Any, records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]], rules: tuple[str, ...]
) -> None:
    """Rules reading the key or headers (any, one or two names) read them from the spans of the record
    walk, one call per batch, and decide as on the codec's records."""
    calls: list[int] = []

    def counted(*args: Any) -> Any:
        calls.append(args[2])
        return walk(*args)

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(scan, "record_spans", counted)
        plan = plan_of(*rules)
        data = encode_batch(
            [Record(offset_delta=i, key=k, value=v, headers=h) for i, (k, v, h) in enumerate(records)],
            base_timestamp=1,
        )
        found, expected = violations(plan, data)
    assert found == expected
    assert calls == [len(records)]


def test_a_key_rule_reads_null_text_and_json_keys() -> None:
    keys = [None, b"bad", b'"bad"', b"7", b"ok", b"\xff"]
    data = encode_batch([Record(offset_delta=i, key=k, value=b"{}") for i, k in enumerate(keys)], base_timestamp=1)
    found, expected = violations(plan_of("keyed"), data)
    assert found == expected == [(1, (0,)), (2, (0,))]  # "bad" as text and as JSON; "7" is text


def test_rule_checks_are_pasted_into_the_loop() -> None:
    plan = plan_of("amount", "euro", "shape", "web")
    scan = compile_scanner(plan)
    names = scan.__globals__
    assert not any(n.startswith("fast") for n in names)  # no rule is called on the fast path
    assert {"_r0_k2", "_r1_k2", "_r2_s3"} <= set(names)  # each rule's constants, under its own prefix


def test_inline_renames_every_free_name() -> None:
    rule = RULES["amount"]
    assert rule.inline is not None
    expression, names = inline(*rule.inline, ("key", "value", "headers"), "_r7")
    assert "value['amount']" in expression and "_r7_E" in names
    assert all(name.startswith("_r7") for name in names)
    with_lambda = compile_rule("all", {"type": "Cel", "celExpression": "value.items.all(i, i > 0)"})
    assert with_lambda.inline is not None
    assert inline(*with_lambda.inline, ("key", "value", "headers"), "_r0") is None  # a scope of its own: called


def test_a_loop_that_does_not_compile_with_pasted_checks_calls_them(monkeypatch: pytest.MonkeyPatch) -> None:
    deep = "(" * 300 + "True" + ")" * 300  # beyond the parser's nesting limit once inside the loop
    monkeypatch.setattr(scan, "inline", lambda *args: (deep, {}))
    plan = plan_of("amount", "shape")
    loop = scan.compile_scanner(plan)
    assert {"fast0", "fast1"} <= set(loop.__globals__)
    data = encode_batch([Record(offset_delta=0, value=b'{"amount": 0, "c": "EUR"}')], base_timestamp=1)
    found, expected = violations(plan, data)
    assert found == expected == [(0, (0,))]
