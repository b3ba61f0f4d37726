"""CEL rules: one test per construct, through both the fast path and the reference (cel-python)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from kanal_dataquality.cel import FAILED, PASSED, CelCompileError, Outcome, compile_cel, headers_map

ORDER: dict[str, Any] = {
    "id": "ord-00000001",
    "amount": 1234.5,
    "whole": 12,
    "currency": "EUR",
    "customer": {"id": "c-42", "tier": "gold"},
    "items": 3,
    "tags": ["a", "b"],
    "flag": True,
    "nothing": None,
    "name": "é",
}
HEADERS = {"x-source": "web", "trace": "abc"}

ERROR = "error"


def check(
    expr: str,
    expected: bool | str,
    value: Any = None,
    headers: dict[str, str] | None = None,
    key: Any = None,
    *,
    fast: bool = True,
) -> Outcome:
    """``expected``: True/False, or ERROR (or a substring of the error reason).

    ``fast``: the fast path must answer (for a bool) or give up (for an error) by itself; False means the
    expression or this record is meant for the reference only. Either way the reference must agree.
    """
    value = ORDER if value is None else value
    headers = HEADERS if headers is None else headers
    rule = compile_cel(expr)
    outcome = rule.evaluate(key, value, headers)
    reference = rule.evaluate_reference(key, value, headers)
    assert outcome == reference, (expr, outcome, reference)
    answer = rule.fast_answer(key, value, headers)
    if isinstance(expected, bool):
        assert outcome == (PASSED if expected else FAILED), (expr, outcome)
        if fast:
            assert answer is expected, (expr, "the fast path should answer", answer, rule.source)
    else:
        assert not outcome.passed and outcome.error is not None, (expr, outcome)
        if expected != ERROR:
            assert expected in outcome.error, (expr, outcome.error)
        assert answer is None, (expr, "the fast path must not answer where CEL errs")
    return outcome


# --- numbers: one generic number type ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("value.amount > 0", True),
        ("0 < value.amount", True),  # stock cel-python: no matching overload (int < double)
        ("value.amount > 0 && value.amount < 1000000", True),
        ("value.whole > 11.5 && 12.5 > value.whole", True),
        ("value.whole == 12.0", True),
        ("12.0 == value.whole", True),
        ("value.items == 3", True),
        ("value.amount != 1234", True),
        ("1 == 1.0", True),
        ("value.whole >= 12 && value.whole <= 12", True),
        ("value.whole + 0.5 == 12.5", True),  # int + double: double (generic number)
        ("value.amount * 2 > value.whole", True),
    ],
)
def test_numbers_compare_across_int_and_double(expr: str, expected: bool) -> None:
    check(expr, expected)


def test_type_int_may_be_false_and_runs_on_the_reference() -> None:
    # The spec warns that type(x) == int can fail for an integer: JSON 12.0 is a double.
    check("type(value.whole) == int", True, fast=False)
    check("type(value.x) == int", False, value={"x": 12.0}, fast=False)
    check("type(value.x) == double", True, value={"x": 12.0}, fast=False)
    assert not compile_cel("type(value.whole) == int").fast


@pytest.mark.parametrize(("amount", "passes"), [(5, True), (5.0, True), (0, True), (0.0, True), (-1, False)])
def test_range_check_is_the_same_for_int_and_double(amount: int | float, passes: bool) -> None:
    # docs/data-quality.md: numbers are generic after JSON conversion, so range checks work on 5 and 5.0 ...
    check("value.amount >= 0", passes, value={"amount": amount})


def test_type_check_tells_an_integral_double_from_an_int() -> None:
    # ... but type() does not: type(value.amount) == int fails for 5.0, as the doc warns.
    check("type(value.amount) == int", True, value={"amount": 5}, fast=False)
    check("type(value.amount) == int", False, value={"amount": 5.0}, fast=False)
    check("value.amount == 5", True, value={"amount": 5.0})


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("value.flag > 0", ERROR),  # bool is not a number
        ("value.flag == 1", False),  # heterogeneous equality: false, not an error (and not Python's True == 1)
        ("value.flag == true", True),
        ("value.items == true", False),
        ("value.currency == 1", False),
        ("value.currency < 1", ERROR),
        ("value.nothing == null", True),
        ("value.items == null", False),
        ("value.tags == ['a', 'b']", True),
        ("[1, 2] == [1.0, 2.0]", True),
        ("value.customer == {'id': 'c-42', 'tier': 'gold'}", True),
    ],
)
def test_equality_and_ordering_types(expr: str, expected: bool | str) -> None:
    check(expr, expected, fast="{" not in expr)  # map literals run on the reference


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("value.items + 1 == 4", True),
        ("value.items - 5 == -2", True),
        ("value.items * 3 == 9", True),
        ("7 / 2 == 3", True),
        ("-7 / 2 == -3", True),  # truncation toward zero
        ("-7 % 2 == -1", True),
        ("7 % -2 == 1", True),
        ("value.amount / 2 == 617.25", True),
        ("-value.items == -3", True),
        ("'ab' + 'c' == 'abc'", True),
        ("value.tags + ['c'] == ['a', 'b', 'c']", True),
        ("9223372036854775807 + 1 > 0", "overflow"),
        ("-9223372036854775807 - 2 < 0", "overflow"),
        ("value.items * 4611686018427387904 > 0", "overflow"),
        ("value.items / 0 == 0", ERROR),
        ("value.items % 0 == 0", ERROR),
        ("'a' * 2 == 'aa'", ERROR),
        ("value.currency - 1 == 0", ERROR),
        ("-value.flag == 1", ERROR),
        ("value.amount % 2.0 == 0.5", ERROR),
    ],
)
def test_arithmetic(expr: str, expected: bool | str) -> None:
    check(expr, expected)


def test_double_division_by_zero_is_infinity_on_the_reference() -> None:
    check("value.amount / 0 > 1.0e308", True, fast=False)


# --- logic and CEL error semantics -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "expected", "fast"),
    [
        ("false && value.missing == 1", False, True),
        ("value.missing == 1 && false", False, False),  # the fast path gives up, the reference absorbs
        ("true || value.missing == 1", True, True),
        ("value.missing == 1 || true", True, False),
        ("value.missing == 1 && true", ERROR, True),
        ("value.missing == 1 || false", ERROR, True),
        ("!(value.items > 5)", True, True),
        ("!value.currency", ERROR, True),
        ("value.items > 1 ? value.currency == 'EUR' : false", True, True),
        ("value.items ? true : false", ERROR, True),
        ("value.currency && true", ERROR, True),  # stock cel-python gives the non-bool operand
        ("value.amount", "not a bool", True),
    ],
)
def test_logic_and_errors(expr: str, expected: bool | str, fast: bool) -> None:
    check(expr, expected, fast=fast)


# --- fields, has(), headers --------------------------------------------------------------------------------


def test_field_access_and_has() -> None:
    check("value.customer.tier == 'gold'", True)
    check("value.customer['tier'] == 'gold'", True)
    check("value.tags[1] == 'b'", True)
    check("value.tags[2] == 'b'", ERROR)
    check("value.tags[-1] == 'b'", ERROR)  # stock cel-python: Python's negative index
    check("value.missing == 'x'", "no such member")
    check("value.currency.x == 1", ERROR)
    check("has(value.id)", True)
    check("has(value.missing)", False)
    check("has(value.nothing)", True)  # present with a null value
    check("has(value.customer.tier) && !has(value.customer.email)", True)
    check("has(value.id) && value.id.startsWith('ord-')", True)


def test_has_on_a_missing_parent_is_false_in_cel_python() -> None:
    # CEL says error; cel-python 0.5 says false (documented in cel/_reference.py). The fast path gives up.
    check("has(value.missing.x)", False, fast=False)


def test_key_variable() -> None:
    check("key == 'k1'", True, key="k1")
    check("key == null", True, key=None)
    check("has(key.id)", True, key={"id": 1})


def test_headers_bracket_notation_and_missing_header() -> None:
    check("headers['x-source'] == 'web'", True)
    check("headers.trace == 'abc'", True)
    outcome = check("headers['x-missing'] == 'web'", "no such key: 'x-missing'")
    assert outcome.error == "evaluation error: no such key: 'x-missing'"
    check("'x-missing' in headers && headers['x-missing'] == 'web'", False)
    check("'x-source' in headers && headers['x-source'].startsWith('w')", True)
    check("!('x-missing' in headers) || headers['x-missing'] == 'web'", True)


def test_headers_map() -> None:
    raw = [("x-source", b"app"), ("x-source", b"web"), ("bin", b"\xff\xfe"), ("null", None), ("u", "é".encode())]
    headers = headers_map(raw)
    assert headers == {"x-source": "web", "bin": "\ufffd\ufffd", "null": "", "u": "é"}
    check("headers['x-source'] == 'web' && 'null' in headers && headers.u == 'é'", True, headers=headers)


# --- functions -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("value.currency.matches('^(EUR|USD|GBP)$')", True),
        ("value.currency.matches('UR')", True),  # unanchored search
        ("matches(value.currency, '^E')", True),
        ("value.id.matches('^ord-[0-9]{8}$')", True),
        ("value.id.matches('^ORD')", False),
        ("'EUR\\n'.matches('^EUR$')", False),  # RE2 $ is end of text (Python's also matches before \n)
        ("'a1'.matches('\\\\d')", True),
        ("'\\u0661'.matches('\\\\d')", False),  # RE2 \d is ASCII (U+0661 is an Arabic-Indic digit)
        ("'\\v'.matches('\\\\s')", False),  # RE2 \s has no \v
        ("'é'.matches('\\\\pL')", True),  # RE2 only syntax runs on RE2
        ("'ab'.matches('(?i)AB')", True),
        ("'a{,3}'.matches('a{,3}')", True),  # literal braces in RE2
        ("value.items.matches('3')", ERROR),
    ],
)
def test_matches(expr: str, expected: bool | str) -> None:
    check(expr, expected)


def test_matches_with_a_dynamic_pattern_runs_on_the_reference() -> None:
    rule = compile_cel("value.currency.matches(value.pattern)")
    assert not rule.fast
    check("value.currency.matches(value.pattern)", True, value={"currency": "EUR", "pattern": "^E"}, fast=False)
    check("value.currency.matches(value.pattern)", "invalid regular", value={"currency": "E", "pattern": "("})


def test_long_texts_use_re2_for_backtracking_patterns() -> None:
    text = "a" * 5000
    check("value.s.matches('[a-z]+[a-z]+[0-9]')", False, value={"s": text})
    check("value.s.matches('[a-z]+[a-z]+[0-9]')", True, value={"s": text + "1"})


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("size(value.currency) == 3", True),
        ("value.currency.size() == 3", True),
        ("size(value.name) == 1", True),  # code points
        ("size(value.tags) == 2", True),
        ("size(value.customer) == 2", True),
        ("size(value.items) == 1", ERROR),
        ("size(value.nothing) == 0", ERROR),  # stock cel-python: 0
        ("value.currency.startsWith('EU')", True),
        ("value.currency.endsWith('UR')", True),
        ("value.currency.contains('U')", True),
        ("value.currency.contains(value.customer.tier)", False),
        ("value.tags.contains('a')", ERROR),  # contains() is a string function
        ("value.items.startsWith('3')", ERROR),
        ("dyn(value.items) == 3", True),
    ],
)
def test_string_and_size_functions(expr: str, expected: bool | str) -> None:
    check(expr, expected)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("value.currency in ['EUR', 'USD']", True),
        ("value.items in ['EUR', 'USD']", False),
        ("value.items in [1, 2, 3.0]", True),
        ("value.flag in [1]", False),
        ("'b' in value.tags", True),
        ("'tier' in value.customer", True),
        ("'email' in value.customer", False),
        ("1 in value.customer", False),  # heterogeneous key lookup: false (the fast path gives up)
        ("1 in value.items", ERROR),
    ],
)
def test_in(expr: str, expected: bool | str) -> None:
    check(expr, expected, fast="1 in value.customer" not in expr)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("value.tags.all(t, t.size() == 1)", True),
        ("value.tags.exists(t, t == 'b')", True),
        ("value.tags.exists_one(t, t == 'b')", True),
        ("value.tags.map(t, t + '!') == ['a!', 'b!']", True),
        ("value.tags.filter(t, t != 'a') == ['b']", True),
        ("value.customer.all(k, k in ['id', 'tier'])", True),
        ("[1, 2, 3].all(x, x > 0) && ![1, -2].all(x, x > 0)", True),
        ("value.tags.all(value, value != 'c')", True),  # the macro variable shadows
        ("value.items.all(x, x > 0)", ERROR),
    ],
)
def test_macros(expr: str, expected: bool | str) -> None:
    check(expr, expected)


def test_unsupported_constructs_fall_back_to_cel_python() -> None:
    for expr, expected in [
        ("string(value.items) == '3'", True),
        ("int(value.amount) == 1234", True),
        ("value.customer == {'id': 'c-42', 'tier': 'gold'}", True),
        ("b'a' == b'a'", True),
        ("1u == 1", True),
    ]:
        rule = compile_cel(expr)
        assert not rule.fast, expr
        assert rule.evaluate(None, ORDER, HEADERS) == (PASSED if expected else FAILED), expr


# --- compile errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("value.amount >", "syntax error at line 1, column"),
        ("'abc", "syntax error"),
        ("", "empty"),
        ("   ", "empty"),
        ("foo(value)", "unknown function 'foo'"),
        ("value.x.foo()", "unknown method 'foo'"),
        ("value.x.reduce(a, b, 0, a + b)", "unknown method 'reduce'"),
        ("amount > 0", "undeclared reference to 'amount'"),
        ("value.x.all(y, z > 0)", "undeclared reference to 'z'"),
        ("size(value.a, value.b)", "size() takes 1 argument"),
        ("value.s.startsWith()", "startsWith() takes 1 argument"),
        ("has(value)", "has() needs a field selection"),
        ("value.x.all(1, true)", "must be a variable name"),
        ("value.x.map(a, a > 0, a)", "three-argument map()"),
        ("value.s.matches('(a')", "invalid regular expression '(a'"),
        ("value.s.matches('a\\\\1')", "invalid regular expression"),  # backreferences are not RE2
        ("value.s.matches('(?=a)')", "invalid regular expression"),
        ("value.x == 99999999999999999999", "invalid literal"),
        ("Msg{a: 1}", "message construction"),
    ],
)
def test_compile_errors(expr: str, message: str) -> None:
    with pytest.raises(CelCompileError) as info:
        compile_cel(expr)
    assert message in str(info.value)


def test_deeply_nested_expressions_are_refused_at_compile_time() -> None:
    chain = " && ".join(f"value.a > {i}" for i in range(300))
    rule = compile_cel(chain)  # deep, but within what the reference can evaluate
    assert rule.evaluate(None, {"a": 1000}, {}) is PASSED
    assert rule.evaluate(None, {}, {}).error == "evaluation error: no such member in mapping: 'a'"
    too_deep = [
        " && ".join(f"value.a > {i}" for i in range(600)),
        "(" * 60 + "true" + ")" * 60,
        "(" * 5000 + "1" + ")" * 5000,
    ]
    for expr in too_deep:
        with pytest.raises(CelCompileError, match="nested too deeply"):
            compile_cel(expr)


def test_compile_error_is_a_value_error_with_a_caret() -> None:
    with pytest.raises(ValueError, match=r"(?s)unexpected.*\n  value\.a \+\+\n"):
        compile_cel("value.a ++")
    with pytest.raises(CelCompileError) as info:
        compile_cel("value.a == 1 && " * 200 + "value.b ==")
    context = str(info.value).splitlines()
    assert len(context) == 3 and len(context[1]) <= 82 and context[2].strip() == "^"


# --- API, counters, threads, cel-python hygiene ----------------------------------------------------------------


def test_outcome_shape() -> None:
    rule = compile_cel("value.items > 1")
    passed, error = rule.evaluate(None, ORDER, HEADERS)
    assert (passed, error) == (True, None)
    assert rule.evaluate(None, ORDER, HEADERS) is PASSED
    assert compile_cel("value.items > 5").evaluate(None, ORDER, HEADERS) is FAILED
    assert rule.fast and "lambda key, value, headers" in (rule.source or "")
    assert "value.items > 1" in repr(rule)


def test_fallback_counter() -> None:
    rule = compile_cel("headers['x-source'] == 'web'")
    rule.evaluate(None, ORDER, HEADERS)
    assert rule.fallbacks == 0
    rule.evaluate(None, ORDER, {})
    assert rule.fallbacks == 1


def test_reference_is_reentrant_across_threads() -> None:
    rule = compile_cel("headers['h'] == value.s || value.n > 10")
    errors: list[str] = []

    def work(i: int) -> None:
        for j in range(30):
            n = i * 100 + j
            outcome = rule.evaluate(None, {"s": str(n), "n": n % 20}, {"h": str(n)} if j % 2 else {})
            expected = bool(j % 2) or n % 20 > 10
            if outcome.passed != expected:
                errors.append(f"{n}: {outcome}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_parser_singleton_is_left_alone_and_compiled_runner_still_works() -> None:
    import celpy
    from celpy.celparser import CELParser

    compile_cel("value.a == 1")
    saved = CELParser.CEL_PARSER
    try:
        CELParser.CEL_PARSER = None
        compile_cel("value.b == 2")  # must not create the singleton
        assert CELParser.CEL_PARSER is None
        env = celpy.Environment(runner_class=celpy.CompiledRunner)
        prg = env.program(env.compile("x > 1"))
        assert prg.evaluate({"x": celpy.celtypes.IntType(2)})
        assert compile_cel("value.c == 3").evaluate(None, {"c": 3}, {}) is PASSED
    finally:
        CELParser.CEL_PARSER = saved


def test_celpy_logger_is_silenced(caplog: pytest.LogCaptureFixture) -> None:
    rule = compile_cel("value.missing == 1")
    with caplog.at_level(logging.DEBUG):
        assert rule.evaluate(None, ORDER, HEADERS).error is not None
    assert not [r for r in caplog.records if r.name.startswith("celpy") and r.levelno >= logging.ERROR]
