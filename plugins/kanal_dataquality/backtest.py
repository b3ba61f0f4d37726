"""Backtesting a policy: its rules over the records a topic already holds, changing nothing.

A backtest reads a range of a topic's records through a Kafka client of the gateway's own (the backing
cluster's, or an observed cluster's for a policy on a cluster without a gateway), evaluates them with
the policy's compiled rules in the same generated record loop the live policy runs (or, when records
carry schema ids, the same registry path), and reports how many records it evaluated, how many broke
the policy, per rule, and a bounded sample of violating records with their reasons. It takes no
action, marks nothing, writes no history entry and counts nothing in the live policy's metrics: its
counts exist only in its own report.

* :func:`parse_request` checks the request body (400s that say why);
* :class:`Evaluation` is the evaluation itself: the policy as a plan with no blocking policy (so every
  violating record is counted, not only the first), over windows of record batches;
* :class:`BacktestJob` reads and evaluates one range, bounded by records and seconds, cancellable,
  with its progress; :class:`BacktestJobs` keeps the running and recently finished ones.

Ranges (per partition; ``partitions`` restricts which):

* ``{"latest": N}``: the last N offsets of each partition (the default, N = 1000);
* ``{"offsets": {"<partition>": {"start": S, "end": E}}}``: from S (default: the log start) to E,
  exclusive (default: the end when the backtest starts); only the partitions named;
* ``{"from": T, "to": T}``: times as milliseconds since the epoch or ISO-8601 text. ``from`` is looked up
  with ListOffsets by timestamp (where to start reading); records are then read from the first one whose
  timestamp is at or after ``from``, up to the first one at or after ``to`` (exclusive; default: the
  end when the backtest starts), which is what ListOffsets by timestamp answers for ``to``: so a broker
  that answers ListOffsets imprecisely costs reading, never a wrong range.

The end of a partition is fixed when the backtest starts (its last stable offset): records produced
while it runs are not read.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
import uuid
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import trio

from kanal.api import ErrorCode, Record, RecordBatch, ResourceError, UpstreamError, invalid, record_spans, records_area
from kanal_dataquality.actions import details, violation_text
from kanal_dataquality.avro import SchemaRegistry
from kanal_dataquality.batches import scan_range
from kanal_dataquality.evaluate import Violation, evaluate, needed, schema_refs
from kanal_dataquality.observe import ClusterReader
from kanal_dataquality.policies import CompiledPolicy, Plan, build_plan

__all__ = [
    "DEFAULT_LATEST",
    "DEFAULT_MAX_RECORDS",
    "DEFAULT_MAX_SECONDS",
    "DEFAULT_SAMPLES",
    "KEEP_FINISHED",
    "KEEP_SECONDS",
    "MAX_RECORDS",
    "MAX_RUNNING",
    "MAX_SAMPLES",
    "MAX_SECONDS",
    "BacktestJob",
    "BacktestJobs",
    "BacktestRequest",
    "Evaluation",
    "Range",
    "parse_request",
    "parse_time",
    "topic_error",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Records evaluated by a backtest unless ``maxRecords`` says otherwise, and the most it may say.
DEFAULT_MAX_RECORDS = 100_000
MAX_RECORDS = 10_000_000
#: Seconds a backtest runs unless ``maxSeconds`` says otherwise, and the most it may say.
DEFAULT_MAX_SECONDS = 60.0
MAX_SECONDS = 600.0
#: Violating records kept as samples unless ``samples`` says otherwise, and the most it may say.
DEFAULT_SAMPLES = 20
MAX_SAMPLES = 200
#: ``{"latest": N}`` when the request names no range.
DEFAULT_LATEST = 1000
#: Backtests running at once on a node (more: 429); finished ones kept, and for how long.
MAX_RUNNING = 2
KEEP_FINISHED = 50
KEEP_SECONDS = 3600.0
#: Characters of a sample's key and value shown (headers: per value), and headers shown per sample.
PREVIEW_CHARS = 256
HEADER_PREVIEW_CHARS = 64
PREVIEW_HEADERS = 10
#: The most a fetch asks of one partition (the records of one round are evaluated between fetches).
FETCH_BYTES = 1024 * 1024
#: How long the evaluation may keep the gateway's thread before it lets other tasks run.
YIELD_EVERY = 0.005
#: How long the Fetch that learns each partition's end may wait for records (an empty partition).
PROBE_WAIT = 0.01
#: Fetches of a partition in a row that bring nothing before its end: it is given up (records gone).
EMPTY_FETCHES = 5

_FIELDS = ("policy", "topic", "virtualCluster", "partitions", "range", "maxRecords", "maxSeconds", "samples")


# -- the request --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Range:
    """Which records of each partition: ``latest`` N, ``offsets`` per partition, or times."""

    kind: Literal["latest", "offsets", "time"]
    latest: int = DEFAULT_LATEST
    offsets: Mapping[int, tuple[int | None, int | None]] = field(default_factory=dict)  # partition -> (start, end)
    start_ms: int | None = None
    end_ms: int | None = None

    def as_json(self) -> dict[str, Any]:
        if self.kind == "latest":
            return {"latest": self.latest}
        if self.kind == "offsets":
            return {
                "offsets": {
                    str(p): {k: v for k, v in (("start", s), ("end", e)) if v is not None}
                    for p, (s, e) in sorted(self.offsets.items())
                }
            }
        return {"from": _iso(self.start_ms), "to": _iso(self.end_ms)}


@dataclass(frozen=True)
class BacktestRequest:
    """A checked backtest request: a policy by name (``policy``) or a draft manifest (``draft``)."""

    policy: str | None
    draft: Mapping[str, Any] | None
    topic: str
    virtual_cluster: str | None
    partitions: tuple[int, ...] | None
    range: Range
    max_records: int
    max_seconds: float
    samples: int


def _int(value: Any, where: str, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        else:
            raise invalid(f"{where} must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise invalid(f"{where} must be between {lo} and {hi}, got {value}" if hi else f"{where} must be >= {lo}")
    return int(value)


def parse_time(value: Any, where: str) -> int:
    """Milliseconds since the epoch, from a number of them or ISO-8601 text (UTC unless it says)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isdigit():
            return int(text)
        try:
            moment = datetime.datetime.fromisoformat(text)
        except ValueError:
            pass
        else:
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=datetime.UTC)
            return int(moment.timestamp() * 1000)
    raise invalid(f"{where} must be milliseconds since the epoch or an ISO-8601 time, got {value!r}")


def _range(value: Any) -> Range:
    if value is None:
        return Range("latest")
    if not isinstance(value, Mapping):
        raise invalid('range must be an object: {"latest": N}, {"offsets": {...}} or {"from": T, "to": T}')
    kinds = [k for k in ("latest", "offsets") if k in value] + (["time"] if "from" in value or "to" in value else [])
    unknown = set(value) - {"latest", "offsets", "from", "to"}
    if unknown:
        raise invalid(f"unknown range field {sorted(unknown)[0]!r} (expected latest, offsets, or from and to)")
    if len(kinds) != 1:
        raise invalid('range must be exactly one of {"latest": N}, {"offsets": {...}} or {"from": T, "to": T}')
    if kinds[0] == "latest":
        return Range("latest", latest=_int(value["latest"], "range.latest", 1, MAX_RECORDS))
    if kinds[0] == "offsets":
        offsets = value["offsets"]
        if not isinstance(offsets, Mapping) or not offsets:
            raise invalid('range.offsets must name partitions: {"0": {"start": 0, "end": 100}, ...}')
        out: dict[int, tuple[int | None, int | None]] = {}
        for key, item in offsets.items():
            where = f"range.offsets[{key!r}]"
            partition = _int(key, f"{where}: the partition", 0)
            if not isinstance(item, Mapping) or set(item) - {"start", "end"}:
                raise invalid(f'{where} must be an object {{"start": offset, "end": offset}} (both optional)')
            start = None if item.get("start") is None else _int(item["start"], f"{where}.start", 0)
            end = None if item.get("end") is None else _int(item["end"], f"{where}.end", 0)
            if start is not None and end is not None and end < start:
                raise invalid(f"{where}: end {end} is before start {start}")
            out[partition] = (start, end)
        return Range("offsets", offsets=out)
    start_ms = None if value.get("from") is None else parse_time(value["from"], "range.from")
    end_ms = None if value.get("to") is None else parse_time(value["to"], "range.to")
    if start_ms is not None and end_ms is not None and end_ms < start_ms:
        raise invalid("range.to is before range.from")
    return Range("time", start_ms=start_ms, end_ms=end_ms)


def parse_request(body: Any) -> BacktestRequest:
    """The checked request, or a 400 naming the field at fault."""
    if not isinstance(body, Mapping):
        raise invalid("the body must be a JSON object {policy, topic, range, maxRecords, maxSeconds, samples}")
    unknown = set(body) - set(_FIELDS)
    if unknown:
        raise invalid(f"unknown field {sorted(unknown)[0]!r} (expected {', '.join(_FIELDS)})")
    policy = body.get("policy")
    if isinstance(policy, str) and policy:
        name, draft = policy, None
    elif isinstance(policy, Mapping):
        name, draft = None, policy
    else:
        raise invalid("policy is required: a stored policy's name, or a whole DataQualityPolicy manifest (a draft)")
    topic = body.get("topic")
    if not isinstance(topic, str) or not topic.strip():
        raise invalid("topic is required: the topic's name (as clients name it)")
    vcluster = body.get("virtualCluster")
    if vcluster is not None and (not isinstance(vcluster, str) or not vcluster):
        raise invalid("virtualCluster must be a virtual cluster's name")
    partitions = body.get("partitions")
    if partitions is not None:
        if not isinstance(partitions, list) or not partitions:
            raise invalid("partitions must be a non-empty list of partition numbers")
        partitions = tuple(sorted({_int(p, "partitions[]", 0) for p in partitions}))
    bounds_max = body.get("maxRecords")
    seconds = body.get("maxSeconds")
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds <= MAX_SECONDS
    ):
        raise invalid(f"maxSeconds must be a number of seconds above 0 and at most {MAX_SECONDS:g}, got {seconds!r}")
    return BacktestRequest(
        policy=name,
        draft=draft,
        topic=topic.strip(),
        virtual_cluster=vcluster,
        partitions=partitions,
        range=_range(body.get("range")),
        max_records=DEFAULT_MAX_RECORDS if bounds_max is None else _int(bounds_max, "maxRecords", 1, MAX_RECORDS),
        max_seconds=DEFAULT_MAX_SECONDS if seconds is None else float(seconds),
        samples=DEFAULT_SAMPLES if body.get("samples") is None else _int(body["samples"], "samples", 0, MAX_SAMPLES),
    )


# -- the evaluation -----------------------------------------------------------------------------------


def _preview(raw: bytes | None, limit: int) -> str | None:
    if raw is None:
        return None
    text = bytes(raw[: limit * 4]).decode("utf-8", "replace")
    return text if len(text) <= limit and len(raw) <= limit * 4 else text[:limit] + "…"


class Evaluation:
    """A policy over windows of record batches: counts per rule and a bounded sample of violations.

    The plan is the policy alone with block, mark and shadow off: no record stops the evaluation, so
    every violating record is counted. Records without schema ids go through the plan's generated
    loop (:func:`kanal_dataquality.batches.scan_range`), as produced records do; with a schema registry
    (EnforceAvro, Avro payloads) through the same registry path as produced records.
    """

    def __init__(self, policy: CompiledPolicy, registry: SchemaRegistry | None = None, samples: int = 0) -> None:
        self.policy = policy
        self.plan: Plan = build_plan([dataclasses.replace(policy, block=False, mark=False, shadow=False)])
        self.registry = registry
        plan = self.plan
        self.uses_registry = plan.enforce_avro or (registry is not None and (plan.uses_value or plan.uses_key))
        self.max_samples = samples
        self.evaluated = 0
        self.violations = 0
        self.by_rule = [0] * len(plan.rules)
        self.samples: list[dict[str, Any]] = []

    def batch(self, partition: int, batch: RecordBatch, first: int, stop: int) -> None:
        """Records ``first`` to ``stop`` of a batch without schema ids (``uses_registry`` False)."""
        self.evaluated += stop - first
        found = scan_range(self.plan, batch, first, stop)
        if found:
            self._count(partition, batch, found)

    async def batch_with_registry(self, partition: int, batch: RecordBatch, first: int, stop: int) -> None:
        """Records ``first`` to ``stop`` of a batch, schema ids looked up in the registry first."""
        records = batch.records()[first:stop]
        registry = self.registry
        refs = schema_refs(self.plan, records, registry is not None and self.plan.uses_key)
        if registry is not None:
            missing = registry.missing(needed(refs))
            if missing:
                await registry.resolve(missing)
        result = evaluate(self.plan, records, registry, refs)
        self.evaluated += stop - first
        for v in result.violations:
            v.index += first
        if result.violations:
            self._count(partition, batch, result.violations)

    def _count(self, partition: int, batch: RecordBatch, violations: Sequence[Violation]) -> None:
        self.violations += len(violations)
        by_rule = self.by_rule
        for v in violations:
            for i in v.rules:
                by_rule[i] += 1
            if len(self.samples) < self.max_samples:
                self.samples.append(self._sample(partition, batch, v))

    def _sample(self, partition: int, batch: RecordBatch, violation: Violation) -> dict[str, Any]:
        rules = [self.plan.rules[i] for i in violation.rules]
        record: Record = batch.records()[violation.index]
        headers = record.headers
        return {
            "partition": partition,
            "offset": batch.offset_of(record),
            "timestamp": batch.timestamp_of(record),
            "key": _preview(record.key, PREVIEW_CHARS),
            "value": _preview(record.value, PREVIEW_CHARS),
            "valueSize": None if record.value is None else len(record.value),
            "headers": [[name, _preview(value, HEADER_PREVIEW_CHARS)] for name, value in headers[:PREVIEW_HEADERS]],
            "rules": [r.name for r in rules],
            "message": violation_text(rules),
            "details": details(rules, violation.outcomes),
        }

    def report(self) -> dict[str, Any]:
        return {
            "evaluated": self.evaluated,
            "violations": self.violations,
            "rules": [
                {"rule": rule.name, "violations": count}
                for rule, count in zip(self.plan.rules, self.by_rule, strict=True)
            ],
            "samples": self.samples,
        }


# -- one backtest -------------------------------------------------------------------------------------


@dataclass
class _Partition:
    """Where a backtest stands in one partition: its range ``[start, end)`` and the next offset."""

    partition: int
    start: int = -1
    end: int = -1
    position: int = -1
    evaluated: int = 0
    done: bool = False
    seeking: bool = False  # a time range: records before the first at or after ``from`` are skipped
    empty: int = 0  # fetches in a row that brought nothing

    def as_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "start": self.start,
            "end": self.end,
            "position": self.position,
            "evaluated": self.evaluated,
            "done": self.done,
        }


class _Stop(Exception):
    """The record bound is reached."""


class _Unreadable(Exception):
    """A partition cannot be read."""


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return (
        datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def _deltas(batch: RecordBatch) -> list[tuple[int, int]]:
    """(offset, timestamp) of each record of a batch: from the record walk, else the codec."""
    base, stamp = batch.base_offset, batch.base_timestamp
    log_append = batch.timestamp_type == 1
    try:
        data, start = records_area(batch)
        spans = record_spans(data, start, batch.records_count, len(data))
        return [(base + s[5], batch.max_timestamp if log_append else stamp + s[4]) for s in spans]
    except (IndexError, ValueError):
        return [(batch.offset_of(r), batch.timestamp_of(r)) for r in batch.records()]


State = Literal["running", "done", "cancelled", "failed"]


class BacktestJob:
    """One backtest: reads its range, evaluates, keeps its progress and, once finished, its report."""

    def __init__(
        self,
        request: BacktestRequest,
        policy: CompiledPolicy,
        stored_topic: str,
        partitions: Sequence[int],
        reader: ClusterReader,
        registry: SchemaRegistry | None = None,
        *,
        draft: bool = False,
        user: str | None = None,
        owns_client: bool = False,
    ) -> None:
        self.id = uuid.uuid4().hex[:16]
        self.request = request
        self.policy = policy
        self.stored_topic = stored_topic
        self.reader = reader
        self.owns_client = owns_client
        self.draft = draft
        self.user = user
        self.evaluation = Evaluation(policy, registry, request.samples)
        self.partitions = {p: _Partition(p) for p in partitions}
        self.state: State = "running"
        self.error: str | None = None
        self.stopped_on: str | None = None
        self.created = time.time()
        self.finished: float | None = None
        self.elapsed = 0.0
        self.done = trio.Event()
        self.cancel_scope = trio.CancelScope()
        self.cancel_requested = False

    # -- control

    def cancel(self) -> None:
        """Stops the backtest; its report then holds what it evaluated so far."""
        if self.state == "running":
            self.cancel_requested = True
            self.cancel_scope.cancel()

    async def run(self) -> None:
        """Runs to the end of the range, a bound, a cancel or an error (kept as the job's error)."""
        started = time.perf_counter()
        try:
            with self.cancel_scope:
                with trio.move_on_after(self.request.max_seconds) as timer:
                    await self._read()
                if timer.cancelled_caught:
                    self.stopped_on = "maxSeconds"
            self.state = "cancelled" if self.cancel_requested else "done"
        except _Stop:
            self.stopped_on = "maxRecords"
            self.state = "done"
        except (
            UpstreamError,
            OSError,
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            trio.TooSlowError,
            _Unreadable,
        ) as exc:
            self.state, self.error = "failed", f"cannot read {self.stored_topic}: {exc}"
        except Exception as exc:  # reported in the job, and logged: a backtest never takes the gateway down
            log.exception("data quality backtest %s failed", self.id)
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            self.elapsed = time.perf_counter() - started
            self.finished = time.time()
            if self.owns_client:
                await self.reader.aclose()
            self.done.set()

    # -- reading

    async def _call(self, call: Awaitable[_T]) -> _T:
        """A call of the reader that a cancel or a bound does not cut in two: the gateway's own client
        carries one request at a time per connection, and a request cut between its sending and its
        answer would cost the next caller a reconnection (the cancel takes effect right after)."""
        with trio.CancelScope(shield=not self.owns_client):
            result = await call
        return result

    async def _read(self) -> None:
        await self._resolve()
        topic = self.stored_topic
        budget = self.request.max_records
        evaluation = self.evaluation
        last_yield = time.perf_counter()
        while True:
            active = {(topic, p.partition): p.position for p in self.partitions.values() if not p.done}
            if not active:
                return
            fetched = await self._call(self.reader.fetch(active, max_wait=0.1, partition_bytes=FETCH_BYTES))
            unanswered = [tp for tp in active if tp not in fetched]
            if unanswered:
                await self._unanswered(unanswered)
            for (_, number), (records, next_offset) in fetched.items():
                part = self.partitions[number]
                before = part.position
                if next_offset < 0:  # out of range, and the broker does not say where to go on
                    part.done = True
                    continue
                if not records.batches and next_offset > part.position:
                    part.position = next_offset  # out of range: the records were deleted, on from the log start
                for batch in records.batches:
                    if batch.next_offset <= part.position:
                        continue
                    if batch.base_offset >= part.end:
                        part.done = True
                        break
                    if batch.is_control or not batch.records_count:
                        part.position = batch.next_offset
                    else:
                        if evaluation.evaluated >= budget:
                            raise _Stop
                        await self._batch(part, batch, budget - evaluation.evaluated)
                    if part.position >= part.end:
                        part.done = True
                    if part.done:
                        break
                    if time.perf_counter() - last_yield >= YIELD_EVERY:  # live traffic shares this thread
                        await trio.lowlevel.checkpoint()
                        last_yield = time.perf_counter()
                part.empty = 0 if part.position > before or part.done else part.empty + 1
                if part.empty >= EMPTY_FETCHES:  # nothing comes before its end: the rest is gone
                    part.done = True
            if evaluation.evaluated >= budget and any(not p.done for p in self.partitions.values()):
                raise _Stop
            await trio.lowlevel.checkpoint()
            last_yield = time.perf_counter()

    async def _unanswered(self, tps: Sequence[tuple[str, int]]) -> None:
        """Partitions a Fetch answered with an error: the leaders are looked up again and the fetch
        retried, a little later each time; after :data:`EMPTY_FETCHES` in a row the backtest fails."""
        worst = 0
        for tp in tps:
            part = self.partitions[tp[1]]
            part.empty += 1
            worst = max(worst, part.empty)
            if part.empty >= EMPTY_FETCHES:
                code = getattr(self.reader, "errors", {}).get(tp)
                raise _Unreadable(f"partition {tp[1]} of {tp[0]}: the cluster answers error {code} to every fetch")
        await self._call(self.reader.partitions(self.stored_topic))  # its leader may have moved
        await trio.sleep(0.1 * worst)

    async def _batch(self, part: _Partition, batch: RecordBatch, room: int) -> None:
        """The records of one batch inside the partition's range (and the record budget ``room``)."""
        count = batch.records_count
        wanted = self.request.range
        from_ms = wanted.start_ms if part.seeking else None
        to_ms = wanted.end_ms if wanted.kind == "time" else None
        if from_ms is not None and batch.max_timestamp < from_ms:
            part.position = batch.next_offset  # every record is before ``from``
            return
        dense = batch.last_offset_delta == count - 1
        marks: list[tuple[int, int]] | None = None
        if dense and from_ms is None and (to_ms is None or batch.max_timestamp < to_ms):
            # the common case: offsets are base + index, and no timestamp to read
            first = max(0, part.position - batch.base_offset)
            stop = min(count, part.end - batch.base_offset)
        else:
            marks = _deltas(batch)
            first = next((i for i, (o, _) in enumerate(marks) if o >= part.position), count)
            if from_ms is not None:
                first = next((i for i in range(first, count) if marks[i][1] >= from_ms), count)
                if first < count:
                    part.seeking = False
            stop = next((i for i in range(first, count) if marks[i][0] >= part.end), count)
            if to_ms is not None:
                late = next((i for i in range(first, stop) if marks[i][1] >= to_ms), None)
                if late is not None and late <= first + room:
                    stop = late
                    part.done = True  # the first record at or after ``to`` ends the partition's range
        stop = min(stop, first + room)
        if stop >= count:
            part.position = batch.next_offset
        else:
            part.position = batch.base_offset + stop if marks is None else marks[stop][0]
        if stop <= first:
            return
        if self.evaluation.uses_registry:
            await self.evaluation.batch_with_registry(part.partition, batch, first, stop)
        else:
            self.evaluation.batch(part.partition, batch, first, stop)
        part.evaluated += stop - first

    async def _resolve(self) -> None:
        """Each partition's range: its log start and end now, and where the request asks to read."""
        topic, reader = self.stored_topic, self.reader
        tps = [(topic, p) for p in self.partitions]
        starts = await self._call(reader.list_offsets(tps, -2))
        ends = await self._call(reader.list_offsets(tps, -1, isolation_level=1))
        # The last stable offset from a Fetch as well: a broker may answer ListOffsets short of a
        # last batch of several records (and one answers nothing to a Fetch that may not wait at all).
        await self._call(reader.fetch({tp: starts.get(tp, 0) for tp in tps}, max_wait=PROBE_WAIT, partition_bytes=1))
        wanted = self.request.range
        at_from: dict[tuple[str, int], int] = {}
        at_to: dict[tuple[str, int], int] = {}
        if wanted.kind == "time":
            if wanted.start_ms is not None:
                at_from = await self._call(reader.list_offsets(tps, wanted.start_ms))
            if wanted.end_ms is not None:
                at_to = await self._call(reader.list_offsets(tps, wanted.end_ms))
        for tp in tps:
            part = self.partitions[tp[1]]
            log_start, hwm, lso = reader.watermarks.get(tp, (-1, -1, -1))
            first = max(starts.get(tp, 0), log_start, 0)
            last = max(ends.get(tp, 0), lso if lso >= 0 else hwm, first)
            if wanted.kind == "latest":
                start, end = max(first, last - wanted.latest), last
            elif wanted.kind == "offsets":
                asked_start, asked_end = wanted.offsets.get(tp[1], (None, None))
                start = first if asked_start is None else min(max(asked_start, first), last)
                end = last if asked_end is None else min(max(asked_end, start), last)
            else:
                found = at_from.get(tp, first) if wanted.start_ms is not None else first
                start = last if found < 0 else min(max(found, first), last)
                hint = at_to.get(tp, -1)
                end = hint if start < hint < last else last  # a hint at or before start is no use
                part.seeking = wanted.start_ms is not None
            part.start, part.end, part.position = start, end, start
            part.done = start >= end

    # -- what the API shows

    def as_json(self) -> dict[str, Any]:
        evaluation = self.evaluation
        request = self.request
        out: dict[str, Any] = {
            "id": self.id,
            "state": self.state,
            "policy": self.policy.name,
            "draft": self.draft,
            "topic": request.topic,
            "virtualCluster": request.virtual_cluster,
            "storedTopic": self.stored_topic,
            "cluster": self.policy.cluster,
            "targeted": self.policy.applies_to(request.topic),
            "range": request.range.as_json(),
            "bounds": {
                "maxRecords": request.max_records,
                "maxSeconds": request.max_seconds,
                "samples": request.samples,
            },
            "user": self.user,
            "createdAt": _iso(int(self.created * 1000)),
            "finishedAt": _iso(int(self.finished * 1000)) if self.finished is not None else None,
            "progress": {
                "recordsRead": evaluation.evaluated,
                "violations": evaluation.violations,
                "partitions": [p.as_json() for _, p in sorted(self.partitions.items())],
            },
            "error": self.error,
            "report": None,
        }
        if self.state != "running" and self.state != "failed":
            report = evaluation.report()
            report.update(
                {
                    "stoppedOn": self.stopped_on,
                    "complete": all(p.done for p in self.partitions.values()) and self.stopped_on is None,
                    "elapsedSeconds": round(self.elapsed, 6),
                    "recordsPerSecond": round(evaluation.evaluated / self.elapsed) if self.elapsed > 0 else None,
                    "missingRules": list(self.policy.missing_rules),
                }
            )
            out["report"] = report
        return out


class BacktestJobs:
    """The backtests of this node: at most :data:`MAX_RUNNING` at once; finished ones are kept for
    :data:`KEEP_SECONDS`, the last :data:`KEEP_FINISHED` of them."""

    def __init__(
        self, max_running: int = MAX_RUNNING, keep: int = KEEP_FINISHED, keep_seconds: float = KEEP_SECONDS
    ) -> None:
        self.max_running = max_running
        self.keep = keep
        self.keep_seconds = keep_seconds
        self._jobs: dict[str, BacktestJob] = {}

    def _prune(self) -> None:
        now = time.time()
        finished = [j for j in self._jobs.values() if j.finished is not None]
        finished.sort(key=lambda j: j.finished or 0.0)
        for i, job in enumerate(finished):
            if len(finished) - i > self.keep or now - (job.finished or now) > self.keep_seconds:
                del self._jobs[job.id]

    def running(self) -> int:
        return sum(1 for j in self._jobs.values() if j.state == "running")

    def check_room(self) -> None:
        """Raises 429 while :data:`MAX_RUNNING` backtests run."""
        if self.running() >= self.max_running:
            raise ResourceError(
                429,
                "Too many backtests",
                f"{self.max_running} backtests are running on this node; wait for one to finish or cancel one",
            )

    def add(self, job: BacktestJob) -> None:
        self._prune()
        self.check_room()
        self._jobs[job.id] = job

    def get(self, job_id: str) -> BacktestJob | None:
        self._prune()
        return self._jobs.get(job_id)

    def remove(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)

    def all(self) -> list[BacktestJob]:
        self._prune()
        return sorted(self._jobs.values(), key=lambda j: j.created)


def topic_error(code: int, topic: str) -> ResourceError:
    """The API's answer when the cluster does not know the topic (or refuses to say)."""
    if code in (ErrorCode.unknown_topic_or_partition, ErrorCode.invalid_topic_exception):
        return ResourceError(404, "Not found", f"topic {topic!r} does not exist on the cluster")
    if code == ErrorCode.topic_authorization_failed:
        return ResourceError(403, "Forbidden", f"the gateway may not read topic {topic!r}")
    return ResourceError(502, "Upstream error", f"the cluster answered error {code} for topic {topic!r}")
