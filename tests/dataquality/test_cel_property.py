"""Differential tests: the CEL fast path against cel-python on generated records.

Two oracles:

* Kanal's reference (cel-python's InterpretedRunner with Kanal's overloads, see
  ``kanal_dataquality/cel/_reference.py``). Whenever the fast path answers, the reference must give the same
  bool, with no error. This is the property the gateway relies on: the fast path answers only when its
  answer is CEL's.
* Stock cel-python 0.5 (no overloads, ``celpy.json_to_cel`` conversion). Wherever both answer they must
  agree. Where stock cel-python errs or answers differently, the difference must be one of its known quirks,
  listed in ``STOCK_QUIRKS``: the test re-evaluates with the fix of the smallest set of quirk groups (Kanal's
  overloads for just those operators) and requires the fast path's answer, or it fails.

Records: the fields ``a b c s l m`` are each missing or an int, double, bool, string, list, map or null.
"""

from __future__ import annotations

import itertools
from typing import Any

import celpy
import pytest
from celpy import InterpretedRunner
from celpy.evaluation import CELEvalError
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kanal_dataquality.cel import CelRule, compile_cel
from kanal_dataquality.cel._parse import environment, parse
from kanal_dataquality.cel._reference import OVERLOADS

EXPRESSIONS = [
    "value.a > 0 && value.a < 100",
    "0 < value.a || value.b == 'x'",
    "value.a == value.b",
    "value.a != value.b && value.a <= value.b",
    "value.s.matches('^[a-c]+$') && size(value.s) <= 3",
    "value.s.matches('b.*c') || value.s.startsWith('x')",
    "has(value.m) && has(value.m.k) && value.m.k != null",
    "value.a in value.l",
    "value.a in [1, 'a', 2.5, true]",
    "headers['x-source'] == 'web' || value.a >= 1.5",
    "'x-source' in headers && headers['x-source'].startsWith('w') && value.c",
    "value.a + value.b > 10",
    "value.a * 2 - 1 == value.b",
    "value.a / 2 < 5 && value.b % 3 == 1",
    "value.l.all(x, x > 0) || value.l.exists(x, x == 'a')",
    "(value.a > value.b ? value.s : 'none') == 'ab'",
    "!(value.c == true) && -value.a < value.b",
    "size(value.l) > 1 && value.l[1] == value.a",
    "value.s.contains('b') || value.s.endsWith('c') || value.m.k in ['x', 'y']",
    "[value.a, 1] == [1, value.b]",
    "value.m == value.b || value.l == [1, 2]",
    "value.l.map(x, x * 2).exists_one(y, y > 2) && value.l.filter(x, x > 0) == [value.a]",
]

_SCALARS = st.one_of(
    st.integers(min_value=-3, max_value=12),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0.0, -0.0, 1.0, 1.5, 2.0, 2.5, 3.0, 99.5, 1e300]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.text(alphabet="abcxyé\n", max_size=4),
    st.none(),
)
_VALUES = st.one_of(
    _SCALARS,
    st.lists(_SCALARS, max_size=3),
    st.dictionaries(st.sampled_from(["k", "j"]), _SCALARS, max_size=2),
)
_RANDOM_RECORDS = st.fixed_dictionaries({}, optional={f: _VALUES for f in "abcslm"})
_NUMBER = st.one_of(st.integers(min_value=-3, max_value=12), st.sampled_from([0.0, 1.0, 1.5, 2.0, 2.5, 99.5]))
_WORD = st.text(alphabet="abcxy", max_size=4)
# Records of the types the expressions expect, so that the fast path answers often.
_TYPED_RECORDS = st.fixed_dictionaries(
    {"a": _NUMBER, "b": st.one_of(_NUMBER, _WORD), "c": st.booleans(), "s": _WORD},
    optional={
        "l": st.lists(st.one_of(_NUMBER, _WORD), max_size=3),
        "m": st.dictionaries(st.sampled_from(["k", "j"]), st.one_of(_WORD, st.none()), max_size=2),
    },
)
RECORDS = st.one_of(_RANDOM_RECORDS, _TYPED_RECORDS)
HEADERS = st.dictionaries(st.sampled_from(["x-source", "trace"]), st.sampled_from(["web", "app", "w", ""]), max_size=2)

_RULES: dict[str, CelRule] = {}
_STOCK: dict[str, Any] = {}
compile_cel("true")  # build the parser now: cel-python raises the recursion limit once, outside hypothesis


def rule_for(expr: str) -> CelRule:
    if expr not in _RULES:
        _RULES[expr] = compile_cel(expr)
    return _RULES[expr]


# cel-python 0.5's known quirks (shared/reference/library-measurements.md, section 1, and
# kanal_dataquality/cel/_reference.py), each with the Kanal overloads that fix it in the reference.
STOCK_QUIRKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ordering": (
        "0 < 2.5 and 2 < 2.5: no overload across int and double; true > 0 is true",
        ("_<_", "_<=_", "_>_", "_>=_"),
    ),
    "equality": ("1 == 1.0, 'a' == 1, [1] == [1.0], 2.5 in [1]: errors instead of answers", ("_==_", "_!=_", "_in_")),
    "arithmetic": ("1 + 2.5: no overload (Kanal: double); true + 1 is 2", ("_+_", "_-_", "_*_", "_/_", "_%_", "-_")),
    "logic": ("1 && true is 1; error || error is a TypeError", ("_&&_", "_||_")),
    "indexing": ("l[-1] is the last element", ("_[_]",)),
    "functions": (
        "size(null) is 0; contains() searches lists",
        ("size", "contains", "startsWith", "endsWith", "matches"),
    ),
}
_STOCK_RUNNERS: dict[tuple[str, tuple[str, ...]], Any] = {}


def stock_evaluate(expr: str, value: Any, headers: Any, fixed: tuple[str, ...] = ()) -> tuple[str, Any]:
    """("answer", bool) or ("error", message) from cel-python without Kanal's overloads, except those of the
    quirk groups in ``fixed``."""
    runner_key = (expr, fixed)
    if runner_key not in _STOCK_RUNNERS:
        functions = {name: OVERLOADS[name] for group in fixed for name in STOCK_QUIRKS[group][1]}
        _STOCK_RUNNERS[runner_key] = InterpretedRunner(environment(), parse(expr), functions or None)
    try:
        activation = {"key": None, "value": celpy.json_to_cel(value), "headers": celpy.json_to_cel(headers)}
        result = _STOCK_RUNNERS[runner_key].evaluate(activation)
    except CELEvalError as exc:
        return "error", str(exc.args)
    except Exception as exc:
        return "error", f"{type(exc).__name__}: {exc}"
    if isinstance(result, celpy.celtypes.BoolType):
        return "answer", bool(result)
    return "error", f"not a bool: {result!r}"


def explain_stock_disagreement(expr: str, value: Any, headers: Any, answer: bool) -> tuple[str, ...] | None:
    """The smallest set of known quirks whose fixes make stock cel-python give ``answer``, or None."""
    groups = list(STOCK_QUIRKS)
    for size in range(1, len(groups) + 1):
        for fixed in itertools.combinations(groups, size):
            if stock_evaluate(expr, value, headers, fixed) == ("answer", answer):
                return fixed
    return None


@pytest.mark.parametrize("expr", EXPRESSIONS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=RECORDS, headers=HEADERS)
def test_fast_path_agrees_with_cel_python(expr: str, value: dict[str, Any], headers: dict[str, str]) -> None:
    rule = rule_for(expr)
    assert rule.fast, expr
    answer = rule.fast_answer(None, value, headers)
    reference = rule.evaluate_reference(None, value, headers)
    assert rule.evaluate(None, value, headers) == (reference if answer is None else (answer, None))
    if answer is None:
        event("fast path gave up")
        return
    event("fast path answered")
    # Kanal's reference: exact agreement, and never an error where the fast path answered.
    assert reference.error is None, (expr, value, headers, answer, reference, rule.source)
    assert reference.passed is answer, (expr, value, headers, answer, reference, rule.source)
    # Stock cel-python: agreement wherever it answers; every other difference must be one of its known
    # quirks, proven by fixing just those quirks (with Kanal's overloads) and getting the fast path's answer.
    if stock_evaluate(expr, value, headers) == ("answer", answer):
        return
    quirks = explain_stock_disagreement(expr, value, headers, answer)
    assert quirks is not None, ("unexplained disagreement with stock cel-python", expr, value, headers, answer)
    for quirk in quirks:
        event(f"stock cel-python quirk: {quirk}")


def test_the_fast_path_answers_most_ordinary_records() -> None:
    """Guard against a fast path that silently gives up on everything (the property above would still pass)."""
    records = [
        ({"a": 5, "b": 7, "s": "abc", "l": [1, 2], "m": {"k": "x"}, "c": False}, {"x-source": "web"}),
        ({"a": 50.5, "b": "x", "s": "b", "l": [5, 6], "m": {"k": None}, "c": True}, {"x-source": "w"}),
        ({"a": 1, "b": 1.0, "s": "yc", "l": ["a"], "m": {}, "c": True}, {"x-source": "app"}),
    ]
    answered = sum(rule_for(e).fast_answer(None, v, h) is not None for e in EXPRESSIONS for v, h in records)
    assert answered >= 0.75 * len(EXPRESSIONS) * len(records), answered


@pytest.mark.parametrize(
    ("expr", "stock", "kanal"),
    [
        ("0 < 2.5", "error", True),
        ("1 == 1.0", "error", True),
        ("'a' == 1", "error", False),
        ("[1] == [1.0]", "error", True),
        ("1 + 2.5 == 3.5", "error", True),
        ("true > 0", True, "error"),
        ("1 && true", "error", "error"),  # stock: the int 1, not a bool
        ("[1, 2][-1] == 2", True, "error"),
        ("size(null) == 0", True, "error"),
        ("[1].contains(1)", True, "error"),
        ("has(value.missing.x)", False, False),  # CEL says error; both cel-python and Kanal's reference say false
    ],
)
def test_stock_quirks_are_real_and_fixed_in_the_reference(expr: str, stock: Any, kanal: Any) -> None:
    """Each documented quirk, on stock cel-python and on Kanal's reference (if cel-python changes, we learn)."""
    kind, answer = stock_evaluate(expr, {}, {})
    assert (answer if kind == "answer" else "error") == stock
    outcome = compile_cel(expr).evaluate_reference(None, {}, {})
    assert (outcome.passed if outcome.error is None else "error") == kanal
