"""The generated record loop of JSON views (``kanal_topicviews.fastloop``) against the general loop.

The two must give the same bytes for every batch, or fail at the same record with the same reason
and the same records delivered before it: generated batches mix keys, headers, null and non-JSON
values, offset and timestamp deltas and sizes whose varints take one, two and three bytes.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kanal_topicviews import fastloop
from kanal_topicviews.sql import compile_view
from kanal_topicviews.transform import FetchFailed, Transformer

from kanal.protocol.records import GZIP, NONE, Record, RecordBatch, RecordSet, encode_batch

STATEMENTS = [
    "SELECT id, name, amount FROM t WHERE amount >= 500 AND name <> 'user-7'",
    "SELECT id, amount, customer.tier AS tier FROM orders WHERE amount > 100 AND currency = 'EUR'",
    "SELECT * FROM orders WHERE amount > 100",
    "SELECT * FROM orders WHERE NOT (amount > 100) OR currency <> 'EUR' OR note LIKE 'a%'",
    "SELECT *, customer.tier AS tier FROM t WHERE customer.id = 'c' OR items[0] = 1",
    "SELECT id, note FROM t",
    "SELECT CASE WHEN amount > 100 THEN 'big' ELSE 'small' END AS size, CURRENT_DATE AS d FROM t "
    "WHERE note < CURRENT_DATE OR amount IS NULL",
]

FIELDS = ["id", "name", "amount", "currency", "customer", "items", "note"]
scalars = (
    st.none()
    | st.booleans()
    | st.sampled_from([0, 1, 99, 100, 101, 500, 501, 2.5, "EUR", "USD", "user-7", "user-8", "a", "ab", "c", ""])
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(FIELDS), inner, max_size=3),
    max_leaves=5,
)
objects = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=7)
# sizes around the limits of one- and two-byte varints (64 and 8192)
pads = st.sampled_from([0, 0, 0, 40, 70, 8_150, 8_200, 20_000])


@st.composite
def values(draw: Any) -> bytes | None:
    kind = draw(st.sampled_from(["object"] * 6 + ["null", "not json", "array", "empty", "number"]))
    if kind == "object":
        value = draw(objects)
        pad = draw(pads)
        if pad:
            value["pad"] = "x" * pad
        return orjson.dumps(value)
    return {"null": None, "not json": b"{oops", "array": b"[1, 2]", "empty": b"", "number": b"7"}[kind]


keys = st.none() | st.sampled_from([b"", b"k", b"k" * 70, b"k" * 9_000])
headers = st.sampled_from([[], [], [("h", b"v")], [("h", None), ("trace", b"t" * 100)]])


@st.composite
def batches(draw: Any) -> bytes:
    n = draw(st.integers(1, 12))
    offset = draw(st.sampled_from([0, 0, 60, 8_000, 2_000_000]))
    records = []
    for _ in range(n):
        ts = draw(st.sampled_from([0, 1, -1, 63, 64, 8_191, 8_192, 10**9]))
        records.append(Record(offset, ts, draw(keys), draw(values()), draw(headers)))
        offset += draw(st.sampled_from([1, 1, 1, 5, 100, 10_000]))
    codec = draw(st.sampled_from([NONE, NONE, NONE, GZIP]))
    return encode_batch(records, base_offset=1000, base_timestamp=1_700_000_000_000, compression=codec)


def outcome(transformer: Transformer, data: bytes) -> tuple[str, Any]:
    try:
        return ("records", transformer.fetch(data, 0, 1000))
    except FetchFailed as failed:
        return ("failed", (failed.offset, failed.reason, failed.records))


@pytest.mark.parametrize("statement", STATEMENTS)
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(batches(), min_size=1, max_size=3))
def test_generated_loop_agrees_with_the_general_loop(statement: str, parts: list[bytes]) -> None:
    view = compile_view(statement)
    data = b"".join(parts)
    for drop in (True, False):
        inline = Transformer(view, drop)
        general = Transformer(view, drop, inline=False)
        assert outcome(inline, data) == outcome(general, data), fastloop.source(view, drop)


def test_which_views_get_a_generated_loop() -> None:
    def bad(*_: Any) -> Exception:
        return ValueError()

    for statement in STATEMENTS:
        assert fastloop.build(compile_view(statement), True, bad) is not None, statement
    for statement in (
        "SELECT * FROM t",
        "SELECT id FROM t WHERE record.partition = 0",
        "SELECT record.key AS k FROM t",
    ):
        assert fastloop.build(compile_view(statement), True, bad) is None, statement


@pytest.mark.parametrize("statement", [STATEMENTS[0], STATEMENTS[2]])
def test_a_malformed_batch_with_a_valid_crc_is_unreadable_in_both_loops(statement: str) -> None:
    """A batch whose records do not add up (here the second record's length one byte short, the CRC
    made right again) is refused by the record walk: dropped whole, or the fetch fails at its start."""
    records = [Record(i, 0, None, orjson.dumps({"id": i, "amount": 900, "name": "x"})) for i in range(3)]
    batch = RecordBatch(encode_batch(records, base_offset=1000, base_timestamp=1))
    area = bytearray(batch.to_bytes()[61:])
    second = area[0] // 2 + 1  # the first record's length is one byte: the second record starts there
    area[second] -= 2  # its length, one less
    data = batch.with_records(bytes(area), 3)
    view = compile_view(statement)
    for inline in (True, False):
        dropped = RecordSet.parse(Transformer(view, True, inline=inline).fetch(data, 0, 1000)).batches
        assert [(b.base_offset, b.records_count, b.next_offset) for b in dropped] == [(1000, 0, 1003)]
        with pytest.raises(FetchFailed) as failed:
            Transformer(view, False, inline=inline).fetch(data, 0, 1000)
        assert (failed.value.offset, failed.value.reason, failed.value.records) == (
            1000,
            "the record batch is malformed",
            None,
        )
