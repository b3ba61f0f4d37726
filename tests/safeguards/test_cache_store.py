"""The cache interceptor's store against a model log: offsets never skip or repeat, nothing past the
high watermark, LRU eviction by bytes and expiry with an injected clock."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from kanal_safeguards.caching.cache_store import CachedBatch, CacheStore, Served, parse_batches

from kanal.api import Record, RecordSet, encode_batch

KEY = (None, "t", 0)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def batch(base: int, count: int, *, fetched: bool = True, transactional: bool = False, tag: bytes = b"") -> CachedBatch:
    """A real record batch of ``count`` records at ``base``."""
    records = [
        Record(offset_delta=i, timestamp_delta=0, key=None, value=tag + b"%d" % (base + i)) for i in range(count)
    ]
    data = encode_batch(records, base_timestamp=1_700_000_000_000, base_offset=base)
    [parsed] = parse_batches(data, fetched=fetched)
    if transactional:
        return CachedBatch(parsed.base, parsed.next, parsed.data, parsed.crc, True, fetched)
    return parsed


def offsets(served: Served) -> list[int]:
    """The offsets of every record of the served batches, in order."""
    return [b.offset_of(r) for b in RecordSet.parse(served.records).batches for r in b.records()]


def observe(store: CacheStore, hw: int, lso: int | None = None, start: int = 0) -> None:
    store.observe(
        KEY, high_watermark=hw, last_stable_offset=hw if lso is None else lso, log_start_offset=start, node_id=1
    )


def test_a_read_starts_at_the_batch_holding_the_offset_and_stops_at_the_high_watermark() -> None:
    store = CacheStore(1 << 20, 60_000)
    store.add(KEY, [batch(0, 3), batch(3, 2), batch(5, 4)], node_id=1)
    assert store.read(KEY, 0, 1 << 20) is None  # no high watermark seen yet
    observe(store, 5)
    served = store.read(KEY, 4, 1 << 20)
    assert served is not None and offsets(served) == [3, 4]  # the whole batch holding 4, not the one past 5
    assert served.high_watermark == 5
    assert store.read(KEY, 5, 1 << 20) is None  # at the high watermark: the broker must wait for data
    assert store.read(KEY, 9, 1 << 20) is None


def test_a_read_takes_whole_batches_up_to_max_bytes_and_at_least_one() -> None:
    store = CacheStore(1 << 20, 60_000)
    batches = [batch(i * 2, 2) for i in range(5)]
    store.add(KEY, batches, node_id=1)
    observe(store, 10)
    one = len(batches[0].data)
    served = store.read(KEY, 0, one * 2 + 1)
    assert served is not None and offsets(served) == [0, 1, 2, 3]
    served = store.read(KEY, 0, 1)
    assert served is not None and offsets(served) == [0, 1]


def test_read_committed_stops_at_the_last_stable_offset_and_at_transactions() -> None:
    store = CacheStore(1 << 20, 60_000)
    store.add(KEY, [batch(0, 2), batch(2, 2), batch(4, 2, transactional=True), batch(6, 2)], node_id=1)
    observe(store, 8, lso=4)
    served = store.read(KEY, 0, 1 << 20, committed=True)
    assert served is not None and offsets(served) == [0, 1, 2, 3]
    assert store.read(KEY, 4, 1 << 20, committed=True) is None
    observe(store, 8, lso=8)
    assert store.read(KEY, 4, 1 << 20, committed=True) is None  # a transactional batch: left to the broker
    served = store.read(KEY, 4, 1 << 20)
    assert served is not None and offsets(served) == [4, 5, 6, 7]  # read_uncommitted sees it, as from the broker


def test_batches_that_do_not_touch_the_run_replace_it_and_a_gap_ends_a_chunk() -> None:
    store = CacheStore(1 << 20, 60_000)
    store.add(KEY, [batch(0, 2), batch(2, 2)], node_id=1)
    store.add(KEY, [batch(10, 2), batch(13, 2)], node_id=1)  # a gap after 12 (a compacted topic)
    observe(store, 20)
    run = store.run(KEY)
    assert run is not None and (run.start, run.end) == (10, 12)
    store.add(KEY, [batch(6, 2), batch(8, 2)], node_id=1)  # touches the run's start: joins it
    run = store.run(KEY)
    assert run is not None and (run.start, run.end) == (6, 12)


def test_a_changed_log_replaces_the_run() -> None:
    store = CacheStore(1 << 20, 60_000)
    store.add(KEY, [batch(0, 2), batch(2, 2)], node_id=1)
    store.add(KEY, [batch(2, 2, tag=b"new"), batch(4, 2)], node_id=1)  # same bounds, other bytes
    observe(store, 6)
    run = store.run(KEY)
    assert run is not None and (run.start, run.end) == (2, 6)
    store.add(KEY, [batch(3, 3)], node_id=1)  # bounds that cut a cached batch
    run = store.run(KEY)
    assert run is not None and (run.start, run.end) == (3, 6)


def test_lru_eviction_by_bytes_drops_the_least_recently_used_partition_oldest_batches_first() -> None:
    one = len(batch(0, 2).data)
    store = CacheStore(one * 4, 60_000)
    a, b, c = (None, "a", 0), (None, "b", 0), (None, "c", 0)
    store.add(a, [batch(0, 2), batch(2, 2)], node_id=1)
    store.add(b, [batch(0, 2), batch(2, 2)], node_id=1)
    assert store.size == one * 4
    store.observe(a, high_watermark=4, last_stable_offset=4, log_start_offset=0, node_id=1)
    assert store.read(a, 0, 1) is not None  # a is now the most recently used, b the least
    store.add(c, [batch(0, 2)], node_id=1)  # one batch too many
    assert store.size == one * 4
    run_a, run_b = store.run(a), store.run(b)
    assert run_a is not None and (run_a.start, run_a.end) == (0, 4)
    assert run_b is not None and (run_b.start, run_b.end) == (2, 4)  # its oldest batch went
    store.add(c, [batch(2, 2), batch(4, 2)], node_id=1)
    assert store.run(b) is None  # b emptied entirely
    run_a = store.run(a)
    assert run_a is not None and (run_a.start, run_a.end) == (2, 4)
    assert store.size == one * 4


def test_a_batch_larger_than_the_cache_is_not_kept() -> None:
    store = CacheStore(10, 60_000)
    store.add(KEY, [batch(0, 2)], node_id=1)
    assert store.size == 0 and store.run(KEY) is None


def test_batches_expire_after_expire_time_ms_and_the_run_stays_contiguous() -> None:
    clock = Clock()
    store = CacheStore(1 << 20, 1000, clock)
    store.add(KEY, [batch(0, 2)], node_id=1)
    clock.now += 0.6
    store.add(KEY, [batch(2, 2)], node_id=1)
    observe(store, 4)
    assert store.read(KEY, 0, 1 << 20) is not None
    clock.now += 0.5  # the first batch is 1.1 s old, the second 0.5 s
    assert store.read(KEY, 0, 1 << 20) is None
    served = store.read(KEY, 2, 1 << 20)
    assert served is not None and offsets(served) == [2, 3]
    clock.now += 0.5
    assert store.read(KEY, 2, 1 << 20) is None
    assert store.size == 0


def test_expired_batches_of_partitions_nobody_reads_leave_on_the_next_write() -> None:
    clock = Clock()
    store = CacheStore(1 << 20, 1000, clock)
    store.add((None, "idle", 0), [batch(0, 2)], node_id=1)
    clock.now += 2
    store.add(KEY, [batch(0, 2)], node_id=1)
    assert store.size == len(batch(0, 2).data)


def test_an_acknowledged_produce_moves_the_offsets_only_over_batches_the_run_holds() -> None:
    store = CacheStore(1 << 20, 60_000)
    store.add(KEY, [batch(0, 2)], node_id=1)
    observe(store, 2)
    store.add(KEY, [batch(2, 2, fetched=False)], node_id=1)
    store.acknowledged(KEY, 4, node_id=1)
    served = store.read(KEY, 2, 1 << 20, committed=True)
    assert served is not None and offsets(served) == [2, 3] and served.last_stable_offset == 4
    store.add(KEY, [batch(4, 2, fetched=False, transactional=True)], node_id=1)
    store.acknowledged(KEY, 6, node_id=1)
    run = store.run(KEY)
    assert run is not None and (run.high_watermark, run.last_stable_offset) == (6, 4)
    store.acknowledged(KEY, 9, node_id=2)  # another broker's answer: not this run's
    assert run.high_watermark == 6


# -- against a model log -------------------------------------------------------------------------


@dataclass
class Model:
    """The broker's log: batches (base, count) back to back, and what a consumer has read."""

    batches: list[CachedBatch] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.batches[-1].next if self.batches else 0

    def fetch(self, offset: int, max_bytes: int) -> list[CachedBatch]:
        """What a broker answers: from the batch holding ``offset``, at least one batch."""
        out: list[CachedBatch] = []
        size = 0
        for b in self.batches:
            if b.next <= offset:
                continue
            if out and size + len(b.data) > max_bytes:
                break
            out.append(b)
            size += len(b.data)
        return out


step = st.one_of(
    st.tuples(st.just("produce"), st.integers(1, 4), st.booleans()),  # records; seen by the cache?
    st.tuples(st.just("fetch"), st.integers(0, 60), st.integers(1, 400)),  # offset; max bytes
    st.tuples(st.just("read"), st.integers(0, 60), st.integers(1, 400)),
    st.tuples(st.just("tick"), st.integers(0, 700), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=60), st.integers(150, 2000))
def test_reads_from_the_cache_give_exactly_the_model_logs_offsets(steps: list[tuple[str, int, int]], size: int) -> None:
    clock = Clock()
    store = CacheStore(size, 1000, clock)
    model = Model()
    consumer = 0  # a consumer reading the whole log through the cache where it can, else the broker
    consumed: list[int] = []
    for kind, a, b in steps:
        if kind == "produce":
            produced = batch(model.end, a, fetched=False)
            model.batches.append(produced)
            if b:  # a produce through the gateway, acknowledged by all replicas
                store.add(KEY, [produced], node_id=1)
                store.acknowledged(KEY, produced.next, node_id=1)
        elif kind == "fetch":
            answer = model.fetch(a, b)
            observe(store, model.end)
            store.add(KEY, answer, node_id=1)
        elif kind == "tick":
            clock.now += a / 1000
        served = store.read(KEY, a, b) if kind == "read" else None
        if served is not None:
            expected = [o for x in model.fetch(a, b)[: len(RecordSet.parse(served.records).batches)] for o in offs(x)]
            assert offsets(served) == expected
            assert offsets(served)[-1] < model.end and served.high_watermark <= model.end
        # the consumer moves on by one Fetch, from the cache when it answers
        if consumer < model.end:
            got = store.read(KEY, consumer, 300)
            got_offsets = offsets(got) if got is not None else [o for x in model.fetch(consumer, 300) for o in offs(x)]
            new = [o for o in got_offsets if o >= consumer]
            consumed.extend(new)
            consumer = new[-1] + 1
    assert consumed == list(range(len(consumed)))  # nothing skipped, nothing repeated


def offs(b: CachedBatch) -> list[int]:
    return list(range(b.base, b.next))


def test_expiry_after_the_oldest_batch_was_evicted_keeps_the_younger_ones() -> None:
    """Eviction by bytes took the oldest stored batch: expiry must not think it is still there."""
    clock = Clock()
    one = len(batch(0, 2).data)
    store = CacheStore(one * 2, 1000, clock)
    store.add(KEY, [batch(0, 2)], node_id=1)
    clock.now += 0.6
    store.add(KEY, [batch(2, 2), batch(4, 2)], node_id=1)  # one too many: batch 0 is evicted
    observe(store, 6)
    clock.now += 0.5  # batch 0 would have been 1.1 s old; the others are 0.5 s
    served = store.read(KEY, 2, 1 << 20)
    assert served is not None and offsets(served) == [2, 3, 4, 5]
