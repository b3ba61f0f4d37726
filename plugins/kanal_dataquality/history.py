"""Violation history and fleet-wide counts, kept in one topic of the backing cluster.

The topic (``_kanal_<GATEWAY_CLUSTER_ID>_data_quality_violations`` unless
``DATA_QUALITY_HISTORY_TOPIC`` names another; one partition, ``cleanup.policy=delete``, 7-day
retention) holds three kinds of JSON records, keyed by policy name:

* ``violation``: one history entry: ``time`` (ms), ``policy``, ``cluster``, ``topic``, ``partition``,
  ``rules`` (failed rule names), ``message`` (their violation texts), ``details`` (per rule: text and
  evaluation error), ``clientId``, ``action`` (``BLOCKED``, ``MARKED`` or ``REPORTED``), ``node``, ``id``;
* ``suppressed``: violations a node did not report one by one (``DATA_QUALITY_MAX_REPORTS_PER_SECOND``),
  as a count, so that alerts still see them;
* ``counts``: a node's evaluated and violation counts per policy for one minute, published every
  ``DATA_QUALITY_COUNTS_FLUSH_INTERVAL`` (at most a minute); with ``shadow`` beside them when policies
  in shadow mode would have blocked something: per policy ``{batches, records, rules: {rule: count}}``
  (a key older nodes ignore);
* ``checkpoint`` (keyed by cluster name): where the observer of a cluster without a gateway stands,
  ``cluster``, ``positions`` (``[topic, partition, next offset]`` triples), ``node``, ``fleetNode``
  (the gateway's fleet node id), ``time``, ``final`` (written as the node stopped observing). A node
  writes one with its counts, after them in the same request, when its positions moved, so the counts
  of the records before a checkpoint's positions are in the topic whenever the checkpoint is. The
  observer that takes over (the fleet's new leader) goes on from the last one.

Every node follows the topic from its start, so each serves the whole fleet's history and counts, and
a restart loses nothing. A node shows its own violations at once (before they come back from the
topic); counts come only from the topic, so they lag by at most the flush interval. The topic is a
state log of the plugin's services (``services.state_log(topic, compacted=False, retention_ms=...)``).
"""

from __future__ import annotations

import collections
import datetime
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import trio

from kanal.api import LogError, LogRecord, StateLog

__all__ = ["RANGES", "Checkpoint", "Checkpoints", "History", "Reporter", "Shadow", "follow", "publish"]

log = logging.getLogger(__name__)

# Time ranges the admin API serves: name -> (seconds, graph bucket seconds)
RANGES: Mapping[str, tuple[int, int]] = {
    "30m": (1800, 60),
    "1h": (3600, 120),
    "1d": (86400, 3600),
    "7d": (7 * 86400, 6 * 3600),
}
_MAX_AGE_MS = 7 * 86400 * 1000


def _now_ms() -> int:
    return int(time.time() * 1000)


# -- memory -------------------------------------------------------------------------------------


@dataclass
class Shadow:
    """What a policy in shadow mode would have blocked: partition batches, their records, and the
    records that broke each rule."""

    batches: int = 0
    records: int = 0
    rules: dict[str, int] = field(default_factory=dict)

    def add(self, batches: int, records: int, rules: Mapping[str, int]) -> None:
        self.batches += batches
        self.records += records
        for rule, count in rules.items():
            self.rules[rule] = self.rules.get(rule, 0) + count

    def as_json(self) -> dict[str, Any]:
        return {"batches": self.batches, "records": self.records, "rules": dict(self.rules)}


@dataclass
class _PolicyHistory:
    entries: collections.deque[dict[str, Any]]
    minutes: dict[int, list[int]] = field(default_factory=dict)  # epoch minute -> [evaluated, violations]
    shadow: dict[int, Shadow] = field(default_factory=dict)  # epoch minute -> what shadow mode would have blocked


Listener = Callable[[str, int, int, str], None]  # (policy, time ms, violation count, origin node)

Positions = dict[tuple[str, int], int]  # (topic, partition) -> the next offset to read


@dataclass(frozen=True)
class Checkpoint:
    """Where a node's observer of one cluster stood, as the history topic says."""

    cluster: str
    node: str  # the data-quality node id of the node that wrote it
    fleet_node: str | None  # its fleet node id
    positions: Positions
    final: bool  # written as that node stopped observing the cluster
    time: int


class Checkpoints:
    """The observer's positions on the clusters without a gateway: this node's own (live while it
    observes) and the last checkpoint of each cluster in the history topic (any node's)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.fleet_node: str | None = None  # written into the checkpoints (the fleet's node id)
        self.local: dict[str, Positions] = {}  # cluster -> this node's positions (the observer's live dict)
        self.active: set[str] = set()  # the clusters this node observes now
        self.last: dict[str, Checkpoint] = {}  # cluster -> the last checkpoint read from the topic
        self._published: dict[str, tuple[Positions, bool]] = {}

    def resume(self, cluster: str) -> Positions:
        """The positions this node's observer of ``cluster`` goes on from, registered as its live
        dict (the observer changes it in place): the last checkpoint's when another node wrote it
        (it observed after this node did, or this node never did), else this node's own (at least as
        far as its last checkpoint)."""
        last = self.last.get(cluster)
        positions = self.local.get(cluster)
        if last is not None and last.node != self.node:
            positions = dict(last.positions)
        elif positions is None:
            positions = {}
        self.local[cluster] = positions
        self.active.add(cluster)
        return positions

    def stop(self, cluster: str) -> None:
        """This node no longer observes ``cluster``: its next checkpoint is final."""
        self.active.discard(cluster)

    def handing_over(self, clusters: Iterable[str]) -> bool:
        """Whether the last checkpoint of one of ``clusters`` is another node's and not final: that
        node may still be writing its last one (it stopped observing at about the time this one
        started)."""
        for cluster in clusters:
            last = self.last.get(cluster)
            if last is not None and last.node != self.node and not last.final:
                return True
        return False

    def read(self, item: Mapping[str, Any], timestamp: int) -> None:
        """A checkpoint record read back from the topic (malformed ones are skipped)."""
        try:
            cluster = str(item["cluster"])
            positions = {(str(t), int(p)): int(o) for t, p, o in item["positions"]}
            checkpoint = Checkpoint(
                cluster,
                str(item["node"]),
                item.get("fleetNode"),
                positions,
                bool(item.get("final", False)),
                int(item.get("time", timestamp)),
            )
        except (KeyError, TypeError, ValueError):
            return
        self.last[cluster] = checkpoint

    def drain(self, closing: bool) -> list[tuple[bytes, bytes]]:
        """Checkpoint records of the clusters whose positions (or whose observation) changed since the
        last drain; all final when ``closing`` (the node stops)."""
        items = []
        now = _now_ms()
        for cluster, positions in self.local.items():
            final = closing or cluster not in self.active
            state = (dict(positions), final)
            if self._published.get(cluster) == state:
                continue
            self._published[cluster] = state
            body = {
                "type": "checkpoint",
                "node": self.node,
                "fleetNode": self.fleet_node,
                "time": now,
                "cluster": cluster,
                "positions": [[t, p, o] for (t, p), o in sorted(positions.items())],
                "final": final,
            }
            items.append((cluster.encode(), orjson.dumps(body)))
        return items


class History:
    """Violation entries and per-minute counts of every policy, as this node knows them."""

    def __init__(self, node: str, max_entries: int = 10_000, clock: Callable[[], int] = _now_ms) -> None:
        self.node = node
        self.max_entries = max_entries
        self.clock = clock
        self._policies: dict[str, _PolicyHistory] = {}
        self.listeners: list[Listener] = []  # told about violations in log order (alerts)
        self.checkpoints = Checkpoints(node)
        self.position = 0
        self.loaded = trio.Event()
        self._moved = trio.Event()

    def advance(self, offset: int) -> None:
        """The follower read the topic up to ``offset`` (exclusive)."""
        self.position = max(self.position, offset)
        moved, self._moved = self._moved, trio.Event()
        moved.set()

    async def moved(self) -> None:
        """Returns after the follower's next read (every half second at most while it follows)."""
        await self._moved.wait()

    async def reach(self, offset: int) -> None:
        """Returns once the follower has read the topic up to ``offset``."""
        while self.position < offset:
            await self._moved.wait()

    def _policy(self, name: str) -> _PolicyHistory:
        item = self._policies.get(name)
        if item is None:
            item = self._policies[name] = _PolicyHistory(collections.deque(maxlen=self.max_entries))
        return item

    def add_entry(self, entry: dict[str, Any]) -> None:
        self._policy(entry["policy"]).entries.append(entry)

    def add_counts(self, minute: int, counts: Mapping[str, Sequence[int]]) -> None:
        for policy, (evaluated, violations) in counts.items():
            bucket = self._policy(policy).minutes.setdefault(minute, [0, 0])
            bucket[0] += int(evaluated)
            bucket[1] += int(violations)

    def add_shadow(self, minute: int, shadow: Mapping[str, Mapping[str, Any]]) -> None:
        """The shadow part of a counts record: per policy ``{batches, records, rules}``."""
        for policy, item in shadow.items():
            rules = {str(rule): int(count) for rule, count in (item.get("rules") or {}).items()}
            bucket = self._policy(policy).shadow.setdefault(minute, Shadow())
            bucket.add(int(item.get("batches", 0)), int(item.get("records", 0)), rules)

    def ingest(self, records: Iterable[LogRecord]) -> None:
        """Records read back from the topic (every node's, this one's included)."""
        for record in records:
            if record.value is None:
                continue
            try:
                item = orjson.loads(record.value)
                kind = item["type"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue
            if kind == "violation":
                if item.get("node") != self.node:  # ours were added when reported
                    self.add_entry(item)
                self._notify(item.get("policy", ""), int(item.get("time", record.timestamp)), 1, item.get("node", ""))
            elif kind == "suppressed":
                self._notify(
                    item.get("policy", ""),
                    int(item.get("time", record.timestamp)),
                    int(item.get("count", 0)),
                    item.get("node", ""),
                )
            elif kind == "counts":
                try:
                    self.add_counts(int(item["minute"]), item["counts"])
                    if item.get("shadow"):
                        self.add_shadow(int(item["minute"]), item["shadow"])
                except (KeyError, TypeError, ValueError, AttributeError):
                    continue
            elif kind == "checkpoint":
                self.checkpoints.read(item, record.timestamp)

    def _notify(self, policy: str, at: int, count: int, node: str) -> None:
        for listener in self.listeners:
            listener(policy, at, count, node)

    def prune(self) -> None:
        """Forgets what is older than seven days."""
        horizon = self.clock() - _MAX_AGE_MS
        for item in self._policies.values():
            while item.entries and item.entries[0].get("time", 0) < horizon:
                item.entries.popleft()
            old = [m for m in item.minutes if m * 60_000 < horizon]
            for m in old:
                del item.minutes[m]
            for m in [m for m in item.shadow if m * 60_000 < horizon]:
                del item.shadow[m]

    # -- queries

    def violations(self, policy: str, seconds: int, limit: int = 100) -> list[dict[str, Any]]:
        """History entries of the last ``seconds``, newest first."""
        item = self._policies.get(policy)
        if item is None:
            return []
        since = self.clock() - seconds * 1000
        out = []
        for entry in reversed(item.entries):
            if entry.get("time", 0) < since:
                break
            out.append(entry)
            if len(out) >= limit:
                break
        return out

    def counts(self, policy: str, seconds: int, bucket: int) -> dict[str, Any]:
        """Evaluated and violation counts of the last ``seconds``, and the violations graph."""
        item = self._policies.get(policy)
        now = self.clock()
        since_minute = (now - seconds * 1000) // 60_000
        evaluated = violations = 0
        bucket_minutes = max(1, bucket // 60)
        graph: dict[int, list[int]] = {}
        if item is not None:
            for minute, (e, v) in item.minutes.items():
                if minute < since_minute:
                    continue
                evaluated += e
                violations += v
                start = minute - minute % bucket_minutes
                slot = graph.setdefault(start, [0, 0])
                slot[0] += e
                slot[1] += v
        first = since_minute - since_minute % bucket_minutes
        last = now // 60_000
        series = []
        for start in range(first, last + 1, bucket_minutes):
            e, v = graph.get(start, (0, 0))
            series.append({"time": _iso(start * 60_000), "evaluated": e, "violations": v})
        return {"evaluated": evaluated, "violations": violations, "graph": series}

    def shadow(self, policy: str, seconds: int) -> Shadow:
        """What the policy in shadow mode would have blocked over the last ``seconds`` (fleet-wide, from
        the counts records: it lags as the counts do)."""
        total = Shadow()
        item = self._policies.get(policy)
        if item is None:
            return total
        since_minute = (self.clock() - seconds * 1000) // 60_000
        for minute, bucket in item.shadow.items():
            if minute >= since_minute:
                total.add(bucket.batches, bucket.records, bucket.rules)
        return total

    def policies(self) -> list[str]:
        return sorted(self._policies)


def _iso(ms: int) -> str:
    return (
        datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


# -- reporting ----------------------------------------------------------------------------------


class Reporter:
    """What a node reports: violation entries (rate limited per policy), suppressed counts and
    per-minute counts, queued for the publisher (or ingested at once when there is no topic)."""

    def __init__(self, history: History, max_per_second: int = 100, clock: Callable[[], int] = _now_ms) -> None:
        self.history = history
        self.node = history.node
        self.max_per_second = max_per_second
        self.clock = clock
        self.queue: list[tuple[bytes, bytes]] = []
        self.pending: dict[int, dict[str, list[int]]] = {}  # minute -> policy -> [evaluated, violations]
        self.pending_shadow: dict[int, dict[str, Shadow]] = {}  # minute -> policy -> what shadow mode saw
        self.suppressed: dict[str, int] = {}
        self._second = 0
        self._sent: dict[str, int] = {}
        self._seq = 0
        self.wakeup = trio.Event()
        self.dropped_hook: Callable[[str, int], None] | None = None
        self.connected = False  # True once a publisher serves the queue
        self.flush_requested = False  # publish the counts (and checkpoints) now, not at the interval

    def flush_soon(self) -> None:
        """Asks the publisher for the counts and checkpoints now (the observer stopped)."""
        self.flush_requested = True
        self.wakeup.set()

    def count(self, policy: str, evaluated: int, violations: int, now_ms: int | None = None) -> None:
        minute = (now_ms if now_ms is not None else self.clock()) // 60_000
        bucket = self.pending.setdefault(minute, {}).setdefault(policy, [0, 0])
        bucket[0] += evaluated
        bucket[1] += violations

    def count_shadow(
        self, policy: str, batches: int, records: int, rules: Mapping[str, int], now_ms: int | None = None
    ) -> None:
        """What a policy in shadow mode would have blocked, published with the counts."""
        minute = (now_ms if now_ms is not None else self.clock()) // 60_000
        self.pending_shadow.setdefault(minute, {}).setdefault(policy, Shadow()).add(batches, records, rules)

    def report(self, entry: dict[str, Any]) -> bool:
        """Queues a history entry unless the policy's rate is exceeded; returns whether it was kept."""
        policy = entry["policy"]
        now = entry["time"]
        second = now // 1000
        if second != self._second:
            self._second = second
            self._sent.clear()
        sent = self._sent.get(policy, 0)
        if sent >= self.max_per_second:
            self.suppressed[policy] = self.suppressed.get(policy, 0) + 1
            if self.dropped_hook is not None:
                self.dropped_hook(policy, 1)
            self.wakeup.set()
            return False
        self._sent[policy] = sent + 1
        self._seq += 1
        entry["id"] = f"{self.node}-{self._seq}"
        entry["node"] = self.node
        self.history.add_entry(entry)
        self.queue.append((policy.encode(), orjson.dumps({"type": "violation", **entry})))
        self.wakeup.set()
        return True

    def drain(self, counts: bool, closing: bool = False) -> list[tuple[bytes, bytes]]:
        """Everything to publish now: queued entries, suppressed counts, and (when ``counts``) the counts
        then the observer's checkpoints (final ones when ``closing``)."""
        items, self.queue = self.queue, []
        now = self.clock()
        for policy, count in self.suppressed.items():
            body = {"type": "suppressed", "node": self.node, "time": now, "policy": policy, "count": count}
            items.append((policy.encode(), orjson.dumps(body)))
        self.suppressed = {}
        if counts and (self.pending or self.pending_shadow):
            pending, self.pending = self.pending, {}
            shadow, self.pending_shadow = self.pending_shadow, {}
            for minute in sorted(set(pending) | set(shadow)):
                record: dict[str, Any] = {
                    "type": "counts",
                    "node": self.node,
                    "time": now,
                    "minute": minute,
                    "counts": pending.get(minute, {}),
                }
                if minute in shadow:
                    record["shadow"] = {policy: s.as_json() for policy, s in shadow[minute].items()}
                items.append((b"", orjson.dumps(record)))
        if counts:
            items.extend(self.history.checkpoints.drain(closing))
        return items

    def flush_local(self) -> None:
        """Without a topic: what would be published is ingested directly (a gateway without the
        admin API, such as an embedded test gateway)."""
        items = self.drain(True)
        self.history.ingest([LogRecord(0, k, v, self.clock()) for k, v in items])


def new_node_id() -> str:
    return uuid.uuid4().hex[:12]


#: How long a stopping node may take to write its last counts and checkpoints.
FINAL_FLUSH_TIMEOUT = 2.0


async def _append(log_: StateLog, backlog: list[tuple[bytes, bytes]]) -> None:
    """Writes the backlog (removing what was written) in requests of at most 500 records, the last
    request whole: the counts and checkpoints at the end of a drain go in one request."""
    while backlog:
        size = len(backlog) % 500 or 500
        await log_.append_many(backlog[:size])
        del backlog[:size]


async def publish(reporter: Reporter, log_: StateLog, flush_interval: float) -> None:
    """Publishes the reporter's queue as it fills (at most ~every 50 ms), and counts every interval
    (at once when asked: :meth:`Reporter.flush_soon`). When it stops (the gateway stops), it writes
    what is left, its counts and final checkpoints, within :data:`FINAL_FLUSH_TIMEOUT`."""
    reporter.connected = True
    next_counts = trio.current_time() + flush_interval
    backlog: list[tuple[bytes, bytes]] = []
    delay = 0.2
    try:
        while True:
            with trio.move_on_at(min(next_counts, trio.current_time() + 1.0)):
                await reporter.wakeup.wait()
            reporter.wakeup = trio.Event()
            due = reporter.flush_requested or trio.current_time() >= next_counts
            if due:
                reporter.flush_requested = False
                next_counts = trio.current_time() + flush_interval
            backlog.extend(reporter.drain(due))
            if not backlog:
                continue
            try:
                await _append(log_, backlog)
                delay = 0.2
            except LogError as exc:
                log.warning("data quality history: %s (retrying)", exc)
                if len(backlog) > 100_000:
                    del backlog[: len(backlog) - 100_000]
                await trio.sleep(delay)
                delay = min(delay * 2, 5.0)
            await trio.sleep(0.05)
    finally:
        with trio.CancelScope(shield=True) as final:
            final.deadline = trio.current_time() + FINAL_FLUSH_TIMEOUT
            backlog.extend(reporter.drain(True, closing=True))
            try:
                await _append(log_, backlog)
            except LogError as exc:
                log.warning("data quality history: the last counts and reports were not written: %s", exc)
        if final.cancelled_caught:
            log.warning("data quality history: the last counts and reports were not written in time")


async def follow(
    history: History, log_: StateLog, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Reads the topic from its start, then follows it."""
    delay = 0.2
    while True:
        try:
            await log_.ensure_topic()
            end = await log_.end_offset()
            break
        except LogError as exc:
            log.warning("data quality history topic: %s (retrying)", exc)
            await trio.sleep(delay)
            delay = min(delay * 2, 5.0)
    started = False
    delay = 0.2
    last_prune = time.monotonic()
    while True:
        if not started and history.position >= end:
            started = True
            history.loaded.set()
            task_status.started()
        try:
            records, next_offset = await log_.read(history.position, 0.5)
        except LogError as exc:
            log.warning("data quality history topic: %s (retrying)", exc)
            await trio.sleep(delay)
            delay = min(delay * 2, 5.0)
            continue
        delay = 0.2
        history.ingest(records)
        history.advance(next_offset)
        if time.monotonic() - last_prune > 60:
            history.prune()
            last_prune = time.monotonic()
