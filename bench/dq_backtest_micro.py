"""Backtest throughput of the data-quality plugin: records evaluated per second, broker I/O excluded.

    python bench/dq_backtest_micro.py [--seconds 1] [--repeats 5] [--records 200000] [--tansu]

A backtest (``kanal_dataquality.backtest``) runs a policy over a topic's records with the plan's
generated record loop, the one the live policy runs on produced batches. Timed here:

* ``backtest job``: a whole :class:`~kanal_dataquality.backtest.BacktestJob` (offset resolution, the
  fetch loop, windows, counts, samples, its yields to other tasks) over ``--records`` records held
  in memory as a broker's Fetch answers would carry them (batches of 500 records, answers of up to
  1 MiB, parsed by the gateway's codec as the job's reader parses them): everything but the broker;
* ``evaluation only``: the same batches through ``Evaluation.batch`` alone;
* ``reference path``: the same records through the gateway's record decoder and ``evaluate`` (what
  the loop replaces), for comparison.

The records are the throughput benchmark's 200-byte JSON values (``bench/kanalbench``), every one
passing; the policy has three rules: the benchmark's 3-clause CEL rule, its JSON schema, and a CEL
``matches()`` on the name. ``--tansu`` adds the end-to-end figure: the same job reading the records
from a Tansu broker (written there first) with the gateway's own Kafka client.

Prints the median records per second of ``--repeats`` runs (each at least ``--seconds``), the range
beside it.
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
for sub in (ROOT.parent / "core", ROOT.parent / "plugins", ROOT):
    if str(sub) not in sys.path:
        sys.path.insert(0, str(sub))

import trio  # noqa: E402
from kanal_dataquality.backtest import BacktestJob, BacktestRequest, Evaluation, Range  # noqa: E402
from kanal_dataquality.evaluate import evaluate  # noqa: E402
from kanal_dataquality.policies import CompiledPolicy, compile_policy  # noqa: E402
from kanal_dataquality.rules import compile_rule  # noqa: E402
from kanalbench.dataquality_scenario import CEL, SCHEMA  # noqa: E402
from kanalbench.worker import values as bench_values  # noqa: E402

from kanal.protocol.records import Record, RecordSet, encode_batch  # noqa: E402

PER_BATCH = 500
FETCH_BYTES = 1024 * 1024
TOPIC = "bench-backtest"
NAME_RULE = "value.name.matches('^user-[0-9]+$')"


def policy() -> CompiledPolicy:
    rules = {
        "cel": compile_rule("cel", {"type": "Cel", "celExpression": CEL}),
        "schema": compile_rule("schema", {"type": "JsonSchema", "schema": SCHEMA}),
        "name": compile_rule("name", {"type": "Cel", "celExpression": NAME_RULE}),
    }
    manifest = {
        "metadata": {"name": "bench", "group": "bench"},
        "spec": {"rules": list(rules), "targets": [{"cluster": "gateway", "topic": TOPIC}], "actions": {}},
    }
    return compile_policy(manifest, rules, frozenset())


def record_values(count: int) -> list[bytes]:
    return (bench_values(200, "json") * (count // 1024 + 1))[:count]


def batches(values: list[bytes]) -> list[bytes]:
    """The records as a producer's batches of :data:`PER_BATCH`, with the offsets a broker gives them."""
    out = []
    for start in range(0, len(values), PER_BATCH):
        chunk = values[start : start + PER_BATCH]
        records = [Record(offset_delta=i, timestamp_delta=i, value=v) for i, v in enumerate(chunk)]
        out.append(encode_batch(records, base_offset=start, base_timestamp=1_700_000_000_000))
    return out


class MemoryReader:
    """The job's reader over batches in memory: each Fetch answers the batches from the position, up to
    1 MiB, parsed as the job's reader parses a broker's answer."""

    def __init__(self, encoded: list[bytes], count: int) -> None:
        self.count = count
        self.watermarks: dict[tuple[str, int], tuple[int, int, int]] = {}
        self.chunks: list[tuple[int, bytes]] = []  # (first offset, concatenated batches)
        current: list[bytes] = []
        first = 0
        for i, batch in enumerate(encoded):
            if current and sum(map(len, current)) + len(batch) > FETCH_BYTES:
                self.chunks.append((first, b"".join(current)))
                current, first = [], i * PER_BATCH
            current.append(batch)
        self.chunks.append((first, b"".join(current)))
        self.starts = [c[0] for c in self.chunks]

    async def list_offsets(
        self, partitions: Iterable[tuple[str, int]], timestamp: int, isolation_level: int = 0
    ) -> Any:
        return {tp: (0 if timestamp == -2 else self.count) for tp in partitions}

    async def fetch(
        self, positions: dict[tuple[str, int], int], max_wait: float = 0.5, partition_bytes: int = 0
    ) -> Any:
        out = {}
        for tp, position in positions.items():
            self.watermarks[tp] = (0, self.count, self.count)
            if position >= self.count:
                out[tp] = (RecordSet.parse(None), position)
                continue
            index = bisect.bisect_right(self.starts, position) - 1
            records = RecordSet.parse(self.chunks[index][1])
            out[tp] = (records, records.batches[-1].next_offset)
        return out

    async def aclose(self) -> None:
        pass


def request(count: int) -> BacktestRequest:
    return BacktestRequest(
        policy="bench",
        draft=None,
        topic=TOPIC,
        virtual_cluster=None,
        partitions=None,
        range=Range("offsets", offsets={0: (None, None)}),
        max_records=count,
        max_seconds=600.0,
        samples=20,
    )


def job_run(compiled: CompiledPolicy, reader: Any, count: int) -> float:
    """Records per second of one backtest job over ``reader``'s records."""
    job = BacktestJob(request(count), compiled, TOPIC, [0], reader)
    trio.run(job.run)
    assert job.state == "done" and job.evaluation.evaluated == count, (job.state, job.error, job.evaluation.evaluated)
    assert job.evaluation.violations == 0
    return count / job.elapsed


def rate(fn: Callable[[], int], seconds: float) -> float:
    """Records per second of ``fn`` (which answers how many it evaluated), run for at least ``seconds``."""
    done, start = 0, time.perf_counter()
    while True:
        done += fn()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return done / elapsed


def show(label: str, samples: list[float]) -> None:
    print(
        f"  {label:34} {statistics.median(samples):>10,.0f} records/s"
        f"  ({min(samples):,.0f} to {max(samples):,.0f}; {1e6 / statistics.median(samples):.2f} us per record)"
    )


def tansu_runs(compiled: CompiledPolicy, values: list[bytes], repeats: int) -> list[float]:
    """The job reading the records from a Tansu broker with the gateway's own Kafka client."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from kanal_dataquality.observe import ClusterReader

    from kanal.admin.cli import CommandLine
    from kanal.embedded import TansuBroker

    broker = TansuBroker()
    broker.start(timeout=30)
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)])[TOPIC].result(30)
        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "linger.ms": 5,
                "batch.size": 1_000_000,
                "batch.num.messages": PER_BATCH,
                "enable.idempotence": False,
                "queue.buffering.max.messages": 1_000_000,
            }
        )
        for value in values:
            while True:
                try:
                    producer.produce(TOPIC, value=value, partition=0)
                    break
                except BufferError:
                    producer.poll(0.01)
        assert producer.flush(120) == 0
        out = []
        for _ in range(repeats):
            client = CommandLine({"KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap}).kafka()
            out.append(job_run(compiled, ClusterReader(client), len(values)))
            trio.run(client.aclose)
        return out
    finally:
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--tansu", action="store_true", help="also read the records from a Tansu broker")
    args = parser.parse_args()

    compiled = policy()
    values = record_values(args.records)
    assert all(len(v) == 200 for v in values[:10]) and json.loads(values[0])
    encoded = batches(values)
    reader = MemoryReader(encoded, args.records)
    parsed = [RecordSet.parse(b).batches[0] for b in encoded]

    def evaluation_only() -> int:
        evaluation = Evaluation(compiled)
        for batch in parsed:
            evaluation.batch(0, batch, 0, batch.records_count)
        assert evaluation.violations == 0
        return evaluation.evaluated

    plan = Evaluation(compiled).plan

    def reference() -> int:
        for data in encoded:
            assert not evaluate(plan, RecordSet.parse(data).batches[0].records()).violations
        return args.records

    def job() -> int:
        job_run(compiled, reader, args.records)
        return args.records

    runs: dict[str, list[float]] = {"backtest job": [], "evaluation only": [], "reference path": []}
    for _ in range(args.repeats):
        runs["backtest job"].append(rate(job, args.seconds))
        runs["evaluation only"].append(rate(evaluation_only, args.seconds))
        runs["reference path"].append(rate(reference, args.seconds))
    print(
        f"{args.records} records of 200-byte JSON, 3-rule policy, {PER_BATCH} per batch, "
        f"{args.repeats} repeats of at least {args.seconds:g} s, median"
    )
    for label, samples in runs.items():
        show(label, samples)
    if args.tansu:
        show("backtest job reading from Tansu", tansu_runs(compiled, values, args.repeats))


if __name__ == "__main__":
    main()
