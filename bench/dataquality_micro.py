"""Microbenchmark of the data-quality per-record path: decode + CEL, decode + schema, decode + both.

Standalone (no broker, no gateway): ``PYTHONPATH=core:plugins python bench/dataquality_micro.py``.
Records are about 200-byte JSON orders with three headers, the CEL rule has three clauses and the schema
is a realistic order schema. Each measurement runs ``--records`` distinct records ``--repeats`` times and
prints the median µs per record (the harness of shared/reference/library-measurements.md).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
for sub in ("core", "plugins"):
    if str(ROOT / sub) not in sys.path:
        sys.path.insert(0, str(ROOT / sub))

from kanal_dataquality.cel import compile_cel, headers_map  # noqa: E402
from kanal_dataquality.jsonschema_rule import compile_schema  # noqa: E402

CEL_RULE = "value.amount > 0 && value.currency.matches('^(EUR|USD|GBP)$') && headers['x-source'] == 'web'"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "amount", "currency", "customer", "items", "channel", "ts"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "string", "pattern": "^ord-[0-9]{8}$"},
        "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000000},
        "currency": {"enum": ["EUR", "USD", "GBP"]},
        "customer": {
            "type": "object",
            "required": ["id"],
            "properties": {"id": {"type": "string"}, "tier": {"enum": ["gold", "silver", "bronze"]}},
        },
        "items": {"type": "integer", "minimum": 1},
        "channel": {"type": "string", "maxLength": 16},
        "ts": {"type": "integer", "minimum": 0},
        "note": {"type": "string", "maxLength": 200},
    },
}


def make_records(n: int, seed: int = 7) -> list[tuple[bytes, dict[str, str]]]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        doc = {
            "id": f"ord-{i:08d}",
            "amount": round(rnd.uniform(1, 5000), 2),
            "currency": rnd.choice(["EUR", "USD", "GBP"]),
            "customer": {"id": f"c-{rnd.randrange(1000)}", "tier": rnd.choice(["gold", "silver", "bronze"])},
            "items": rnd.randrange(1, 10),
            "channel": "web",
            "ts": 1_700_000_000_000 + i,
            "note": "y" * rnd.randrange(35, 55),
        }
        raw_headers = [
            ("x-source", b"web"),
            ("trace-id", f"{rnd.getrandbits(64):016x}".encode()),
            ("content-type", b"application/json"),
        ]
        out.append((orjson.dumps(doc), headers_map(raw_headers)))
    return out


def bench(fn: Callable[[], None], per: int, repeats: int) -> float:
    """Median µs per record over ``repeats`` runs of ``fn`` (which processes ``per`` records)."""
    fn()  # warm-up
    gc.collect()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / per / 1000.0)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    records = make_records(args.records)
    avg_size = sum(len(raw) for raw, _ in records) / len(records)
    rule = compile_cel(CEL_RULE)
    schema = compile_schema(SCHEMA)
    loads = orjson.loads
    evaluate = rule.evaluate
    validate = schema.evaluate
    for raw, headers in records:  # every record passes both rules: the common case
        value = loads(raw)
        assert evaluate(None, value, headers).passed, value
        assert validate(value).passed, validate(value)

    def decode() -> None:
        for raw, _h in records:
            loads(raw)

    def decode_cel() -> None:
        for raw, h in records:
            evaluate(None, loads(raw), h)

    def decode_schema() -> None:
        for raw, _h in records:
            validate(loads(raw))

    def decode_both() -> None:
        for raw, h in records:
            value = loads(raw)
            evaluate(None, value, h)
            validate(value)

    values = [loads(raw) for raw, _ in records]

    def cel_only() -> None:
        for value, (_raw, h) in zip(values, records, strict=True):
            evaluate(None, value, h)

    def schema_only() -> None:
        for value in values:
            validate(value)

    print(f"records: {len(records)} of {avg_size:.0f} B JSON, {args.repeats} repeats, median µs/record")
    print(f"CEL rule: {CEL_RULE}  (fast path: {rule.fast})")
    n, r = len(records), args.repeats
    rows = [
        ("orjson.loads", decode),
        ("CEL rule only (parsed values)", cel_only),
        ("schema only (parsed values)", schema_only),
        ("orjson.loads + CEL", decode_cel),
        ("orjson.loads + schema", decode_schema),
        ("orjson.loads + CEL + schema", decode_both),
    ]
    for label, fn in rows:
        print(f"  {label:34} {bench(fn, n, r):6.2f} µs")
    print(f"  records decided by cel-python (fallback): {rule.fallbacks} (expected 0)")


if __name__ == "__main__":
    main()
