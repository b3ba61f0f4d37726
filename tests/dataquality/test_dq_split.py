"""Large batches split with a helper process give what one pass in the gateway gives.

``scan_batches`` (one pass in the gateway) is the reference for ``scan_batches_split`` (the first records
checked by a real helper process meanwhile): same evaluated count, same violations in the same order,
and the same blocking violation, wherever the failing records fall.
"""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import trio
from kanal_dataquality import batches as batches_module
from kanal_dataquality.batches import check_part, new_helper, scan_batches, scan_batches_split
from kanal_dataquality.evaluate import BatchResult
from kanal_dataquality.policies import Plan, build_plan, compile_policy, order_policies
from kanal_dataquality.rules import compile_rule

from kanal.api import (
    LZ4,
    NONE,
    HelperProcess,
    Record,
    RecordBatch,
    RecordSet,
    encode_batch,
    encode_varint,
    records_area,
    skip_records,
)

RULES = {
    "positive": compile_rule("positive", {"type": "Cel", "celExpression": "value.amount > 0"}),
    "euro": compile_rule("euro", {"type": "Cel", "celExpression": "value.currency.matches('^(EUR|USD)$')"}),
    "shape": compile_rule(
        "shape",
        {
            "type": "JsonSchema",
            "schema": {"type": "object", "required": ["amount"], "properties": {"amount": {"type": "integer"}}},
        },
    ),
}


def plan(*policies: tuple[str, list[str], str]) -> Plan:
    compiled = []
    for name, rules, action in policies:
        manifest = {
            "metadata": {"name": name, "group": "g"},
            "spec": {
                "rules": rules,
                "targets": [{"cluster": "gateway", "topic": "t"}],
                "actions": {action: {"enabled": True}},
            },
        }
        compiled.append(compile_policy(manifest, RULES, frozenset()))
    return build_plan(order_policies(compiled))


MARK = plan(("marked", ["positive", "euro"], "mark"), ("shaped", ["shape"], "mark"))
BLOCK = plan(("blocked", ["positive"], "block"), ("shaped", ["shape"], "mark"))

GOOD = {"amount": 5, "currency": "EUR", "pad": "x" * 150}


def batch_of(values: list[bytes], compression: int = NONE) -> RecordBatch:
    records = [Record(offset_delta=i, value=v) for i, v in enumerate(values)]
    return RecordSet.parse(encode_batch(records, base_timestamp=1, compression=compression)).batches[0]


def values_with(bad: dict[int, Any], count: int = 400) -> list[bytes]:
    out = [orjson.dumps({**GOOD, "i": i}) for i in range(count)]
    for index, value in bad.items():
        if index >= count:
            continue
        out[index] = value if isinstance(value, bytes) else orjson.dumps({**GOOD, **value})
    return out


def summary(result: BatchResult) -> Any:
    def one(v: Any) -> Any:
        return (v.policy, v.index, v.rules, v.outcomes, v.record is not None)

    return result.evaluated, one(result.blocked) if result.blocked else None, [one(v) for v in result.violations]


@pytest.fixture
def helper(monkeypatch: pytest.MonkeyPatch) -> Iterator[HelperProcess]:
    monkeypatch.setattr(batches_module, "MIN_SPLIT", 1024)  # the test batches are tens of KB
    process = new_helper()
    assert trio.run(process.ready)
    yield process
    process.close()


def both(the_plan: Plan, parts: list[RecordBatch], helper: HelperProcess) -> tuple[Any, Any]:
    reference = summary(scan_batches(the_plan, parts))
    split = trio.run(scan_batches_split, the_plan, parts, helper)
    return summary(split), reference


def test_violations_in_both_parts_come_in_record_order(helper: HelperProcess) -> None:
    rnd = random.Random(5)
    cases: list[dict[int, Any]] = [
        {},
        {0: {"amount": -1}, 399: {"currency": "GBP"}},
        {10: {"amount": "x"}, 200: b"not json", 201: {"amount": 0, "currency": 7}, 350: {"amount": 1.5}},
        {i: {"amount": -i} for i in rnd.sample(range(400), 40)},
    ]
    for bad in cases:
        parts = [batch_of(values_with(bad)), batch_of(values_with(bad, 300), LZ4), batch_of(values_with(bad, 3))]
        split, reference = both(MARK, parts, helper)
        assert split == reference
        assert len(reference[2]) >= len(bad)
    assert helper.started  # the large batches were split


def test_compressed_batches_are_measured_decompressed(helper: HelperProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batches_module, "MIN_SPLIT", 64 * 1024)
    calls: list[bool] = []
    run = helper.run

    async def counted(job: Any, part: bytes | memoryview, local: Any) -> Any:
        answer = await run(job, part, local)
        calls.append(answer[1] is not None)
        return answer

    monkeypatch.setattr(helper, "run", counted)
    large = batch_of(values_with({3: {"amount": -1}, 900: {"currency": "GBP"}}, 1000), LZ4)
    assert large.size < 64 * 1024 and len(records_area(large)[0]) > 64 * 1024  # small only compressed
    split, reference = both(MARK, [large], helper)
    assert split == reference and calls == [True]
    small = batch_of(values_with({3: {"amount": -1}}, 100), LZ4)
    split, reference = both(MARK, [small], helper)
    assert split == reference and calls == [True]  # not worth a helper's part


def test_the_first_blocking_record_decides_wherever_it_is(helper: HelperProcess) -> None:
    for bad in ({5: {"amount": -1}, 390: {"amount": -2}}, {390: {"amount": -2}}, {5: {"amount": -1}}, {3: b"[]"}):
        bad = {**bad, 1: {"amount": 1.5}}  # breaks only the marking policy
        split, reference = both(BLOCK, [batch_of(values_with(bad))], helper)
        assert split == reference and split[1] is not None
        assert split[1][1] == min(i for i in bad if i != 1)  # (policy, index, ...) of the first blocked record


def test_a_batch_the_loop_cannot_walk_goes_to_the_codec(helper: HelperProcess) -> None:
    data = bytearray(batch_of(values_with({}, 400)).to_bytes())
    # the tenth record's length one byte short: the fields no longer fill it (the codec refuses it too)
    start = 61
    p = skip_records(bytes(data), start, 9, len(data))
    length = (data[p] & 0x7F | data[p + 1] << 7) >> 1
    data[p : p + 2] = encode_varint(length - 1)
    broken = RecordSet.parse(bytes(data)).batches
    with pytest.raises(ValueError) as one_pass:
        scan_batches(MARK, broken)
    with pytest.raises(ValueError) as split:
        trio.run(scan_batches_split, MARK, broken, helper)
    assert type(split.value) is type(one_pass.value)
    assert check_part([[[r.type, r.source] for r in MARK.rules], 10], bytes(data[start:])) == b"!"


def test_without_the_helper_process_the_gateway_does_it_all(helper: HelperProcess) -> None:
    bad = {7: {"amount": -1}, 300: {"currency": "GBP"}}
    parts = [batch_of(values_with(bad))]
    split, reference = both(MARK, parts, helper)
    assert split == reference and helper.usable
    os.kill(helper._process.pid, signal.SIGKILL)
    helper._process.join(5)
    split, reference = both(MARK, parts, helper)
    assert split == reference and not helper.usable


def test_skip_records_follows_length_prefixes() -> None:
    lengths = [1, 5, 63, 64, 100, 8191, 8192, 100_000, 3]
    data = b"".join(encode_varint(n) + b"x" * n for n in lengths)
    for k in range(len(lengths) + 1):
        assert skip_records(data, 0, k, len(data)) == sum(len(encode_varint(n)) + n for n in lengths[:k])
    for bad in (0, -1, -100, -100_000):
        with pytest.raises(ValueError):
            skip_records(encode_varint(bad) + b"xx", 0, 1, 3)
    with pytest.raises(ValueError):  # the last record runs past the end given
        skip_records(data, 0, len(lengths), len(data) - 1)
