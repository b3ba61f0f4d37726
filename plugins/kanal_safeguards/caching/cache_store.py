"""The record-batch store behind the ``cache`` interceptor: per topic-partition, one contiguous run
of batches by offset, bounded by total bytes (least recently used partitions lose their oldest
batches first) and by age (``expireTimeMs``).

Sans-I/O and clock-injected, so that its offset rules are tested against a model log. The rules
that keep a consumer reading through the cache exact: a run never has a hole (a batch is only kept
next to the batches it follows in the log), a read starts at the batch holding the offset asked
for, and nothing beyond the high watermark (read_uncommitted) or the last stable offset
(read_committed, and then only batches outside transactions) is ever served.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

from kanal.api import RecordSet

__all__ = ["CacheStore", "CachedBatch", "PartitionRun", "Served", "contiguous", "parse_batches"]


@dataclass(frozen=True, slots=True)
class CachedBatch:
    """One record batch as the broker holds it (``data`` starts with its base offset)."""

    base: int
    next: int
    data: bytes
    crc: int
    transactional: bool  # a transactional or control batch: never served to read_committed
    fetched: bool  # seen in a Fetch response (the broker's bytes) rather than a Produce request
    leader_epoch: int = -1
    stored_at: float = 0.0


def parse_batches(records: bytes | None, *, fetched: bool) -> list[CachedBatch]:
    """The magic-2 batches of a records field, in order (empty for legacy message sets, which are
    not cached; a truncated trailing batch is left out)."""
    if not records:
        return []
    parsed = RecordSet.parse(records)
    if parsed.has_legacy:
        return []
    return [
        CachedBatch(
            base=b.base_offset,
            next=b.next_offset,
            data=b.to_bytes(),
            crc=b.crc,
            transactional=b.is_transactional or b.is_control,
            fetched=fetched,
            leader_epoch=b.partition_leader_epoch,
        )
        for b in parsed.batches
    ]


def contiguous(batches: list[CachedBatch]) -> list[CachedBatch]:
    """The leading batches that follow each other without a gap (a compacted topic has gaps)."""
    for i in range(1, len(batches)):
        if batches[i].base != batches[i - 1].next:
            return batches[:i]
    return batches


@dataclass(frozen=True, slots=True)
class Served:
    """What a Fetch of one partition gets from the cache."""

    records: bytes
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int


@dataclass(slots=True)
class PartitionRun:
    """One partition: a contiguous run of batches and the offsets last seen from the broker."""

    batches: list[CachedBatch] = field(default_factory=list)
    bases: list[int] = field(default_factory=list)
    size: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    node_id: int | None = None
    leader_epoch: int = -1  # of the last fetched batch; for produced batches, which carry none
    client_epochs: set[int] = field(default_factory=set)  # current_leader_epoch values the broker accepted
    oldest: float = 0.0

    @property
    def start(self) -> int:
        return self.batches[0].base if self.batches else -1

    @property
    def end(self) -> int:
        return self.batches[-1].next if self.batches else -1

    def replace(self, batches: list[CachedBatch]) -> None:
        self.batches = batches
        self.bases = [b.base for b in batches]
        self.size = sum(len(b.data) for b in batches)
        self.oldest = min((b.stored_at for b in batches), default=0.0)

    def drop_first(self) -> int:
        """Removes the oldest-offset batch; returns its size."""
        first = self.batches.pop(0)
        self.bases.pop(0)
        self.size -= len(first.data)
        if first.stored_at <= self.oldest:  # it may have been the oldest stored: expiry reads this
            self.oldest = min((b.stored_at for b in self.batches), default=0.0)
        return len(first.data)


def _merge(run: list[CachedBatch], chunk: list[CachedBatch]) -> list[CachedBatch] | None:
    """``run`` and ``chunk`` (both contiguous, overlapping or adjacent) as one run, or None when
    they disagree (batch bounds differ, or two broker copies of a batch differ: the log changed)."""
    out: list[CachedBatch] = []
    i = j = 0
    while i < len(run) or j < len(chunk):
        x = run[i] if i < len(run) else None
        y = chunk[j] if j < len(chunk) else None
        if y is None or (x is not None and x.next <= y.base):
            out.append(x)  # type: ignore[arg-type]
            i += 1
        elif x is None or y.next <= x.base:
            out.append(y)
            j += 1
        elif x.base == y.base and x.next == y.next:
            if x.fetched and y.fetched and x.crc != y.crc:
                return None
            out.append(y if y.fetched or not x.fetched else x)  # the broker's own bytes win
            i += 1
            j += 1
        else:
            return None
    return out if len(contiguous(out)) == len(out) else None


class CacheStore:
    """Batches per key (a topic-partition, as the interceptor names it), LRU by bytes, with expiry."""

    def __init__(self, max_bytes: int, expire_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.ttl = expire_ms / 1000
        self.clock = clock
        self.size = 0
        self._runs: OrderedDict[Hashable, PartitionRun] = OrderedDict()
        self._next_sweep = 0.0

    def __len__(self) -> int:
        return len(self._runs)

    def run(self, key: Hashable) -> PartitionRun | None:
        """The partition's run (expired batches trimmed first), without touching its LRU place."""
        run = self._runs.get(key)
        if run is not None:
            self._expire(key, run, self.clock())
        return self._runs.get(key)

    # -- what the broker said -----------------------------------------------------------------

    def observe(
        self,
        key: Hashable,
        *,
        high_watermark: int,
        last_stable_offset: int,
        log_start_offset: int,
        node_id: int | None,
        client_epoch: int = -1,
    ) -> None:
        """A successful Fetch answer for the partition. Offsets only move forward: answers from
        several connections may arrive out of order."""
        run = self._entry(key)
        run.high_watermark = max(run.high_watermark, high_watermark)
        run.last_stable_offset = max(run.last_stable_offset, last_stable_offset)
        run.log_start_offset = max(run.log_start_offset, log_start_offset)
        if node_id != run.node_id:
            run.node_id = node_id
            run.client_epochs.clear()
        if client_epoch >= 0:
            run.client_epochs.add(client_epoch)
        while run.batches and run.batches[0].next <= run.log_start_offset:
            self.size -= run.drop_first()  # deleted by retention or DeleteRecords

    def acknowledged(self, key: Hashable, next_offset: int, node_id: int | None) -> None:
        """A Produce with acks=all succeeded up to ``next_offset``: the broker answers it only once
        the high watermark passed it, so read_uncommitted reads may go that far. The last stable
        offset follows when it was the high watermark and every batch from there on is in the run
        and outside transactions (so no transaction can have opened in between)."""
        run = self._runs.get(key)
        if run is None or run.node_id != node_id or next_offset <= run.high_watermark:
            return
        old = run.high_watermark
        if 0 <= old == run.last_stable_offset and run.start <= old and next_offset <= run.end:
            i = bisect_right(run.bases, old) - 1
            span = run.batches[i:]
            if span and span[0].base == old and not any(b.transactional for b in span if b.base < next_offset):
                run.last_stable_offset = next_offset
        run.high_watermark = next_offset

    def drop(self, key: Hashable) -> None:
        run = self._runs.pop(key, None)
        if run is not None:
            self.size -= run.size

    def drop_where(self, predicate: Callable[[Hashable], bool]) -> None:
        for key in [k for k in self._runs if predicate(k)]:
            self.drop(key)

    # -- batches ------------------------------------------------------------------------------

    def add(self, key: Hashable, batches: Iterable[CachedBatch], node_id: int | None = None) -> None:
        """Batches of the partition's log (in order). The contiguous prefix joins the run when it
        overlaps or touches it, else replaces it (the most recent reads and writes are kept)."""
        now = self.clock()
        chunk: list[CachedBatch] = []
        for b in contiguous(list(batches)):
            if len(b.data) > self.max_bytes:
                break  # never fits: the run ends before it
            chunk.append(CachedBatch(b.base, b.next, b.data, b.crc, b.transactional, b.fetched, b.leader_epoch, now))
        if not chunk:
            return
        run = self._entry(key)
        if node_id is not None and run.node_id is None:
            run.node_id = node_id
        self._expire(key, run, now)
        run = self._entry(key)
        self.size -= run.size
        if not run.batches or chunk[-1].next < run.start or chunk[0].base > run.end:
            merged = chunk
        elif chunk[0].base == run.end:
            merged = run.batches + chunk
        elif chunk[-1].next == run.start:
            merged = chunk + run.batches
        else:
            merged = _merge(run.batches, chunk) or chunk
        run.replace(merged)
        fetched_epochs = [b.leader_epoch for b in chunk if b.fetched and b.leader_epoch >= 0]
        if fetched_epochs:
            run.leader_epoch = fetched_epochs[-1]
        self.size += run.size
        self._runs.move_to_end(key)
        self._evict(now)

    def read(self, key: Hashable, offset: int, max_bytes: int, *, committed: bool = False) -> Served | None:
        """The batches from the one holding ``offset``, up to ``max_bytes`` (at least one batch, as
        a broker does), or None when the cache cannot answer exactly as the broker would."""
        run = self._runs.get(key)
        if run is None:
            return None
        now = self.clock()
        self._expire(key, run, now)
        if not run.batches or not run.start <= offset < run.end or offset < run.log_start_offset:
            return None
        limit = run.last_stable_offset if committed else run.high_watermark
        i = bisect_right(run.bases, offset) - 1
        taken: list[bytes] = []
        size = 0
        for b in run.batches[i:]:
            if b.next > limit or (committed and b.transactional):
                break
            if taken and size + len(b.data) > max_bytes:
                break
            taken.append(b.data)
            size += len(b.data)
        if not taken:
            return None
        self._runs.move_to_end(key)
        return Served(b"".join(taken), run.high_watermark, run.last_stable_offset, run.log_start_offset)

    # -- bounds -------------------------------------------------------------------------------

    def _entry(self, key: Hashable) -> PartitionRun:
        run = self._runs.get(key)
        if run is None:
            run = self._runs[key] = PartitionRun()
        return run

    def _expire(self, key: Hashable, run: PartitionRun, now: float) -> None:
        """Drops the batches older than the expiry time, keeping the run contiguous: what follows
        the last expired batch stays."""
        if not run.batches or run.oldest + self.ttl > now:
            return
        last = max(i for i, b in enumerate(run.batches) if b.stored_at + self.ttl <= now)
        self.size -= run.size
        run.replace(run.batches[last + 1 :])
        self.size += run.size

    def _evict(self, now: float) -> None:
        if now >= self._next_sweep:  # expired batches of partitions nobody reads any more
            self._next_sweep = now + self.ttl / 4
            for key, run in list(self._runs.items()):
                self._expire(key, run, now)
        while self.size > self.max_bytes:
            key, run = next(iter(self._runs.items()))
            if run.batches:
                self.size -= run.drop_first()
            if not run.batches:
                del self._runs[key]
