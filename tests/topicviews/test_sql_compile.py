"""The topic-view SQL compiler: accepted language, semantics, refused constructs."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from kanal_topicviews.sql import (
    KEEP,
    CompiledView,
    RecordMeta,
    ViewContext,
    ViewRecordError,
    ViewSqlError,
    compile_view,
    now_context,
)
from kanal_topicviews.sql.reference import evaluate

NOW = datetime(2024, 5, 1, 10, 30, 15, 123456, tzinfo=UTC)
CTX = now_context(NOW)
NOW_MS = 1714559415123
ORDER = {
    "id": "ord-1",
    "amount": 150,
    "currency": "EUR",
    "customer": {"id": "c-42", "tier": "gold"},
    "items": [3, "x"],
    "flag": True,
}


def run(view: CompiledView, value: Any, meta: RecordMeta | None = None, ctx: ViewContext | None = CTX) -> Any:
    """The generated function's answer, checked against the reference interpreter."""
    try:
        expected = evaluate(view.query, value, meta, ctx)
    except ViewRecordError:
        with pytest.raises(ViewRecordError):
            view.transform(value, meta, ctx)
        raise
    got = view.transform(value, meta, ctx)
    if expected is KEEP or got is KEEP:
        assert got is expected
    else:
        assert orjson.dumps(got) == orjson.dumps(expected)
    return got


def keeps(sql: str, value: Any, meta: RecordMeta | None = None) -> bool:
    return run(compile_view(sql), value, meta) is not None


# -- the shape of a view


def test_brief_query() -> None:
    view = compile_view("SELECT id, amount, customer.tier AS tier FROM orders WHERE amount > 100 AND currency = 'EUR'")
    assert view.topic == "orders"
    assert view.columns == ("id", "amount", "tier")
    assert not view.select_all and view.needs_value and not view.needs_meta and not view.uses_now
    out = run(view, ORDER)
    assert list(out.items()) == [("id", "ord-1"), ("amount", 150), ("tier", "gold")]
    assert orjson.dumps(out) == b'{"id":"ord-1","amount":150,"tier":"gold"}'
    assert run(view, {**ORDER, "amount": 100}) is None
    assert run(view, {**ORDER, "currency": "USD"}) is None
    assert run(view, {**ORDER, "amount": "150"}) is None  # a string is not a number
    assert run(view, {"amount": 101.5, "currency": "EUR"}) == {"id": None, "amount": 101.5, "tier": None}


def test_select_star_keeps_the_original() -> None:
    view = compile_view('SELECT * FROM "my-topic" WHERE amount > 100')
    assert view.topic == "my-topic" and view.select_all and view.columns == ()
    assert run(view, ORDER) is KEEP
    assert run(view, {"amount": 1}) is None
    view = compile_view("select * from orders")
    assert not view.needs_value and run(view, None) is KEEP and run(view, "not an object") is KEEP


def test_select_star_with_metadata_filter_does_not_read_the_value() -> None:
    view = compile_view("SELECT * FROM t WHERE record.partition = 1")
    assert not view.needs_value and view.needs_meta
    assert run(view, None, RecordMeta(partition=1)) is KEEP
    assert run(view, None, RecordMeta(partition=0)) is None


def test_star_with_more_fields() -> None:
    view = compile_view("SELECT *, record.offset AS off, amount * 2 AS amount FROM t")
    out = run(view, {"id": 1, "amount": 2}, RecordMeta(offset=7))
    assert list(out.items()) == [("id", 1), ("amount", 4), ("off", 7)]


@pytest.mark.parametrize(
    ("sql", "topic"),
    [
        ("SELECT * FROM orders", "orders"),
        ('SELECT * FROM "our-orders" WHERE a = 1', "our-orders"),
        ("SELECT * FROM Orders", "Orders"),
        ("SELECT * FROM app.orders_v2", "app.orders_v2"),
        ('SELECT * FROM "a.b-c"', "a.b-c"),
    ],
)
def test_topic_names(sql: str, topic: str) -> None:
    assert compile_view(sql).topic == topic


def test_output_names_and_order() -> None:
    view = compile_view(
        'SELECT b, a.x, $.c.d, "Mixed Case", record.offset, record.header.h, record.key, record.key.kid, '
        'items[0] AS first, a.x + 1 AS "next" FROM t'
    )
    assert view.columns == ("b", "x", "d", "Mixed Case", "offset", "h", "key", "kid", "first", "next")


def test_missing_fields_are_null_members() -> None:
    view = compile_view("SELECT a, b.c, d[2] AS d2 FROM t")
    assert run(view, {}) == {"a": None, "c": None, "d2": None}
    assert run(view, {"b": 1, "d": [1, 2]}) == {"a": None, "c": None, "d2": None}
    assert run(view, {"a": [1], "b": {"c": {"e": 1}}, "d": [0, 1, 2]}) == {"a": [1], "c": {"e": 1}, "d2": 2}


def test_field_names_are_case_sensitive_keywords_are_not() -> None:
    assert keeps("select * from t where Amount > 1", {"Amount": 2})
    assert not keeps("SELECT * FROM t WHERE amount > 1", {"Amount": 2})
    assert keeps('SELECT * FROM t WHERE "Amount" > 1', {"Amount": 2})
    assert keeps("SELECT * FROM t WHERE RECORD.OFFSET = 3", {}, RecordMeta(offset=3))


def test_value_paths() -> None:
    value = {"record": {"offset": "v"}, "a": {"b": [{"c": 1}]}, "x-y": 5, "$": 1}
    assert keeps("SELECT * FROM t WHERE \"record\".offset = 'v'", value, RecordMeta(offset=0))
    assert keeps("SELECT * FROM t WHERE $.record.offset = 'v'", value)
    assert keeps("SELECT * FROM t WHERE a.b[0].c = 1", value)
    assert keeps("SELECT * FROM t WHERE a['b'][0]['c'] = 1", value)
    assert keeps("SELECT * FROM t WHERE $['x-y'] = 5", value)
    assert not keeps("SELECT * FROM t WHERE a.b[1].c = 1", value)
    assert not keeps("SELECT * FROM t WHERE a.b.c = 1", value)


def test_double_quotes_are_names() -> None:
    assert keeps('SELECT * FROM t WHERE currency = "EUR"', {"currency": "x", "EUR": "x"})
    assert not keeps('SELECT * FROM t WHERE currency = "EUR"', {"currency": "EUR"})


# -- metadata


def test_record_metadata() -> None:
    view = compile_view(
        "SELECT record.key, record.key.id AS kid, record.partition, record.offset, record.timestamp, "
        "record.header.\"x-source\" AS src, record.header['trace'] AS trace, record.header.missing AS m FROM t"
    )
    assert view.needs_meta and not view.needs_value
    meta = RecordMeta(
        key=b'{"id": 7}', partition=2, offset=99, timestamp=NOW_MS,
        headers=[("x-source", b"app"), ("trace", None), ("x-source", b"web"), ("X-Source", b"other")],
    )  # fmt: skip
    assert run(view, None, meta) == {
        "key": '{"id": 7}', "kid": 7, "partition": 2, "offset": 99, "timestamp": NOW_MS,
        "src": "web", "trace": None, "m": None,
    }  # fmt: skip
    meta = RecordMeta(key=b"\xffnot json", headers=[("x-source", b"\xffok")])
    out = run(view, None, meta)
    assert out["key"] == "\ufffdnot json" and out["kid"] is None and out["src"] == "\ufffdok"
    assert run(view, None, RecordMeta())["key"] is None


def test_header_values_are_text() -> None:
    meta = RecordMeta(headers=[("n", b"5")])
    assert keeps("SELECT * FROM t WHERE record.header.n = '5'", None, meta)
    assert not keeps("SELECT * FROM t WHERE record.header.n = 5", None, meta)


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT record FROM t", "record"),
        ("SELECT * FROM t WHERE record.topic = 'x'", "unknown record metadata"),
        ("SELECT * FROM t WHERE record.offset.x = 1", "unknown record metadata"),
        ("SELECT * FROM t WHERE record.header = 'x'", "record.header.<name>"),
        ("SELECT * FROM t WHERE record.header.a.b = 'x'", "record.header.<name>"),
    ],
)
def test_bad_metadata_names(sql: str, message: str) -> None:
    with pytest.raises(ViewSqlError, match=message):
        compile_view(sql)


# -- semantics


@pytest.mark.parametrize(
    ("condition", "value", "kept"),
    [
        # NULL and missing
        ("a = 1", {}, False),
        ("NOT (a = 1)", {}, False),
        ("a <> 1", {"a": None}, False),
        ("a IS NULL", {}, True),
        ("a IS NULL", {"a": None}, True),
        ("a IS NOT NULL", {"a": 0}, True),
        # three-valued AND / OR / NOT
        ("a = 1 OR b = 1", {"b": 1}, True),
        ("NOT (a = 1 AND b = 1)", {"b": 2}, True),
        ("NOT (a = 1 AND b = 1)", {"b": 1}, False),
        ("NOT (a = 1 OR b = 1)", {"b": 2}, False),
        # kinds: equality across kinds is FALSE, ordering across kinds is NULL
        ("a = 1", {"a": "1"}, False),
        ("a <> 1", {"a": "1"}, True),
        ("a = 1", {"a": True}, False),
        ("a <> 0", {"a": False}, True),
        ("a = 1", {"a": 1.0}, True),
        ("a = TRUE", {"a": 1}, False),
        ("a <> TRUE", {"a": 1}, True),
        ("NOT (a > 1)", {"a": "x"}, False),
        ("NOT (a < 'b')", {"a": 1}, False),
        ("a < 'b'", {"a": "B"}, True),
        ("a > FALSE", {"a": True}, True),
        ("a = b", {"a": [1, {"x": None}], "b": [1.0, {"x": None}]}, True),
        ("a = b", {"a": [True], "b": [1]}, False),
        ("a <> b", {"a": {"x": 1}, "b": {"x": 1, "y": 2}}, True),
        ("NOT (a < b)", {"a": [1], "b": [2]}, False),
        # a bare value as a condition
        ("a", {"a": True}, True),
        ("a", {"a": 1}, False),
        ("NOT a", {"a": False}, True),
        ("NOT a", {"a": "false"}, False),
        # IN
        ("a IN (1, 2)", {"a": 2.0}, True),
        ("a NOT IN (1, 2)", {"a": 3}, True),
        ("a NOT IN (1, 2)", {"a": "1"}, True),
        ("a NOT IN (1, NULL)", {"a": 3}, False),
        ("a IN (1, NULL)", {"a": 1}, True),
        ("a NOT IN (1, 2)", {}, False),
        ("a IN ('x', 1, TRUE)", {"a": True}, True),
        ("a IN (b, c)", {"a": 1, "c": 1}, True),
        # BETWEEN
        ("a BETWEEN 1 AND 3", {"a": 3}, True),
        ("a NOT BETWEEN 1 AND 3", {"a": 4}, True),
        ("a NOT BETWEEN 1 AND 3", {"a": "2"}, False),
        # IS TRUE / FALSE
        ("a IS TRUE", {"a": True}, True),
        ("a IS NOT TRUE", {"a": None}, True),
        ("a IS FALSE", {"a": 0}, False),
        ("(a > 1) IS FALSE", {"a": 0}, True),
    ],
)
def test_conditions(condition: str, value: dict[str, Any], kept: bool) -> None:
    assert keeps(f"SELECT * FROM t WHERE {condition}", value) is kept


@pytest.mark.parametrize(
    ("condition", "value", "kept"),
    [
        ("s LIKE 'ab%'", "abc", True),
        ("s LIKE 'ab%'", "xabc", False),
        ("s LIKE 'a_c'", "abc", True),
        ("s LIKE 'a_c'", "abbc", False),
        ("s LIKE 'a.c'", "abc", False),
        ("s LIKE 'a.c'", "a.c", True),
        ("s LIKE '%'", "line\nbreak", True),
        ("s LIKE 'ABC'", "abc", False),
        ("s ILIKE 'ABC'", "abc", True),
        ("s NOT LIKE 'a%'", "ba", True),
        ("s LIKE '10!%' ESCAPE '!'", "10%", True),
        ("s LIKE '10!%' ESCAPE '!'", "100", False),
        ("s REGEXP 'b+'", "abbc", True),
        ("s REGEXP '^b'", "abc", False),
        ("s REGEXP 'B'", "abc", False),
        ("REGEXP_LIKE(s, 'B', 'i')", "abc", True),
        ("REGEXP_LIKE(s, '^[0-9]{3}$')", "123", True),
        ("s NOT REGEXP 'z'", "abc", True),
    ],
)
def test_patterns(condition: str, value: str, kept: bool) -> None:
    assert keeps(f"SELECT * FROM t WHERE {condition}", {"s": value}) is kept


def test_patterns_need_strings() -> None:
    assert not keeps("SELECT * FROM t WHERE s LIKE '1%'", {"s": 12})
    assert not keeps("SELECT * FROM t WHERE NOT (s LIKE '1%')", {"s": 12})
    assert not keeps("SELECT * FROM t WHERE NOT (s REGEXP '1')", {"s": 12})


def test_arithmetic() -> None:
    view = compile_view("SELECT a + b AS add, a - b AS sub, a * b AS mul, a / b AS div, a % b AS mod, -a AS neg FROM t")
    assert run(view, {"a": 7, "b": 2}) == {"add": 9, "sub": 5, "mul": 14, "div": 3.5, "mod": 1, "neg": -7}
    assert run(view, {"a": -7, "b": 2})["mod"] == -1
    assert run(view, {"a": 7, "b": -2})["mod"] == 1
    assert run(view, {"a": 7.5, "b": 2})["mod"] == 1.5
    assert run(view, {"a": 1, "b": 0}) == {"add": 1, "sub": 1, "mul": 0, "div": None, "mod": None, "neg": -1}
    assert run(view, {"a": "1", "b": 1}) == dict.fromkeys(("add", "sub", "mul", "div", "mod", "neg"))
    assert run(view, {"a": True, "b": 1})["add"] is None
    big = run(view, {"a": 2**63, "b": 2**63})
    assert big["add"] == 2.0**64 and isinstance(big["add"], float)
    assert run(view, {"a": 1e308, "b": 10})["mul"] is None  # not finite
    orjson.dumps(big)


def test_case() -> None:
    view = compile_view(
        "SELECT CASE WHEN amount > 1000 THEN 'big' WHEN amount > 100 THEN 'medium' ELSE 'small' END AS size, "
        "CASE currency WHEN 'EUR' THEN 1 WHEN 'USD' THEN 2 END AS code FROM t"
    )
    assert run(view, {"amount": 5000, "currency": "USD"}) == {"size": "big", "code": 2}
    assert run(view, {"amount": 500}) == {"size": "medium", "code": None}
    assert run(view, {"amount": "x", "currency": "EUR"}) == {"size": "small", "code": 1}


def test_current_values() -> None:
    assert (CTX.timestamp.ms, CTX.timestamp.iso) == (NOW_MS, "2024-05-01T10:30:15.123Z")
    assert (CTX.date.ms, CTX.date.iso) == (1714521600000, "2024-05-01")
    assert (CTX.time.ms, CTX.time.iso) == (37815123, "10:30:15.123")
    view = compile_view("SELECT CURRENT_TIMESTAMP AS ts, CURRENT_DATE AS d, CURRENT_TIME AS t FROM x")
    assert view.uses_now and not view.needs_value
    assert run(view, None) == {"ts": "2024-05-01T10:30:15.123Z", "d": "2024-05-01", "t": "10:30:15.123"}
    fresh = now_context()
    assert abs(fresh.timestamp.ms - datetime.now(UTC).timestamp() * 1000) < 5000


@pytest.mark.parametrize(
    ("condition", "value", "kept"),
    [
        ("record.timestamp > CURRENT_TIMESTAMP - 3600000", {}, True),
        ("record.timestamp >= CURRENT_DATE", {}, True),
        ("record.timestamp < CURRENT_DATE", {}, False),
        ("ts < CURRENT_TIMESTAMP", {"ts": "2024-05-01T10:30:15Z"}, True),
        ("ts < CURRENT_TIMESTAMP", {"ts": "2024-05-01T12:30:15+02:00"}, True),
        ("ts < CURRENT_TIMESTAMP", {"ts": "2024-05-01T12:30:16"}, False),
        ("ts = CURRENT_DATE", {"ts": "2024-05-01"}, True),
        ("ts = CURRENT_DATE", {"ts": "2024-05-01T00:00:00Z"}, True),
        ("ts = CURRENT_DATE", {"ts": "2024-05-02"}, False),
        ("ts <> CURRENT_DATE", {"ts": "not a date"}, True),
        ("NOT (ts < CURRENT_DATE)", {"ts": "not a date"}, False),
        ("ts < CURRENT_TIME", {"ts": "09:00"}, True),
        ("ts < CURRENT_TIME", {"ts": "10:00:00-01:00"}, False),
        ("ts > CURRENT_TIMESTAMP", {"ts": NOW_MS + 1}, True),
        ("ts = CURRENT_TIMESTAMP", {"ts": True}, False),
        ("CURRENT_DATE < CURRENT_TIMESTAMP", {}, True),
        ("NOT (CURRENT_TIME < CURRENT_TIMESTAMP)", {}, False),
    ],
)
def test_current_comparisons(condition: str, value: dict[str, Any], kept: bool) -> None:
    meta = RecordMeta(timestamp=NOW_MS - 60_000)
    assert keeps(f"SELECT * FROM t WHERE {condition}", value, meta) is kept


def test_boolean_values_in_projections() -> None:
    view = compile_view(
        "SELECT a > 1 AS gt, NOT a > 1 AS ngt, a > 1 AND b AS both, a > 1 OR b AS either, a IS NULL AS isnull, "
        "a IN (1, 2) AS isin, s LIKE 'x%' AS like FROM t"
    )
    assert run(view, {"a": 2, "b": None, "s": "xy"}) == {
        "gt": True, "ngt": False, "both": None, "either": True, "isnull": False, "isin": True, "like": True,
    }  # fmt: skip
    assert run(view, {"a": "2", "b": False}) == {
        "gt": None, "ngt": None, "both": False, "either": None, "isnull": False, "isin": False, "like": None,
    }  # fmt: skip


# -- records the view cannot transform


@pytest.mark.parametrize("value", [None, [1, 2], "text", 3, True])
def test_value_must_be_an_object_when_read(value: Any) -> None:
    view = compile_view("SELECT id FROM t")
    with pytest.raises(ViewRecordError, match="not a JSON object"):
        run(view, value)
    with pytest.raises(ViewRecordError):
        run(compile_view("SELECT * FROM t WHERE a = 1"), value)
    assert run(compile_view("SELECT record.offset FROM t"), value, RecordMeta(offset=1)) == {"offset": 1}


# -- refused statements


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT a FROM t JOIN u ON t.a = u.a", "unsupported SQL: JOIN"),
        ("SELECT a FROM t, u", "unsupported SQL: JOIN"),
        ("SELECT a FROM t GROUP BY a", "unsupported SQL: GROUP BY"),
        ("SELECT a FROM t ORDER BY a", "unsupported SQL: ORDER BY"),
        ("SELECT a FROM t LIMIT 10", "unsupported SQL: LIMIT"),
        ("SELECT DISTINCT a FROM t", "unsupported SQL: DISTINCT"),
        ("WITH x AS (SELECT 1) SELECT a FROM x", "unsupported SQL: WITH"),
        ("SELECT a FROM t WHERE a IN (SELECT b FROM u)", "unsupported SQL: subquery"),
        ("SELECT a FROM (SELECT a FROM t)", "unsupported SQL: subquery in FROM"),
        ("SELECT a FROM t WHERE EXISTS (SELECT 1 FROM u)", "unsupported SQL: EXISTS"),
        ("SELECT a FROM t WHERE SUBSTRING(a, 1, 2) = 'x'", "unsupported function: SUBSTRING"),
        ("SELECT a FROM t WHERE LOWER(a) = 'x'", "unsupported function: LOWER"),
        ("SELECT a FROM t WHERE my_udf(a) = 1", "unsupported function: MY_UDF"),
        ("SELECT a FROM t WHERE NOW() > 1", "unsupported function: NOW (use CURRENT_TIMESTAMP)"),
        ("SELECT COUNT(*) AS n FROM t", "unsupported aggregate function: COUNT"),
        ("SELECT SUM(a) AS n FROM t", "unsupported aggregate function: SUM"),
        ("SELECT a FROM t; SELECT b FROM t", "unsupported SQL: multiple statements"),
        ("SELECT a FROM t UNION SELECT b FROM u", "unsupported SQL: UNION"),
        ("INSERT INTO t VALUES (1)", "unsupported SQL: INSERT statement"),
        ("DELETE FROM t WHERE a = 1", "unsupported SQL: DELETE statement"),
        ("UPDATE t SET a = 1", "unsupported SQL: UPDATE statement"),
        ("DROP TABLE t", "unsupported SQL: DROP statement"),
        ("CREATE TABLE t (a INT)", "unsupported SQL: CREATE statement"),
        ("SELECT a FROM t AS x", "unsupported SQL: table alias"),
        ("SELECT CAST(a AS INT) AS b FROM t", "unsupported SQL: CAST"),
        ("SELECT a || b AS c FROM t", "unsupported SQL: || (string concatenation)"),
        ("SELECT a FROM t WHERE a LIKE b", "unsupported SQL: LIKE with a pattern that is not a string literal"),
        ("SELECT a FROM t WHERE a REGEXP b", "unsupported SQL: REGEXP with a pattern"),
        ("SELECT a FROM t WHERE a = ?", "unsupported SQL: parameter placeholder"),
        ("SELECT a FROM t WHERE a = INTERVAL '1' DAY", "unsupported SQL: INTERVAL"),
        ("SELECT a + 1 FROM t", "SELECT item without a name"),
        ("SELECT a, b.a FROM t", "duplicate output field: 'a'"),
        ("SELECT *, * FROM t", "unsupported SQL: * given twice"),
        ("SELECT t.* FROM t", "unsupported SQL: qualified *"),
        ("SELECT a FROM t WHERE a REGEXP '('", "invalid regular expression"),
        ("SELECT a FROM t WHERE REGEXP_LIKE(a, 'x', 'q')", "unsupported REGEXP_LIKE flag"),
        ("SELECT a FROM t WHERE a > 1e400", "number literal out of range"),
        ("SELECT a FROM", "invalid SQL"),
        ("SELECT a FROM t WHERE a = 'unterminated", "invalid SQL"),
        ("", "invalid SQL: empty statement"),
        ("  ;  ", "invalid SQL: empty statement"),
        ("SELECT a", "invalid SQL: missing FROM"),
    ],
)
def test_refused(sql: str, message: str) -> None:
    with pytest.raises(ViewSqlError, match=re.escape(message)):
        compile_view(sql)


def test_error_messages_have_no_terminal_escapes() -> None:
    with pytest.raises(ViewSqlError) as info:
        compile_view("SELECT a FROM WHERE")
    assert "\x1b" not in str(info.value)
    assert str(info.value).startswith("invalid SQL: ")


def test_generated_source_is_inspectable() -> None:
    view = compile_view("SELECT a FROM t WHERE a > 1")
    assert view.source.startswith("def _view(v, m, ctx):")
    assert repr(view) == "CompiledView('SELECT a FROM t WHERE a > 1')"


def test_names_and_strings_cannot_inject_code() -> None:
    view = compile_view(
        """SELECT "x'); import os; ('" AS "y'z\\n", record.header."h'"
        FROM t WHERE "a""b" = 'c''d' AND "p q" LIKE '%''%'"""
    )
    out = run(view, {"x'); import os; ('": 1, 'a"b': "c'd", "p q": "'"}, RecordMeta(headers=[("h'", b"v")]))
    assert out == {"y'z\\n": 1, "h'": "v"}


def test_long_and_deep_statements() -> None:
    n = 500
    view = compile_view("SELECT * FROM t WHERE " + " AND ".join(f"a{i} = {i}" for i in range(n)))
    assert view.transform({f"a{i}": i for i in range(n)}, None, None) is KEEP  # too deep for the reference
    assert view.transform({f"a{i}": i for i in range(n - 1)}, None, None) is None
    with pytest.raises(ViewSqlError, match="nested too deeply"):
        compile_view("SELECT " + "a + " * 400 + "a AS x FROM t")
    with pytest.raises(ViewSqlError, match="nested too deeply"):
        compile_view("SELECT * FROM t WHERE " + "(" * 400 + "a = 1" + ")" * 400)
