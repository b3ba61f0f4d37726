"""Backtests and shadow mode without a network: request checks, windows of batches (offset gaps, time
ranges, timestamp types, control batches, deleted records, the record bound), topic naming in virtual
clusters, and shadow counts through the history topic's records.

A backtest job reads from :class:`Partition`, an in-memory reader with the interface of the plugin's
``ClusterReader`` (ListOffsets, Fetch of whole batches from a position), so every offset and timestamp
is chosen by the test.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable
from typing import Any, cast

import orjson
import pytest
import trio
import trio.testing
from kanal_dataquality.backtest import (
    DEFAULT_LATEST,
    DEFAULT_MAX_RECORDS,
    MAX_RECORDS,
    BacktestJob,
    BacktestJobs,
    BacktestRequest,
    Evaluation,
    Range,
    parse_request,
    parse_time,
)
from kanal_dataquality.backtest_routes import stored_topic
from kanal_dataquality.batches import scan_range
from kanal_dataquality.evaluate import evaluate
from kanal_dataquality.history import History, Reporter
from kanal_dataquality.interceptor import DataQualityInterceptor
from kanal_dataquality.policies import CompiledPolicy, compile_policy
from kanal_dataquality.resources import Checks, canonical_policy, canonical_rule, resource_kinds
from kanal_dataquality.rules import compile_rule

from kanal.api import (
    Connection,
    GatewayServices,
    LogRecord,
    Record,
    RecordsContext,
    RecordSet,
    ResourceError,
    encode_batch,
)
from kanal.api.interceptor import validate_config
from kanal.testing import FakeServices

T0 = 1_700_000_000_000
GOOD = {"amount": 5, "currency": "EUR"}
NEGATIVE = {"amount": -1, "currency": "EUR"}
DOLLARS = {"amount": 2, "currency": "USD"}


def compiled_policy(rules: dict[str, str], *, block: bool = False) -> CompiledPolicy:
    compiled = {name: compile_rule(name, {"type": "Cel", "celExpression": cel}) for name, cel in rules.items()}
    manifest = {
        "metadata": {"name": "p", "group": "g"},
        "spec": {
            "rules": list(rules),
            "targets": [{"cluster": "gateway", "topic": "orders"}],
            "actions": {"block": {"enabled": block}},
        },
    }
    return compile_policy(manifest, compiled, frozenset())


POLICY = compiled_policy({"positive": "value.amount > 0", "euro": "value.currency == 'EUR'"}, block=True)


# -- an in-memory partition --------------------------------------------------------------------------------


def batch(
    base_offset: int, values: list[Any], *, deltas: list[int] | None = None, seconds: list[int] | None = None, **kw: Any
) -> bytes:
    """A batch at ``base_offset``; record i has offset delta ``deltas[i]`` (default i) and the timestamp
    ``T0 + seconds[i]`` s (default its offset)."""
    deltas = deltas or list(range(len(values)))
    seconds = seconds or [base_offset + d for d in deltas]
    base_ts = T0 + seconds[0] * 1000
    records = [
        Record(
            offset_delta=d,
            timestamp_delta=T0 + s * 1000 - base_ts,
            key=f"k{base_offset + d}".encode(),
            value=v if isinstance(v, bytes) else orjson.dumps(v),
        )
        for d, s, v in zip(deltas, seconds, values, strict=True)
    ]
    return encode_batch(records, base_offset=base_offset, base_timestamp=base_ts, **kw)


class Partition:
    """Partition 0 of topic ``orders``: batches in memory; a Fetch answers every batch from the one that
    holds the position (as brokers do, whole batches), ``per_fetch`` at a time."""

    def __init__(self, batches: Iterable[bytes], *, log_start: int = 0, per_fetch: int = 2, failing: int = 0) -> None:
        self.batches = [(RecordSet.parse(b).batches[0], b) for b in batches]
        self.log_start = log_start
        self.per_fetch = per_fetch
        self.failing = failing  # the first fetches of records answer NOT_LEADER_OR_FOLLOWER (left out)
        self.errors: dict[tuple[str, int], int] = {}
        self.metadata = 0
        self.end = self.batches[-1][0].next_offset if self.batches else 0
        self.watermarks: dict[tuple[str, int], tuple[int, int, int]] = {}
        self.fetches = 0
        self.timestamps: list[int] = []  # ListOffsets by timestamp asked

    async def list_offsets(
        self, partitions: Iterable[tuple[str, int]], timestamp: int, isolation_level: int = 0
    ) -> dict[tuple[str, int], int]:
        if timestamp >= 0:
            self.timestamps.append(timestamp)
        answer = {-2: self.log_start, -1: self.end}.get(timestamp, 0)  # by time: "0", as Tansu answers
        return {tp: answer for tp in partitions}

    async def fetch(
        self, positions: dict[tuple[str, int], int], max_wait: float = 0.5, partition_bytes: int = 0
    ) -> dict[tuple[str, int], tuple[RecordSet, int]]:
        self.fetches += 1
        out: dict[tuple[str, int], tuple[RecordSet, int]] = {}
        for tp, position in positions.items():
            if partition_bytes > 1 and self.failing:
                self.failing -= 1
                self.errors[tp] = 6
                continue
            self.watermarks[tp] = (self.log_start, self.end, self.end)
            if position < self.log_start:
                out[tp] = (RecordSet.parse(None), self.log_start)  # out of range: on from the log start
                continue
            ends = [b.next_offset for b, _ in self.batches]
            i = bisect.bisect_right(ends, position)
            chosen = [raw for _, raw in self.batches[i : i + self.per_fetch]]
            records = RecordSet.parse(b"".join(chosen) or None)
            out[tp] = (records, max([position] + [b.next_offset for b in records.batches]))
        return out

    async def partitions(self, topic: str) -> tuple[int, list[int]]:
        self.metadata += 1
        return 0, [0]

    async def aclose(self) -> None:
        pass


def request(rng: Range, *, max_records: int = DEFAULT_MAX_RECORDS, samples: int = 20) -> BacktestRequest:
    return BacktestRequest(
        policy="p",
        draft=None,
        topic="orders",
        virtual_cluster=None,
        partitions=None,
        range=rng,
        max_records=max_records,
        max_seconds=60.0,
        samples=samples,
    )


def run(partition: Partition, rng: Range, policy: CompiledPolicy = POLICY, **kw: Any) -> dict[str, Any]:
    job = BacktestJob(request(rng, **kw), policy, "orders", [0], cast(Any, partition))
    trio.run(job.run)
    assert job.state == "done", job.error
    out: dict[str, Any] = job.as_json()
    return out


def offsets(job: dict[str, Any]) -> list[int]:
    return [s["offset"] for s in job["report"]["samples"]]


ALL = Range("offsets", offsets={0: (None, None)})


# -- the request ---------------------------------------------------------------------------------------


def refused(body: Any, why: str) -> None:
    with pytest.raises(ResourceError) as raised:
        parse_request(body)
    assert raised.value.status == 400 and why in raised.value.msg, raised.value.msg


def test_request_defaults_bounds_and_errors() -> None:
    request = parse_request({"policy": "p", "topic": " orders "})
    assert (request.policy, request.draft, request.topic) == ("p", None, "orders")
    assert request.range == Range("latest", latest=DEFAULT_LATEST)
    assert (request.max_records, request.max_seconds, request.samples) == (DEFAULT_MAX_RECORDS, 60.0, 20)
    draft = {"apiVersion": "v1", "kind": "DataQualityPolicy"}
    assert parse_request({"policy": draft, "topic": "t"}).draft == draft
    offsets_range = parse_request({"policy": "p", "topic": "t", "range": {"offsets": {"1": {"start": 3}, "0": {}}}})
    assert offsets_range.range.offsets == {1: (3, None), 0: (None, None)}
    times = parse_request({"policy": "p", "topic": "t", "range": {"from": "2023-11-14T22:13:20Z", "to": T0 + 5}})
    assert (times.range.start_ms, times.range.end_ms) == (T0, T0 + 5)
    assert parse_time("2023-11-14T22:13:20", "x") == T0  # UTC when it says nothing
    assert parse_time("2023-11-14T23:13:20+01:00", "x") == T0
    assert parse_request({"policy": "p", "topic": "t", "partitions": [2, 0, 2]}).partitions == (0, 2)

    refused([], "must be a JSON object")
    refused({"policy": "p", "topic": "t", "extra": 1}, "unknown field 'extra'")
    refused({"topic": "t"}, "policy is required")
    refused({"policy": "p"}, "topic is required")
    refused({"policy": "p", "topic": "t", "range": {"latest": 0}}, "range.latest must be between 1 and")
    refused({"policy": "p", "topic": "t", "range": {"latest": 1, "offsets": {}}}, "exactly one of")
    refused({"policy": "p", "topic": "t", "range": {"offsets": {}}}, "must name partitions")
    refused({"policy": "p", "topic": "t", "range": {"offsets": {"x": {}}}}, "the partition must be an integer")
    refused({"policy": "p", "topic": "t", "range": {"offsets": {"0": {"start": 5, "end": 2}}}}, "before start")
    refused({"policy": "p", "topic": "t", "range": {"offsets": {"0": {"begin": 5}}}}, "range.offsets['0']")
    refused({"policy": "p", "topic": "t", "range": {"from": "yesterday"}}, "ISO-8601")
    refused({"policy": "p", "topic": "t", "range": {"from": T0, "to": T0 - 1}}, "before range.from")
    refused({"policy": "p", "topic": "t", "range": {"until": 1}}, "unknown range field 'until'")
    refused({"policy": "p", "topic": "t", "maxRecords": MAX_RECORDS + 1}, "maxRecords must be between 1 and")
    refused({"policy": "p", "topic": "t", "maxSeconds": 0}, "maxSeconds")
    refused({"policy": "p", "topic": "t", "maxSeconds": True}, "maxSeconds")
    refused({"policy": "p", "topic": "t", "samples": 1000}, "samples must be between 0 and")
    refused({"policy": "p", "topic": "t", "partitions": []}, "partitions must be a non-empty list")


# -- the evaluation -------------------------------------------------------------------------------------


def test_every_violation_counts_though_the_policy_blocks() -> None:
    """The live policy blocks at its first violating record; a backtest counts every one of them."""
    job = run(Partition([batch(0, [GOOD, NEGATIVE, DOLLARS, GOOD]), batch(4, [NEGATIVE, GOOD])]), ALL)
    report = job["report"]
    assert (report["evaluated"], report["violations"]) == (6, 3)
    assert report["rules"] == [{"rule": "positive", "violations": 2}, {"rule": "euro", "violations": 1}]
    assert offsets(job) == [1, 2, 4]
    sample = report["samples"][0]
    assert sample["key"] == "k1" and json.loads(sample["value"]) == NEGATIVE and sample["timestamp"] == T0 + 1000
    assert sample["details"] == [{"rule": "positive", "message": "positive did not pass"}]
    assert report["complete"] is True and report["stoppedOn"] is None and report["missingRules"] == []


def test_scan_range_is_the_loop_on_part_of_a_batch() -> None:
    values = [GOOD, NEGATIVE, DOLLARS, GOOD, NEGATIVE, {"amount": "x"}]
    data = batch(0, values)
    plan = Evaluation(POLICY).plan
    for first, stop in ((0, 6), (1, 3), (2, 6), (5, 6), (3, 3)):
        found = scan_range(plan, RecordSet.parse(data).batches[0], first, stop)
        reference = evaluate(plan, RecordSet.parse(data).batches[0].records()[first:stop]).violations
        assert [(v.index, v.rules) for v in found] == [(v.index + first, v.rules) for v in reference]


def test_offset_ranges_in_batches_with_gaps() -> None:
    """A compacted batch (offsets 10, 12, 15): the range and positions go by offsets, not indexes."""
    partition = Partition([batch(0, [GOOD] * 4), batch(10, [NEGATIVE, GOOD, DOLLARS], deltas=[0, 2, 5])])
    job = run(partition, Range("offsets", offsets={0: (2, 15)}))
    assert (job["report"]["evaluated"], offsets(job)) == (4, [10])  # 2, 3, 10, 12
    assert job["progress"]["partitions"][0] == {
        "partition": 0,
        "start": 2,
        "end": 15,
        "position": 15,
        "evaluated": 4,
        "done": True,
    }
    job = run(partition, Range("latest", latest=4))  # the end is 16: offsets 12 to 15
    assert (job["report"]["evaluated"], offsets(job)) == (2, [15])


def test_time_ranges_read_from_the_first_record_at_or_after_from() -> None:
    """ListOffsets by timestamp is only where reading starts (here it answers 0, as Tansu does); the
    records themselves decide: from the first at or after ``from`` to the first at or after ``to``."""
    partition = Partition(
        [
            batch(0, [NEGATIVE, GOOD, GOOD], seconds=[0, 1, 2]),
            batch(3, [GOOD, DOLLARS, NEGATIVE], seconds=[3, 9, 4]),  # out of order within a batch
            batch(6, [NEGATIVE, GOOD], seconds=[10, 11]),
        ]
    )
    job = run(partition, Range("time", start_ms=T0 + 2000, end_ms=T0 + 10_000))
    # offsets 2 to 5 (seconds 2, 3, 9, 4); offset 6 at second 10 ends the range
    assert (job["report"]["evaluated"], offsets(job)) == (4, [4, 5])
    assert partition.timestamps == [T0 + 2000, T0 + 10_000]
    job = run(partition, Range("time", start_ms=T0 + 9500))  # the first at or after 9.5 s is offset 6
    assert (job["report"]["evaluated"], offsets(job)) == (2, [6])
    job = run(partition, Range("time", end_ms=T0 + 1000))
    assert (job["report"]["evaluated"], offsets(job)) == (1, [0])
    # a whole batch before ``from`` is passed over without reading its records
    job = run(partition, Range("time", start_ms=T0 + 60_000))
    assert job["report"]["evaluated"] == 0 and job["report"]["complete"] is True


def test_log_append_time_batches() -> None:
    """Every record of a LogAppendTime batch has the batch's timestamp."""
    partition = Partition(
        [batch(0, [NEGATIVE, GOOD], seconds=[5, 5], timestamp_type=1), batch(2, [DOLLARS], seconds=[8])]
    )
    job = run(partition, Range("time", start_ms=T0 + 5000, end_ms=T0 + 8000))
    assert (job["report"]["evaluated"], offsets(job)) == (2, [0])
    assert job["report"]["samples"][0]["timestamp"] == T0 + 5000


def test_control_batches_and_deleted_records() -> None:
    commit = encode_batch(
        [Record(key=b"\x00\x00\x00\x01", value=b"\x00\x00\x00\x00\x00\x00")],
        base_offset=2,
        base_timestamp=T0,
        control=True,
        transactional=True,
    )
    partition = Partition([batch(0, [GOOD, NEGATIVE]), commit, batch(3, [DOLLARS])], per_fetch=1)
    job = run(partition, ALL)
    assert (job["report"]["evaluated"], offsets(job)) == (3, [1, 3])
    # records before the log start are gone: reading goes on from it
    partition = Partition([batch(5, [NEGATIVE, GOOD])], log_start=5)
    job = run(partition, Range("offsets", offsets={0: (0, None)}))
    assert (job["report"]["evaluated"], offsets(job)) == (2, [5])
    assert job["progress"]["partitions"][0]["start"] == 5


def test_max_records_cuts_a_batch_and_says_so() -> None:
    partition = Partition([batch(0, [GOOD, NEGATIVE, GOOD]), batch(3, [NEGATIVE, GOOD])])
    job = run(partition, ALL, max_records=4)
    report = job["report"]
    assert (report["evaluated"], report["violations"], report["stoppedOn"]) == (4, 2, "maxRecords")
    assert report["complete"] is False and job["progress"]["partitions"][0]["position"] == 4
    job = run(partition, ALL, max_records=5)  # exactly the range: not stopped by the bound
    assert job["report"]["stoppedOn"] is None and job["report"]["complete"] is True
    job = run(partition, ALL, samples=1)
    assert job["report"]["violations"] == 2 and offsets(job) == [1]


def test_previews_are_truncated() -> None:
    long_value = orjson.dumps({"amount": -1, "text": "é" * 1000})
    job = run(Partition([batch(0, [long_value])]), ALL)
    sample = job["report"]["samples"][0]
    assert len(sample["value"]) == 257 and sample["value"].endswith("…") and sample["valueSize"] == len(long_value)


def test_cancel_and_the_jobs_kept() -> None:
    async def main() -> None:
        partition = Partition([batch(i * 10, [GOOD] * 10) for i in range(100)], per_fetch=1)
        job = BacktestJob(request(ALL), POLICY, "orders", [0], cast(Any, partition))
        jobs = BacktestJobs(max_running=1, keep=2)
        jobs.add(job)
        with pytest.raises(ResourceError) as raised:
            jobs.check_room()
        assert raised.value.status == 429
        job.cancel()
        await job.run()
        assert job.state == "cancelled" and job.as_json()["report"]["complete"] is False
        for _ in range(3):
            done = BacktestJob(request(ALL), POLICY, "orders", [0], cast(Any, Partition([batch(0, [GOOD])])))
            jobs.add(done)
            await done.run()
        assert len(jobs.all()) == 2 and jobs.get(job.id) is None  # the two last finished ones are kept

    trio.run(main)


def test_fetch_errors_are_retried_then_fail_the_backtest() -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)
    partition = Partition([batch(0, [GOOD, NEGATIVE])], failing=2)  # a leader change, say
    job = BacktestJob(request(ALL), POLICY, "orders", [0], cast(Any, partition))
    trio.run(job.run, clock=clock)
    assert job.state == "done" and job.evaluation.evaluated == 2 and partition.metadata == 2
    partition = Partition([batch(0, [GOOD, NEGATIVE])], failing=100)
    job = BacktestJob(request(ALL), POLICY, "orders", [0], cast(Any, partition))
    trio.run(job.run, clock=clock)
    assert job.state == "failed" and "partition 0 of orders: the cluster answers error 6" in (job.error or "")


def test_a_failing_read_fails_the_job_not_the_gateway() -> None:
    class Broken(Partition):
        async def fetch(self, positions: Any, max_wait: float = 0.5, partition_bytes: int = 0) -> Any:
            raise OSError("connection reset")

    job = BacktestJob(request(ALL), POLICY, "orders", [0], cast(Any, Broken([batch(0, [GOOD])])))
    trio.run(job.run)
    assert job.state == "failed" and "connection reset" in (job.error or "")
    assert job.as_json()["report"] is None


# -- topic names ----------------------------------------------------------------------------------------


class Store:
    def __init__(self, **kinds: list[dict[str, Any]]) -> None:
        self.kinds = kinds

    def resources(self, kind: str) -> list[dict[str, Any]]:
        return self.kinds.get(kind, [])


def test_the_stored_name_of_a_virtual_cluster_topic() -> None:
    store = Store(
        VirtualCluster=[{"metadata": {"name": "team-a."}}],
        AliasTopic=[
            {"metadata": {"name": "shared", "vCluster": "team-a."}, "spec": {"physicalName": "common.orders"}},
            {"metadata": {"name": "orders"}, "spec": {"physicalName": "legacy.orders"}},
        ],
    )
    services = cast(GatewayServices, FakeServices())
    assert stored_topic(store, services, "orders", None) == "orders"
    assert stored_topic(store, services, "orders", "team-a.") == "team-a.orders"
    assert stored_topic(store, services, "shared", "team-a.") == "common.orders"
    with pytest.raises(ResourceError) as raised:
        stored_topic(store, services, "orders", "team-b.")
    assert raised.value.status == 404 and "team-b." in raised.value.msg


# -- shadow mode ----------------------------------------------------------------------------------------


KINDS = {k.kind: k for k in resource_kinds(lambda: Checks("gateway", frozenset({"legacy"})), lambda *a: None)}


def rule_manifest(name: str, expression: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "DataQualityRule",
        "metadata": {"name": name},
        "spec": {"type": "Cel", "displayName": name, "celExpression": expression},
    }


RULES = [rule_manifest("positive", "value.amount > 0"), rule_manifest("euro", "value.currency == 'EUR'")]


def policy_manifest(name: str, actions: dict[str, Any], cluster: str = "gateway") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "DataQualityPolicy",
        "metadata": {"name": name, "group": "g"},
        "spec": {
            "displayName": name,
            "rules": ["positive", "euro"],
            "targets": [{"cluster": cluster, "topic": "orders"}],
            "actions": actions,
        },
    }


def test_shadow_manifests() -> None:
    state = Store(DataQualityRule=[canonical_rule(r, KINDS["DataQualityRule"]) for r in RULES])
    checks = Checks("gateway", frozenset({"legacy"}))
    kind = KINDS["DataQualityPolicy"]
    on = canonical_policy(policy_manifest("p", {"shadow": {"enabled": True}, "block": True}), kind, state, checks)
    assert on["spec"]["actions"]["shadow"] == {"enabled": True} and on["spec"]["actions"]["block"] == {"enabled": True}
    off = canonical_policy(policy_manifest("p", {"shadow": {"enabled": False}}), kind, state, checks)
    assert "shadow" not in off["spec"]["actions"]  # written only when on
    with pytest.raises(ResourceError) as raised:
        canonical_policy(policy_manifest("p", {"shadow": True}, cluster="legacy"), kind, state, checks)
    assert "spec.actions.shadow: actions need a gateway" in raised.value.msg
    compiled = compile_policy(on, {}, frozenset())
    assert compiled.shadow and not compiled.block and not compiled.mark


def produce(ic: DataQualityInterceptor, values: list[Any]) -> tuple[Any, RecordSet]:
    data = encode_batch(
        [Record(offset_delta=i, value=orjson.dumps(v)) for i, v in enumerate(values)], base_timestamp=T0
    )
    connection = Connection(id=1, client_address="10.0.0.1:5000", listener_address="127.0.0.1:9092", node_id=1)
    ctx = RecordsContext(connection, 0, 9, "client-1", "orders", 0, RecordSet.parse(data))
    return ic.kanal_produce_records(ctx), ctx.records


def test_shadow_mode_counts_what_block_would_have_rejected() -> None:
    shadow = policy_manifest("shadowed", {"block": True, "mark": True, "shadow": True})
    watcher = policy_manifest("watcher", {})
    config = validate_config(DataQualityInterceptor, {"rules": RULES, "policies": [shadow, watcher]})
    ic = DataQualityInterceptor(config, cast(GatewayServices, FakeServices()))
    result, records = produce(ic, [GOOD, NEGATIVE, DOLLARS])
    assert result is None and not records.changed()  # not blocked, not marked
    assert produce(ic, [GOOD, GOOD])[0] is None
    runtime = ic._runtime
    assert runtime is not None
    metrics = runtime.metrics

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(f"gateway_data_quality_{name}_total", labels)

    assert sample("shadow_blocked_batches", policy="shadowed") == 1
    assert sample("shadow_blocked_records", policy="shadowed") == 3
    assert sample("shadow_violations", policy="shadowed", rule="positive") == 1
    assert sample("shadow_violations", policy="shadowed", rule="euro") == 1
    assert sample("blocked_batches", policy="shadowed") == 0
    assert sample("shadow_blocked_batches", policy="watcher") is None
    entries = runtime.history.violations("shadowed", 60)
    assert [(e["action"], e.get("shadow"), e["rules"]) for e in entries] == [
        ("WOULD_BLOCK", True, ["euro"]),
        ("WOULD_BLOCK", True, ["positive"]),
    ]
    assert {e["action"] for e in runtime.history.violations("watcher", 60)} == {"REPORTED"}
    # the counts went through the history topic's records (flushed locally here): fleet-wide figures
    shadow_counts = runtime.history.shadow("shadowed", 60)
    assert (shadow_counts.batches, shadow_counts.records, shadow_counts.rules) == (1, 3, {"positive": 1, "euro": 1})
    assert runtime.history.shadow("watcher", 60).batches == 0
    counts = runtime.history.counts("shadowed", 60, 60)
    assert (counts["evaluated"], counts["violations"]) == (5, 2)
    # the policy's series go with it
    metrics.forget({"watcher"})
    assert sample("shadow_blocked_batches", policy="shadowed") is None
    assert sample("shadow_violations", policy="shadowed", rule="euro") is None


def test_shadow_counts_in_the_history_topic_records() -> None:
    """Counts records carry ``shadow`` beside ``counts``; a node reads it back, and a record without it
    (an older node's) reads as before."""
    history = History("n1")
    reporter = Reporter(history)
    reporter.count("p", 10, 2, T0)
    reporter.count_shadow("p", 1, 10, {"positive": 2}, T0)
    reporter.count_shadow("p", 2, 4, {"positive": 1, "euro": 3}, T0 + 60_000)
    items = reporter.drain(True)
    bodies = [json.loads(v) for _, v in items]
    assert [b["minute"] for b in bodies] == [T0 // 60_000, T0 // 60_000 + 1]
    assert bodies[0]["shadow"] == {"p": {"batches": 1, "records": 10, "rules": {"positive": 2}}}
    assert bodies[1]["counts"] == {} and bodies[1]["shadow"]["p"]["batches"] == 2
    other = History("n2", clock=lambda: T0 + 120_000)
    other.ingest([LogRecord(i, k, v, T0) for i, (k, v) in enumerate(items)])
    older = {"type": "counts", "node": "n0", "time": T0, "minute": T0 // 60_000, "counts": {"p": [5, 1]}}
    other.ingest([LogRecord(9, b"", orjson.dumps(older), T0)])
    total = other.shadow("p", 3600)
    assert (total.batches, total.records, total.rules) == (3, 14, {"positive": 3, "euro": 3})
    assert other.counts("p", 3600, 60)["evaluated"] == 15
    assert other.shadow("p", 60).batches == 2  # the last minute only
