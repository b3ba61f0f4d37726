"""Fleet-wide limits without a broker (``kanal_safeguards.limits.fleet_usage``): nodes made of
``kanal.testing``'s fakes (a :class:`FakeFleet` each, one in-memory usage topic between them) run
the limiters and the background task, with clients sending real Produce requests through the
harness. Trio's ``MockClock`` jumps ahead whenever every task waits (the gateway's holds, the
periods), so seconds of traffic take milliseconds, and the bytes let through are counted, never timed.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
import trio
import trio.testing
from kanal_safeguards.limits.fleet_usage import FleetLimits, fleet_limits, usage_topic
from kanal_safeguards.limits.rate_limits import ProducerRateLimiting
from kanal_safeguards.limits.requests import LimitCommitOffset
from kanal_safeguards.limits.shares import FLOOR, PERIOD, STALE_AFTER, floor_of

from kanal.api import (
    ApiKey,
    LogError,
    LogRecord,
    Record,
    StateLog,
    build,
    encode_batch,
    nested,
    require_request_class,
    response_class,
)
from kanal.testing import FakeFleet, FakeServices, Harness, MemoryStateLog

BATCH = encode_batch([Record(i, 0, None, b"x" * 500, []) for i in range(4)], base_timestamp=1)
SIZE = len(BATCH)  # one Produce request's records
LIMIT = 100 * SIZE  # bytes per second, fleet-wide


def produce() -> Any:
    cls = require_request_class(ApiKey.PRODUCE, 9)
    topic_cls = nested(cls, "topic_data")
    part = build(nested(topic_cls, "partition_data"), index=0, records=BATCH)
    return build(
        cls,
        acks=1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(build(topic_cls, name="t", partition_data=(part,)),),
    )


def produce_ok(request: Any) -> Any:
    cls = response_class(ApiKey.PRODUCE, int(request.__version__))
    topic_cls = nested(cls, "responses")
    part_cls = nested(topic_cls, "partition_responses")
    parts = tuple(build(part_cls, index=p.index) for t in request.topic_data for p in t.partition_data)
    return build(cls, responses=(build(topic_cls, name="t", partition_responses=parts),))


class Topic:
    """The usage topic on the backing cluster: one log, seen by every node; ``down`` fails every call."""

    def __init__(self) -> None:
        self.log = MemoryStateLog("usage")
        self.down = False
        self.opened: list[str] = []


class TopicView(StateLog):
    """One node's connection to the topic (closing it leaves the topic to the others)."""

    def __init__(self, topic: Topic, node: NodeServices) -> None:
        self._topic = topic
        self._node = node
        self.topic = topic.log.topic

    def _down(self) -> bool:
        return self._topic.down or self._node.cut_off

    def _check(self) -> MemoryStateLog:
        if self._down():
            raise LogError("the backing cluster is unreachable")
        return self._topic.log

    async def ensure_topic(self) -> None:
        await self._check().ensure_topic()

    async def append(self, key: bytes, value: bytes | None) -> int:
        return await self._check().append(key, value)

    async def append_many(self, items: Sequence[tuple[bytes, bytes | None]]) -> int:
        return await self._check().append_many(items)

    async def end_offset(self) -> int:
        return await self._check().end_offset()

    async def read(self, offset: int, max_wait: float = 0.5) -> tuple[list[LogRecord], int]:
        if self._down():
            await trio.sleep(max_wait)
        return await self._check().read(offset, max_wait)

    async def aclose(self) -> None:
        pass


class NodeServices(FakeServices):
    def __init__(self, topic: Topic, fleet: FakeFleet) -> None:
        super().__init__(fleet=fleet)
        self.topic = topic
        self.cut_off = False  # this node cannot reach the cluster

    def state_log(self, topic: str, *, compacted: bool = True, retention_ms: int | None = None) -> StateLog:
        assert compacted
        self.topic.opened.append(topic)
        return TopicView(self.topic, self)


class Node:
    """A gateway node with a fleet-wide producer-rate-limiting of ``LIMIT`` and a client that can
    produce as fast as it is let through (``clients``: how many send at once)."""

    def __init__(self, topic: Topic, fleet: FakeFleet, limit: int = LIMIT) -> None:
        self.fleet = fleet
        self.services = NodeServices(topic, fleet)
        self.limits: FleetLimits = fleet_limits(self.services)
        self.limits.wall = trio.current_time  # periods on the mock clock
        self.harness = Harness(services=self.services)
        producer = self.harness.add(ProducerRateLimiting, {"maximumBytesPerSecond": limit}, name="produce-rate")
        assert isinstance(producer, ProducerRateLimiting)
        producer.use_clock(trio.current_time)
        self.producer = producer
        self.sent = 0  # bytes let through

    @property
    def rate(self) -> float:
        return self.producer.buckets.rate_of(None)  # limitBy RULE: one bucket, key None

    async def client(self) -> None:
        while True:
            await self.harness.request(produce(), produce_ok)
            self.sent += SIZE

    def metric(self) -> float | None:
        labels = {"plugin": "producer-rate-limiting", "interceptor": "produce-rate", "scope": ""}
        return self.services.metrics.get_sample_value("kanal_limit_share", labels)


def run(test: Callable[[trio.Nursery], Awaitable[Any]]) -> Any:
    """Runs ``test(nursery)`` on a mock clock; the nursery's tasks are cancelled when it returns."""

    async def main() -> Any:
        async with trio.open_nursery() as nursery:
            result = await test(nursery)
            nursery.cancel_scope.cancel()
        return result

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def wait_until(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    """Polls ``condition`` on the mock clock (fails after ``seconds`` of it)."""
    with trio.fail_after(seconds):
        while not condition():
            await trio.sleep(0.05)


def fleet_of(*names: str) -> list[FakeFleet]:
    return [FakeFleet(node_id=name, members=list(names), leader=names[0]) for name in names]


def test_a_node_alone_keeps_the_whole_limit_and_never_touches_the_cluster() -> None:
    topic = Topic()

    async def test(nursery: trio.Nursery) -> float:
        node = Node(topic, FakeFleet())
        nursery.start_soon(node.limits.run)
        nursery.start_soon(node.client)
        await trio.sleep(5.0)
        sent = node.sent
        await trio.sleep(10.0)
        assert node.rate == LIMIT and node.metric() == LIMIT
        return (node.sent - sent) / 10.0

    assert run(test) == pytest.approx(LIMIT, rel=0.05)
    assert topic.opened == []


def test_two_nodes_hold_the_limit_together_with_all_the_clients_on_one() -> None:
    topic = Topic()
    fleet_a, fleet_b = fleet_of("a", "b")

    async def test(nursery: trio.Nursery) -> tuple[float, Node, Node]:
        a, b = Node(topic, fleet_a), Node(topic, fleet_b)
        for node in (a, b):
            nursery.start_soon(node.limits.run)
        await trio.testing.wait_all_tasks_blocked()
        assert a.rate == b.rate == LIMIT / 2  # at once: base shares, before any report
        for _ in range(3):
            nursery.start_soon(a.client)
        await wait_until(lambda: b.rate < LIMIT / 4)  # b's idle share shrinks to the floor
        started, sent = trio.current_time(), a.sent + b.sent
        await trio.sleep(20.0)
        rate = (a.sent + b.sent - sent) / (trio.current_time() - started)
        return rate, a, b

    rate, a, b = run(test)
    assert LIMIT * (1 - FLOOR) * 0.95 <= rate <= LIMIT * 1.02
    assert b.rate == pytest.approx(floor_of(LIMIT, 2))
    assert a.rate + b.rate == pytest.approx(LIMIT)
    assert a.metric() == pytest.approx(a.rate) and b.metric() == pytest.approx(b.rate)
    assert set(topic.opened) == {usage_topic(a.services)} == {"_kanal_test_limit_usage"}


def test_the_shares_follow_members_joining_and_leaving() -> None:
    topic = Topic()
    fleet_a, fleet_b = fleet_of("a", "b")

    async def test(nursery: trio.Nursery) -> None:
        a, b = Node(topic, fleet_a), Node(topic, fleet_b)
        for node in (a, b):
            nursery.start_soon(node.limits.run)
        nursery.start_soon(a.client)
        await wait_until(lambda: a.rate > LIMIT * 0.9)
        # c joins: it has no report yet, so both reserve it its base share at once
        fleet_c = FakeFleet(node_id="c", members=["a", "b", "c"], leader="a")
        c = Node(topic, fleet_c)
        nursery.start_soon(c.limits.run)
        for fleet in (fleet_a, fleet_b):
            fleet.rebalance(members=["a", "b", "c"])
        await trio.testing.wait_all_tasks_blocked()
        assert c.rate == pytest.approx(LIMIT / 3)
        assert a.rate + b.rate + c.rate == pytest.approx(LIMIT)
        # c reports, idle: its share goes back to a
        await wait_until(lambda: c.rate < LIMIT / 10)
        assert a.rate + b.rate + c.rate == pytest.approx(LIMIT)
        # b and c leave: a alone has the whole limit again
        fleet_a.rebalance(members=["a"])
        await trio.testing.wait_all_tasks_blocked()
        assert a.rate == LIMIT

    run(test)


def test_a_node_cut_off_from_the_cluster_is_reserved_its_base_share() -> None:
    topic = Topic()
    fleet_a, fleet_b = fleet_of("a", "b")

    async def test(nursery: trio.Nursery) -> None:
        a, b = Node(topic, fleet_a), Node(topic, fleet_b)
        for node in (a, b):
            nursery.start_soon(node.limits.run)
        nursery.start_soon(a.client)
        await wait_until(lambda: a.rate > LIMIT * 0.9)
        b.services.cut_off = True  # its last report stays in the topic, and goes stale
        await trio.sleep(STALE_AFTER + 2 * PERIOD)
        # b takes its base share by itself; a reserves it that share: the limit still holds
        assert a.rate == pytest.approx(LIMIT / 2) and b.rate == pytest.approx(LIMIT / 2)

    run(test)


def test_when_the_usage_topic_fails_each_node_takes_its_base_share_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = Topic()
    fleet_a, fleet_b = fleet_of("a", "b")

    async def test(nursery: trio.Nursery) -> None:
        a, b = Node(topic, fleet_a), Node(topic, fleet_b)
        for node in (a, b):
            nursery.start_soon(node.limits.run)
        nursery.start_soon(a.client)
        await wait_until(lambda: a.rate > LIMIT * 0.9)
        topic.down = True
        await wait_until(lambda: a.rate == b.rate == LIMIT / 2)
        await trio.sleep(10.0)  # many failed periods
        assert a.rate == b.rate == LIMIT / 2
        topic.down = False
        await wait_until(lambda: a.rate > LIMIT * 0.9)

    with caplog.at_level(logging.WARNING, logger="kanal_safeguards.limits.fleet_usage"):
        run(test)
    failures = [r.getMessage() for r in caplog.records if "cannot" in r.getMessage()]
    assert len(failures) == 2, failures  # once per node, not once per period
    assert all("_kanal_test_limit_usage" in message and "limit / members" in message for message in failures)


def commit(group: str) -> Any:
    cls = require_request_class(ApiKey.OFFSET_COMMIT, 8)
    topic_cls = nested(cls, "topics")
    partition = build(nested(topic_cls, "partitions"), partition_index=0, committed_offset=1)
    topics = (build(topic_cls, name="t", partitions=(partition,)),)
    return build(cls, group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=topics)


def commit_ok(request: Any) -> Any:
    cls = response_class(ApiKey.OFFSET_COMMIT, 8)
    topic_cls = nested(cls, "topics")
    partition = build(nested(topic_cls, "partitions"), partition_index=0)
    return build(cls, topics=(build(topic_cls, name="t", partitions=(partition,)),))


async def accepted(harness: Harness, group: str, count: int) -> int:
    """How many of ``count`` commits of ``group`` the node let through."""
    through = 0
    for _ in range(count):
        exchange = await harness.request(commit(group), commit_ok)
        through += exchange.forwarded is not None
    return through


def test_commits_per_minute_hold_for_the_fleet_in_whole_counts() -> None:
    topic = Topic()

    async def test(nursery: trio.Nursery) -> list[int]:
        harnesses = []
        for fleet in fleet_of("a", "b"):
            services = NodeServices(topic, fleet)
            fleet_limits(services).wall = trio.current_time
            harness = Harness(services=services)
            harness.add(LimitCommitOffset, {"maximumCommitsPerMinute": 10}, name="commits")
            harnesses.append(harness)
            nursery.start_soon(fleet_limits(services).run)
        a, b = harnesses
        await trio.testing.wait_all_tasks_blocked()
        # group "orders" commits through a: its base share (5 of 10) gets through, the rest is refused
        counts = [await accepted(a, "orders", 8)]
        await trio.sleep(2 * PERIOD)  # a reported that it refused some: it now has all but b's floor (1)
        counts += [await accepted(a, "orders", 8), await accepted(b, "orders", 3)]
        return counts

    # 10 commits of the group in the minute over the fleet, not 10 per node
    assert run(test) == [5, 4, 1]
