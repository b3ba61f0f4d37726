"""Generated view code against the AST-walking reference interpreter, on generated records.

For each query, every generated (value, metadata, clock) must get the same answer from both:
the same exception (``ViewRecordError``), ``None``, ``KEEP``, or the same projected JSON (compared
as orjson bytes, so ``1`` vs ``1.0`` and ``true`` vs ``1`` differ, and the output must serialize).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kanal_topicviews.sql import KEEP, RecordMeta, ViewContext, ViewRecordError, compile_view, now_context
from kanal_topicviews.sql.reference import evaluate

QUERIES = [
    # the brief's query
    "SELECT id, amount, customer.tier AS tier FROM orders WHERE amount > 100 AND currency = 'EUR'",
    # NOT / OR over NULLs and mismatched kinds
    "SELECT * FROM orders WHERE NOT (amount > 100) OR currency <> 'EUR' OR NOT (note < 'b')",
    # arithmetic
    "SELECT id, amount * 2 AS dbl, amount / n AS q, amount % n AS m, -amount AS neg, amount + n AS s, "
    "amount - 0.5 AS f FROM t WHERE amount - 1 >= 0 OR n IS NULL OR n * n = 4",
    # IN lists: strings, numbers, mixed, with NULL, of paths
    "SELECT * FROM t WHERE currency IN ('EUR', 'USD') AND amount NOT IN (1, 2.5, 100) OR flag IN (TRUE, NULL) "
    "OR n IN (1, 'ab', FALSE) OR note NOT IN ('ab', NULL) OR amount IN (n, customer.id)",
    # LIKE / ILIKE / REGEXP
    "SELECT note FROM t WHERE note LIKE 'a%' OR note NOT LIKE '_b%' OR note ILIKE 'AB_' "
    "OR id REGEXP '^ord-[0-9]+$' OR REGEXP_LIKE(note, 'B', 'i') OR NOT (currency LIKE '%U%')",
    # CASE, searched and simple
    "SELECT CASE WHEN amount > 100 THEN 'big' WHEN amount IS NULL THEN NULL WHEN flag THEN flag ELSE 'small' END "
    "AS size, CASE currency WHEN 'EUR' THEN 1 WHEN n THEN 2 END AS code, "
    "CASE WHEN note >= CURRENT_DATE THEN CURRENT_DATE END AS d FROM t",
    # metadata
    "SELECT record.key AS k, record.key.id AS kid, record.partition, record.offset, record.timestamp AS ts, "
    "record.header.\"x-source\" AS src FROM t WHERE record.partition = 1 OR record.header['x-source'] = 'web' "
    "OR record.key.id = 1 OR record.key = 'abc' OR record.header.trace IS NOT NULL",
    # CURRENT_* against numbers, strings, metadata
    "SELECT CURRENT_DATE AS d, CURRENT_TIMESTAMP AS now, CURRENT_TIME AS t, CURRENT_TIMESTAMP - ts AS age FROM t "
    "WHERE record.timestamp > CURRENT_TIMESTAMP - 86400000 AND (ts < CURRENT_TIMESTAMP OR note >= CURRENT_DATE "
    "OR note = CURRENT_TIME OR ts = CURRENT_DATE OR NOT (CURRENT_TIME > note))",
    # comparisons of every pair of kinds, projected as values
    "SELECT amount = currency AS e, amount <> flag AS ne, amount < note AS lt, customer = items AS deep, "
    "flag >= FALSE AS b, items <> customer.id AS x, note <= n AS le FROM t",
    # * with more fields, indexes, bool-vs-number literals
    "SELECT *, customer.tier AS tier, items[1] AS second FROM t WHERE customer.id = 'c' OR items[0] = 1 "
    "OR items[0] = 0 OR flag = 1 OR flag <> 0 OR items[0] <> 1.0",
    # BETWEEN, IS [NOT] TRUE/FALSE/NULL
    "SELECT * FROM t WHERE (amount BETWEEN 1 AND 100 OR n NOT BETWEEN -1 AND 1) AND flag IS NOT TRUE "
    "AND (note IS NOT NULL OR flag IS FALSE OR (amount > 3) IS NOT FALSE)",
    # boolean values in the projection
    "SELECT amount > 100 AND currency = 'EUR' AS a, amount > 100 OR NOT flag AS b, NOT (note LIKE '%a%') AS c, "
    "amount IN (1, 2) AS d, note IN ('ab', NULL) AS e, flag IS NULL AS f, NOT flag AS g FROM t",
    # shared path prefixes (hoisted), a bare condition
    "SELECT customer.id, customer.tier FROM t WHERE customer.tier = 'gold' AND customer.id <> 'x' "
    "OR customer IS NULL OR flag",
    # literals on the left, constants, NULL comparisons
    "SELECT * FROM t WHERE 100 < amount AND 'EUR' = currency OR 0 = n OR amount = NULL OR 1 = 1 AND NULL IS NULL "
    "AND TRUE <> flag",
    # numbers on both sides
    "SELECT * FROM t WHERE record.offset + 1 > amount * 2 OR record.offset = n - 1 OR -n < record.partition "
    "OR 5 > CURRENT_TIMESTAMP OR amount / 2 <= record.timestamp % 1000",
]

FIELDS = ["id", "amount", "currency", "customer", "items", "flag", "note", "ts", "n", "tier"]
NOW = datetime(2024, 5, 1, 10, 30, 15, 123000, tzinfo=UTC)
NOW_MS = 1714559415123
DAY = 86_400_000

strings = st.sampled_from(
    ["EUR", "USD", "gold", "c", "ab", "abc", "aBc", "xby", "", "x-y", "2024-05-01", "2024-04-30",
     "2024-05-01T10:00:00Z", "2024-05-01T12:30:15+02:00", "10:00:00", "11:00", "ord-12", "ord-x", "1", "b"]
) | st.text(alphabet="abAB%_.1-\n", max_size=4)  # fmt: skip
numbers = (
    st.sampled_from([0, 1, -1, 2, 3, 4, 100, 101, 150, 2.5, 100.0, 1.0, 0.0, -0.0, 0.5, 2**63, 2**64 - 1, -(2**63)])
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.integers(NOW_MS - 2 * DAY, NOW_MS + 2 * DAY)
)
scalars = st.none() | st.booleans() | numbers | strings
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(FIELDS), inner, max_size=3),
    max_leaves=6,
)
objects = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8)
values = st.one_of(objects, objects, objects, json_values)
header_values = st.none() | st.sampled_from([b"web", b"app", b"", b"\xff\xfeweb"])
metas = st.builds(
    RecordMeta,
    key=st.none() | st.sampled_from([b'{"id": 1}', b'{"id": "a"}', b"[1]", b"abc", b"\xff", b"1"]),
    partition=st.integers(0, 3),
    offset=st.integers(0, 2**40),
    timestamp=st.integers(NOW_MS - 2 * DAY, NOW_MS + DAY),
    headers=st.lists(st.tuples(st.sampled_from(["x-source", "trace", "X-Source"]), header_values), max_size=4),
)
contexts = st.just(now_context(NOW)) | st.builds(
    now_context, st.datetimes(min_value=datetime(2024, 4, 29), max_value=datetime(2024, 5, 3), timezones=st.just(UTC))
)


def answer(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        out = fn(*args)
    except ViewRecordError:
        return ("error", None)
    if out is None:
        return ("filtered", None)
    if out is KEEP:
        return ("keep", None)
    return ("output", orjson.dumps(out))


@pytest.mark.parametrize("sql", QUERIES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=values, meta=metas, ctx=contexts)
def test_generated_code_agrees_with_reference(sql: str, value: Any, meta: RecordMeta, ctx: ViewContext) -> None:
    view = compile_view(sql)
    expected = answer(evaluate, view.query, value, meta, ctx)
    got = answer(view.transform, value, meta, ctx)
    assert got == expected, f"{sql}\nvalue={value!r}\nmeta={meta!r}\n{view.source}"


def test_queries_are_not_trivial() -> None:
    """Over a fixed sample, every query keeps some records and filters (or errors on) others."""
    import random

    rnd = random.Random(7)
    sample = [
        {"id": f"ord-{i}", "amount": rnd.choice([50, 150, "150", None, 100.5]), "currency": rnd.choice(["EUR", "USD"]),
         "customer": {"id": rnd.choice(["c", "x"]), "tier": rnd.choice(["gold", "silver"])}, "items": [1, 0],
         "flag": rnd.choice([True, False, None, 1]), "note": rnd.choice(["ab", "xby", "2024-05-02", None]),
         "ts": rnd.choice([NOW_MS - 1000, "2024-05-01T10:00:00Z", "2024-05-01"]), "n": rnd.choice([1, 2, None])}
        for i in range(200)
    ]  # fmt: skip
    ctx = now_context(NOW)
    for sql in QUERIES:
        view = compile_view(sql)
        kinds = {
            answer(view.transform, v, RecordMeta(partition=i % 3, timestamp=NOW_MS - i * 1000), ctx)[0]
            for i, v in enumerate(sample)
        }
        assert kinds & {"keep", "output"}, sql


# -- every comparison form, on a small domain where equal and mismatched values are frequent

_MISSING = object()
DOMAIN = [_MISSING, None, True, False, 0, 1, 1.0, -1, 2, 2.5, -0.0, 2**63, 2**64 - 1, -(2**63), 1e308, -1e308,
          NOW_MS, NOW_MS - 1, NOW_MS - 0.5, 1714521600000, 37815123,
          "a", "b", "B", "", "1", "2024-05-01", "2024-05-01T10:30:15.123Z", "10:30:15.123", "x%",
          [1], [1.0], [True], [None], {"x": 1}, {"x": 1.0}, {"x": None}]  # fmt: skip
OPERANDS = ["1", "0", "1.0", "-1", "2.5", "'b'", "'1'", "TRUE", "FALSE", "NULL", "b", "b + 1", "-b", "record.offset",
            "CURRENT_DATE", "CURRENT_TIMESTAMP", "CURRENT_TIME", "record.header.h", "c[0]", "c.x",
            "CURRENT_TIMESTAMP - 1", "CURRENT_DATE + 0.5", "CURRENT_TIME - b"]  # fmt: skip
CONDITIONS = [
    f"{lhs} {op} {rhs}" for lhs in ("a", "c[0]") for op in ("=", "<>", "<", "<=", ">", ">=") for rhs in OPERANDS
]
CONDITIONS += [f"{rhs} {op} a" for op in ("=", "<>", "<", "<=", ">", ">=") for rhs in OPERANDS]
CONDITIONS += [
    "a IN (1, 2)", "a IN ('a', 'b')", "a IN (TRUE)", "a IN (1, 'a')", "a IN (1, NULL)", "a IN (b, c)",
    "a IN (CURRENT_DATE, 1)", "c IN (1, 2)",
    "a LIKE 'a%'", "a LIKE '_'", "a ILIKE 'b'", "a REGEXP '^[ab]$'", "a LIKE 'x!%' ESCAPE '!'",
    "a IS NULL", "a IS TRUE", "a IS FALSE", "a", "a AND b", "a OR b", "a BETWEEN 0 AND 2", "a BETWEEN b AND c",
    "a + b > 2", "a * b = 2", "a / b >= 1", "a % b = 0", "a - b < 0", "-a = b", "a + b = CURRENT_TIMESTAMP",
    "CASE a WHEN 1 THEN TRUE WHEN 'a' THEN FALSE END", "CASE WHEN a THEN b ELSE c END",
    "record.key = a", "record.key.x = a", "record.timestamp >= a", "record.partition <> a",
]  # fmt: skip
SMALL_VIEWS = [compile_view(f"SELECT * FROM t WHERE {c}") for c in CONDITIONS]
SMALL_VIEWS += [compile_view(f"SELECT * FROM t WHERE NOT ({c})") for c in CONDITIONS]
SMALL_VIEWS += [compile_view(f"SELECT {c} AS x FROM t") for c in CONDITIONS]
SMALL_VIEWS += [compile_view("SELECT a + b AS s, a - b AS d, a * b AS p, a / b AS q, a % b AS r, -a AS n FROM t")]
SMALL_VIEWS += [compile_view(f"SELECT *, {lhs} AS z FROM t") for lhs in OPERANDS]
small = st.sampled_from(DOMAIN)
present = st.sampled_from(DOMAIN[1:])
small_objects = st.fixed_dictionaries({"a": small, "b": small, "c": small | st.lists(present, max_size=2)}).map(
    lambda d: {k: v for k, v in d.items() if v is not _MISSING}
)
small_metas = st.builds(
    RecordMeta,
    key=st.none() | st.sampled_from([b"a", b"1", b'{"x": 1}', b'{"x": "a"}']),
    offset=st.sampled_from([0, 1, 2]),
    partition=st.sampled_from([0, 1]),
    timestamp=st.sampled_from([NOW_MS - 1, NOW_MS, NOW_MS + 1, 1714521600000, 1]),
    headers=st.sampled_from([[], [("h", b"a")], [("h", b"1"), ("h", None)], [("h", None), ("h", b"b")]]),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=small_objects, meta=small_metas)
def test_every_comparison_form_agrees(value: dict[str, Any], meta: RecordMeta) -> None:
    ctx = now_context(NOW)
    for view in SMALL_VIEWS:
        expected = answer(evaluate, view.query, value, meta, ctx)
        got = answer(view.transform, value, meta, ctx)
        assert got == expected, f"{view.statement}\nvalue={value!r}\nmeta={meta!r}\n{view.source}"
