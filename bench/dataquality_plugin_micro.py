"""Microbenchmark of the data-quality plugin's per-record path, as the interceptor runs it.

Standalone (no broker, no gateway): ``PYTHONPATH=core:plugins python bench/dataquality_plugin_micro.py``.

What is timed is ``kanal_dataquality.batches.scan_batches`` on record batches built with the
gateway's codec (``encode_batch``, 500 records per batch, uncompressed): the generated scanner walks
the batch bytes, decodes each value with orjson, runs the rules and decides per policy (mark on; every
record passes, the common case). The records come from the core's compiled record walk: the values
(``kanal.api.record_values``) when rules read only the value, else where each record's parts are
(``kanal.api.record_spans``); the same loop over the walk's pure-Python reference (an install without
a C compiler) is timed too. Two workloads:

* ``orders``: the records of ``bench/dataquality_micro.py`` (about 200-byte JSON orders with three
  headers), its 3-clause CEL rule (one clause reads a header) and its order JSON schema;
* ``bench``: the records of the throughput scenario (``bench/kanalbench``'s 200-byte JSON values, no
  headers) with its 3-clause CEL rule and JSON schema (``dataquality-throughput``).

Prints the median µs per record over ``--repeats`` runs, and the same work through the gateway's own
record decoder (``RecordBatch.records()``) for comparison.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
for sub in (ROOT.parent / "core", ROOT.parent / "plugins", ROOT):
    if str(sub) not in sys.path:
        sys.path.insert(0, str(sub))

from dataquality_micro import CEL_RULE, SCHEMA, make_records  # noqa: E402
from kanal_dataquality import scan as scan_module  # noqa: E402
from kanal_dataquality.batches import scan_batches  # noqa: E402
from kanal_dataquality.evaluate import evaluate  # noqa: E402
from kanal_dataquality.policies import Plan, build_plan, compile_policy  # noqa: E402
from kanal_dataquality.rules import compile_rule  # noqa: E402
from kanal_dataquality.scan import compile_scanner  # noqa: E402
from kanalbench.dataquality_scenario import CEL as BENCH_CEL  # noqa: E402
from kanalbench.dataquality_scenario import SCHEMA as BENCH_SCHEMA  # noqa: E402
from kanalbench.worker import values as bench_values  # noqa: E402

from kanal.protocol.records import Record, RecordSet, encode_batch  # noqa: E402
from kanal.protocol.records.values import python_record_spans, python_record_values  # noqa: E402

PER_BATCH = 500


def plan_for(cel: str, schema: dict[str, Any]) -> Plan:
    rules = {
        "cel": compile_rule("cel", {"type": "Cel", "celExpression": cel}),
        "schema": compile_rule("schema", {"type": "JsonSchema", "schema": schema}),
    }
    manifest = {
        "metadata": {"name": "p", "group": "g"},
        "spec": {
            "rules": ["cel", "schema"],
            "targets": [{"cluster": "gateway", "topic": "t"}],
            "actions": {"mark": {"enabled": True}},
        },
    }
    return build_plan([compile_policy(manifest, rules, frozenset())])


def batches_of(items: list[tuple[bytes, list[tuple[str, bytes]]]]) -> list[bytes]:
    out = []
    for start in range(0, len(items), PER_BATCH):
        chunk = items[start : start + PER_BATCH]
        records = [Record(offset_delta=i, value=v, headers=list(h)) for i, (v, h) in enumerate(chunk)]
        out.append(encode_batch(records, base_timestamp=1_700_000_000_000))
    return out


def without_compiled_walk(plan: Plan) -> Plan:
    """The plan with its loop compiled as on an install without the C extension."""
    # The scanner reads these names from its module at compile time; swap them there for the call.
    compiled = scan_module.record_values, scan_module.record_spans  # type: ignore[attr-defined]
    scan_module.record_values, scan_module.record_spans = python_record_values, python_record_spans  # type: ignore[attr-defined]
    try:
        return dataclasses.replace(plan, scanner=compile_scanner(plan))
    finally:
        scan_module.record_values, scan_module.record_spans = compiled  # type: ignore[attr-defined]


def median_us(fn: Callable[[], None], count: int, repeats: int) -> float:
    fn()
    gc.collect()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / count / 1000.0)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    orders = [
        (raw, [("x-source", b"web"), ("trace-id", b"%016x" % i), ("content-type", b"application/json")])
        for i, (raw, _h) in enumerate(make_records(args.records))
    ]
    bench: list[tuple[bytes, list[tuple[str, bytes]]]] = [
        (v, []) for v in (bench_values(200, "json") * (args.records // 1024 + 1))[: args.records]
    ]
    workloads = {
        "orders (3 headers, CEL reads one)": (orders, plan_for(CEL_RULE, SCHEMA)),
        "bench (no headers)": (bench, plan_for(BENCH_CEL, BENCH_SCHEMA)),
    }
    print(f"{args.records} records per workload, {PER_BATCH} per batch, {args.repeats} repeats, median µs/record")
    for label, (items, plan) in workloads.items():
        data = batches_of(items)
        size = sum(len(v) for v, _ in items) / len(items)
        for batches in (RecordSet.parse(d).batches for d in data):  # every record passes: the common case
            result = scan_batches(plan, batches)
            assert result.blocked is None and not result.violations, result

        def plugin(data: list[bytes] = data, plan: Plan = plan) -> None:
            for d in data:
                scan_batches(plan, RecordSet.parse(d).batches)

        pure = without_compiled_walk(plan)

        def python_walk(data: list[bytes] = data, plan: Plan = pure) -> None:
            for d in data:
                scan_batches(plan, RecordSet.parse(d).batches)

        def codec(data: list[bytes] = data, plan: Plan = plan) -> None:
            for d in data:
                evaluate(plan, RecordSet.parse(d).batches[0].records())

        rows = [
            ("plugin scanner: decode + CEL + schema", plugin),
            ("same, the walk in Python", python_walk),
            ("gateway codec records() + evaluate", codec),
        ]
        print(f"  {label}, {size:.0f} B values")
        for name, fn in rows:
            print(f"    {name:42} {median_us(fn, len(items), args.repeats):6.2f} µs")


if __name__ == "__main__":
    main()
