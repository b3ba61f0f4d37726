"""Micro-benchmark of the topic-view SQL path, per record, in this process (no broker, no gateway).

    python bench/topicviews_micro.py [--records 1000] [--repeats 7]

Records are JSON orders of about 200 bytes (as in the library measurements). The "view path" is
what a fetch does per record: ``orjson.loads`` of the value, the view's ``transform``, and
``orjson.dumps`` of a projected output (a ``SELECT *`` keeps the original bytes). The "fetch path"
is the whole of ``Transformer.fetch`` (record framing, parsing, statement, writing the kept records,
batch CRCs) on the ``topicview-throughput`` scenario's records and statement: 25,000 records of
200 bytes in batches of 5,000, once with the generated loop (the statement inlined, what JSON views
run) and once with the general loop (one call of the statement per record). Each figure is the
median over ``--repeats`` runs of the whole batch, in microseconds per record (the minimum beside it).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for sub in ("plugins", "core"):
    if str(ROOT / sub) not in sys.path:
        sys.path.insert(0, str(ROOT / sub))

import orjson  # noqa: E402
from kanal_topicviews.sql import KEEP, RecordMeta, compile_view, now_context  # noqa: E402
from kanal_topicviews.sql.reference import evaluate  # noqa: E402
from kanal_topicviews.transform import Transformer  # noqa: E402
from kanalbench.worker import values as bench_values  # noqa: E402

from kanal.protocol.records import Record, encode_batch  # noqa: E402

Q1 = "SELECT id, amount, customer.tier AS tier FROM orders WHERE amount > 100 AND currency = 'EUR'"
Q2 = (
    "SELECT * FROM orders WHERE (customer.tier IN ('gold', 'silver') OR amount >= 1000) AND NOT (channel LIKE 'te%') "
    "AND REGEXP_LIKE(id, '^ord-[0-9]+$') AND note IS NOT NULL AND record.header['x-source'] = 'web' "
    "AND ts BETWEEN 0 AND CURRENT_TIMESTAMP AND currency NOT IN ('JPY')"
)
Q3 = "SELECT * FROM orders WHERE record.header.\"x-source\" = 'web' AND record.timestamp > CURRENT_TIMESTAMP - 3600000"
#: the statement of the topicview-throughput scenario
QB = "SELECT id, name, amount FROM bench WHERE amount >= 500 AND name <> 'user-7'"


def make_records(n: int, seed: int = 1) -> list[tuple[bytes, RecordMeta]]:
    rnd = random.Random(seed)
    now = int(time.time() * 1000)
    out = []
    for i in range(n):
        value = {
            "id": f"ord-{i:08d}",
            "amount": round(rnd.uniform(0, 2000), 1),
            "currency": rnd.choice(["EUR", "EUR", "USD", "GBP"]),
            "customer": {"id": f"c-{rnd.randrange(1000)}", "tier": rnd.choice(["gold", "silver", "bronze"])},
            "items": rnd.randrange(1, 10),
            "channel": rnd.choice(["web", "app", "test"]),
            "ts": now - rnd.randrange(7_200_000),
            "note": "y" * rnd.randrange(20, 40),
        }
        headers = [("x-source", rnd.choice([b"web", b"app"])), ("trace-id", b"abc123"), ("content-type", b"json")]
        out.append((orjson.dumps(value), RecordMeta(None, 0, i, value["ts"], headers)))  # type: ignore[arg-type]
    return out


def bench_batches(records: int = 25_000, per_batch: int = 5_000) -> bytes:
    """The throughput scenario's 200-byte JSON values, as a fetched partition: batches of ``per_batch``
    records (no key, no headers, small timestamp deltas), as the benchmark's producer writes them."""
    vals = bench_values(200, "json")
    out = []
    for base in range(0, records, per_batch):
        batch = [Record(i, i // 50, None, vals[(base + i) % len(vals)]) for i in range(per_batch)]
        out.append(encode_batch(batch, base_offset=base, base_timestamp=1_700_000_000_000))
    return b"".join(out)


def bench(fn: Callable[[], object], per: int, repeats: int) -> str:
    """'median (min)' of ``repeats`` timed calls of ``fn``, in µs per item (``per`` items a call)."""
    fn()  # warm-up
    gc.collect()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / per / 1000.0)
    return f"{statistics.median(samples):8.3f} ({min(samples):7.3f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    n, repeats = args.records, args.repeats
    records = make_records(n)
    raws = [raw for raw, _ in records]
    values = [orjson.loads(raw) for raw in raws]
    ctx = now_context()
    loads, dumps = orjson.loads, orjson.dumps
    print(f"records: {n}, mean value size {sum(map(len, raws)) / n:.0f} B, µs/record: median (min) of {repeats} runs")

    def view_path(statement: str) -> tuple[Callable[[], object], float]:
        view = compile_view(statement)
        transform, needs_meta = view.transform, view.needs_meta

        def run() -> int:
            kept = 0
            for raw, meta in records:
                out = transform(loads(raw), meta if needs_meta else None, ctx)
                if out is None:
                    continue
                kept += 1
                if out is not KEEP:
                    dumps(out)
            return kept

        return run, run() / n

    t_compile = bench(lambda: compile_view(Q1), 1, repeats)
    t_ctx = bench(now_context, 1, repeats)
    print(f"compile_view(Q1)                         {t_compile} µs (once per view)")
    print(f"now_context()                            {t_ctx} µs (once per batch)")
    print(f"orjson.loads alone                       {bench(lambda: [loads(r) for r in raws], n, repeats)}")

    v1 = compile_view(Q1)
    t1 = v1.transform
    print(f"Q1 transform only (parsed values)        {bench(lambda: [t1(v, None, ctx) for v in values], n, repeats)}")
    ref = v1.query
    print(
        "Q1 reference interpreter (parsed values) "
        f"{bench(lambda: [evaluate(ref, v, None, ctx) for v in values], n, repeats)}"
    )
    for label, statement in (("Q1", Q1), ("Q2", Q2), ("Q3", Q3)):
        run, rate = view_path(statement)
        t = bench(run, n, repeats)
        print(f"{label} view path: loads+transform+dumps    {t}   (kept {rate:.0%}; target <= 3 µs)")
    data = bench_batches()
    for label, inline in (("generated loop", True), ("general loop", False)):
        transformer = Transformer(compile_view(QB), True, inline=inline)
        t = bench(partial(transformer.fetch, data, 0, 0), 25_000, repeats)
        print(f"QB fetch path, {label:15s}         {t}   (kept 49%; target <= 3 µs)")
    print(f"\nQ1 = {Q1}\nQ2 = {Q2}\nQ3 = {Q3}\nQB = {QB}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
