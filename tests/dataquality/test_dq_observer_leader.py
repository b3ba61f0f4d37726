"""The observer of clusters without a gateway runs on the fleet's leader only, without a network.

Each node is the plugin's runtime and services (``run_services``, as the gateway runs them) over
``kanal.testing``'s fakes: a :class:`~kanal.testing.FakeFleet` the test makes lead or follow, an
in-memory history topic shared by the nodes (each node with its own handle, which it closes when it
stops), and a cluster without a gateway played by :class:`FakeCluster` (Metadata, ListOffsets and
long-polling Fetch over in-memory partitions).

Trio's ``MockClock`` jumps ahead whenever every task waits, so a fetch's long poll, the counts flush
interval and the handover wait cost no real time; where a test shows that a node does *not* observe,
it lets virtual seconds pass (the only way to see that nothing happens) and checks what it did.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio
import trio.testing
from kanal_dataquality.history import Checkpoint
from kanal_dataquality.plugin import runtime_of
from kanal_dataquality.resources import POLICY, RULE
from kanal_dataquality.runtime import Runtime
from kanal_dataquality.services import history_topic, run_services

from kanal.api import (
    ApiKey,
    ErrorCode,
    KafkaClient,
    LogError,
    LogRecord,
    Record,
    StateLog,
    build,
    encode_batch,
    nested,
    response_class,
    while_leader,
)
from kanal.testing import FakeFleet, FakeKafka, FakeServices, MemoryStateLog

CLUSTER = "legacy"
TOPIC = "orders"
POLICY_NAME = "positive"
GOOD = json.dumps({"amount": 10}).encode()
BAD = json.dumps({"amount": -5}).encode()
QUIET = 30.0  # virtual seconds in which a node that does not observe shows that it does not


# -- a cluster without a gateway ---------------------------------------------------------------------


class FakeCluster:
    """Partitions in memory; answers the observer's requests as a broker (node 1) would. ``fetches``
    counts the Fetch requests of each node."""

    def __init__(self, topics: Mapping[str, int]) -> None:
        self.partitions: dict[tuple[str, int], list[bytes]] = {
            (topic, p): [] for topic, count in topics.items() for p in range(count)
        }
        self.fetches: dict[str, int] = {}
        self._written = trio.Event()

    def produce(self, topic: str, partition: int, values: Sequence[bytes]) -> None:
        self.partitions[(topic, partition)].extend(values)
        written, self._written = self._written, trio.Event()
        written.set()

    def client(self, node: str) -> KafkaClient:
        return FakeKafka(lambda request: self.answer(request, node))

    async def answer(self, request: Any, node: str) -> Any:
        api_key, version = int(request.__api_key__), int(request.__version__)
        cls = response_class(api_key, version)
        if api_key == ApiKey.METADATA:
            return self._metadata(cls)
        if api_key == ApiKey.LIST_OFFSETS:
            return self._end_offsets(cls, request)
        assert api_key == ApiKey.FETCH, request
        self.fetches[node] = self.fetches.get(node, 0) + 1
        wanted = {(t.topic, p.partition): int(p.fetch_offset) for t in request.topics for p in t.partitions}
        if not any(len(self.partitions[tp]) != offset for tp, offset in wanted.items()):
            with trio.move_on_after(request.max_wait.total_seconds()):
                await self._written.wait()
        return self._fetch(cls, wanted)

    def _metadata(self, cls: Any) -> Any:
        topic_cls = nested(cls, "topics")
        part_cls = nested(topic_cls, "partitions")
        names = sorted({topic for topic, _ in self.partitions})
        topics = tuple(
            build(
                topic_cls,
                name=name,
                partitions=tuple(
                    build(part_cls, partition_index=p, leader_id=1) for t, p in sorted(self.partitions) if t == name
                ),
            )
            for name in names
        )
        broker = build(nested(cls, "brokers"), node_id=1, host="legacy-1", port=9092)
        return build(cls, brokers=(broker,), topics=topics)

    def _end_offsets(self, cls: Any, request: Any) -> Any:
        topic_cls = nested(cls, "topics")
        part_cls = nested(topic_cls, "partitions")
        topics = tuple(
            build(
                topic_cls,
                name=t.name,
                partitions=tuple(
                    build(
                        part_cls,
                        partition_index=p.partition_index,
                        offset=len(self.partitions[(t.name, p.partition_index)]),
                    )
                    for p in t.partitions
                ),
            )
            for t in request.topics
        )
        return build(cls, topics=topics)

    def _fetch(self, cls: Any, wanted: Mapping[tuple[str, int], int]) -> Any:
        topic_cls = nested(cls, "responses")
        part_cls = nested(topic_cls, "partitions")
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition), offset in wanted.items():
            values = self.partitions[(topic, partition)]
            if offset > len(values):
                out_of_range = build(
                    part_cls,
                    partition_index=partition,
                    error_code=ErrorCode.offset_out_of_range,
                    high_watermark=len(values),
                    log_start_offset=0,
                )
                by_topic.setdefault(topic, []).append(out_of_range)
                continue
            records = None
            if len(values) > offset:
                batch = [Record(offset_delta=i, value=v) for i, v in enumerate(values[offset:])]
                records = encode_batch(batch, base_offset=offset, base_timestamp=1_700_000_000_000)
            by_topic.setdefault(topic, []).append(
                build(part_cls, partition_index=partition, high_watermark=len(values), records=records)
            )
        return build(
            cls, responses=tuple(build(topic_cls, topic=t, partitions=tuple(ps)) for t, ps in by_topic.items())
        )


# -- nodes ---------------------------------------------------------------------------------------------


class NodeLog(StateLog):
    """One node's handle on the shared history topic: closing it (the node stops) or ``failing`` (the
    node vanished: nothing it writes arrives) does not touch the other nodes' handles."""

    def __init__(self, shared: MemoryStateLog, node: Node) -> None:
        self.shared = shared
        self.topic = shared.topic
        self.node = node
        self.closed = False

    async def ensure_topic(self) -> None:
        await self.shared.ensure_topic()

    async def append(self, key: bytes, value: bytes | None) -> int:
        return await self.append_many([(key, value)])

    async def append_many(self, items: Sequence[tuple[bytes, bytes | None]]) -> int:
        if self.closed or self.node.vanished:
            raise LogError(f"state log {self.topic}: not written")
        return await self.shared.append_many(items)

    async def end_offset(self) -> int:
        return await self.shared.end_offset()

    async def read(self, offset: int, max_wait: float = 0.5) -> tuple[list[LogRecord], int]:
        return await self.shared.read(offset, max_wait)

    async def aclose(self) -> None:
        self.closed = True


class NodeServices(FakeServices):
    def __init__(self, node: Node, fleet: FakeFleet, settings: Mapping[str, str]) -> None:
        super().__init__(cluster_id="gw", settings=settings, fleet=fleet)
        self.node = node

    def state_log(self, topic: str, *, compacted: bool = True, retention_ms: int | None = None) -> StateLog:
        shared = self.node.topics.setdefault(topic, MemoryStateLog(topic))
        return NodeLog(shared, self.node)

    def connect(self, properties: Mapping[str, str]) -> KafkaClient:
        self.connected.append(dict(properties))
        return self.node.cluster.client(self.node.name)


def rule_manifest() -> dict[str, Any]:
    spec = {"type": "Cel", "displayName": "positive", "celExpression": "value.amount > 0"}
    return {"apiVersion": "v1", "kind": "DataQualityRule", "metadata": {"name": "positive-amount"}, "spec": spec}


def policy_manifest() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "DataQualityPolicy",
        "metadata": {"name": POLICY_NAME, "group": "g"},
        "spec": {
            "displayName": POLICY_NAME,
            "rules": ["positive-amount"],
            "targets": [{"cluster": CLUSTER, "topic": TOPIC, "patternType": "LITERAL"}],
            "actions": {"block": {"enabled": False}, "mark": {"enabled": False}},
        },
    }


class Node:
    """A gateway node's data-quality plugin: its runtime and services, running until :meth:`stop`."""

    def __init__(
        self, name: str, cluster: FakeCluster, topics: dict[str, MemoryStateLog], fleet: FakeFleet, **env: str
    ) -> None:
        self.name = name
        self.cluster = cluster
        self.topics = topics
        self.fleet = fleet
        self.vanished = False
        settings = {
            "DATA_QUALITY_CLUSTERS": json.dumps({CLUSTER: {"bootstrapServers": "legacy-1:9092"}}),
            "DATA_QUALITY_COUNTS_FLUSH_INTERVAL": "200ms",
            "DATA_QUALITY_HELPER_PROCESS": "false",
            **env,
        }
        self.services = NodeServices(self, fleet, settings)
        self.runtime: Runtime = runtime_of(self.services)
        self.runtime.apply(RULE, [rule_manifest()])
        self.runtime.apply(POLICY, [policy_manifest()])
        self._scope = trio.CancelScope()
        self.stopped = trio.Event()

    async def start(self, nursery: trio.Nursery) -> Node:
        firings = self.runtime.open_firing_channel()

        async def run(*, task_status: trio.TaskStatus[None]) -> None:
            try:
                with self._scope:
                    await run_services(self.runtime, self.services, firings, task_status=task_status)
            finally:
                self.stopped.set()

        await nursery.start(run)
        return self

    async def stop(self) -> None:
        """Stops the node as a gateway stops (its last counts and checkpoints are written)."""
        self._scope.cancel()
        await self.stopped.wait()

    async def vanish(self) -> None:
        """Stops the node as a killed one: nothing it still writes reaches the history topic."""
        self.vanished = True
        await self.stop()

    def counts(self) -> tuple[int, int]:
        """(evaluated, violations) of the policy over the fleet, as this node read them in the topic."""
        counts = self.runtime.history.counts(POLICY_NAME, 1800, 60)
        return counts["evaluated"], counts["violations"]

    def entries(self) -> list[dict[str, Any]]:
        return self.runtime.history.violations(POLICY_NAME, 1800, 1000)

    def observes(self, *partitions: int) -> bool:
        observed = self.runtime.observed.get(CLUSTER, {})
        return self.runtime.observing and all(f"{TOPIC}-{p}" in observed for p in partitions)

    def checkpoint(self) -> Checkpoint | None:
        return self.runtime.history.checkpoints.last.get(CLUSTER)


async def until(condition: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Waits (in virtual time) until ``condition()`` holds; fails after ``timeout`` seconds."""
    with trio.fail_after(timeout):
        while not (value := condition()):
            await trio.sleep(0.05)
        return value


def run(test: Callable[[trio.Nursery], Any]) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await test(nursery)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def history_records(topics: Mapping[str, MemoryStateLog], kind: str) -> list[dict[str, Any]]:
    log = topics[history_topic_name()]
    out = []
    for record in log.records:
        item = json.loads(record.value or b"{}")
        if item.get("type") == kind:
            out.append(item)
    return out


def history_topic_name() -> str:
    return "_kanal_gw_data_quality_violations"


# -- tests -----------------------------------------------------------------------------------------------


def test_the_history_topic_is_the_plugins() -> None:
    fleet = FakeFleet()
    node = Node("a", FakeCluster({TOPIC: 1}), {}, fleet)
    assert history_topic(node.runtime) == history_topic_name()


def test_observes_only_while_leading_and_goes_on_where_it_stopped() -> None:
    cluster = FakeCluster({TOPIC: 2})
    topics: dict[str, MemoryStateLog] = {}
    fleet = FakeFleet(node_id="a", members=["a", "b"], leader="b")

    async def test(nursery: trio.Nursery) -> None:
        node = await Node("a", cluster, topics, fleet).start(nursery)
        # another node leads: this one reads nothing of the cluster
        cluster.produce(TOPIC, 0, [BAD])
        await trio.sleep(QUIET)
        assert not node.runtime.observing and node.runtime.observed == {}
        assert cluster.fetches.get("a", 0) == 0 and node.services.connected == []
        assert node.runtime.metrics.observing._value.get() == 0

        # it leads: it observes from the partitions' ends (nothing was checkpointed yet)
        fleet.lead()
        await until(lambda: node.observes(0, 1))
        assert node.runtime.observed[CLUSTER] == {f"{TOPIC}-0": 1, f"{TOPIC}-1": 0}
        assert node.runtime.metrics.observing._value.get() == 1
        cluster.produce(TOPIC, 0, [GOOD, BAD])
        cluster.produce(TOPIC, 1, [GOOD])
        await until(lambda: node.counts() == (3, 1))
        assert [(e["partition"], e["action"], e["cluster"]) for e in node.entries()] == [(0, "OBSERVED", CLUSTER)]

        # another node leads: it stops, and its final checkpoint says where it stood
        fleet.follow("b")
        await until(lambda: not node.runtime.observing)
        assert node.runtime.observed == {}
        checkpoint = await until(lambda: (c := node.checkpoint()) is not None and c.final and c)
        assert checkpoint.positions == {(TOPIC, 0): 3, (TOPIC, 1): 1} and checkpoint.node == node.runtime.node
        assert checkpoint.fleet_node == "a"
        fetched = cluster.fetches["a"]
        cluster.produce(TOPIC, 1, [BAD, BAD])
        await trio.sleep(QUIET)
        assert cluster.fetches["a"] == fetched and node.counts() == (3, 1)

        # it leads again: it goes on from where it stopped, so the records written meanwhile count once
        fleet.lead()
        await until(lambda: node.counts() == (5, 3))
        assert node.runtime.observed[CLUSTER] == {f"{TOPIC}-0": 3, f"{TOPIC}-1": 3}
        await node.stop()
        assert node.counts() == (5, 3) and len(node.entries()) == 3

    run(test)


def test_the_new_leader_takes_over_from_the_old_ones_checkpoint() -> None:
    """Two nodes, one history topic: a rebalance moves the leadership from a to b; every record
    written before, during and after the handover is counted once, by one of them."""
    cluster = FakeCluster({TOPIC: 2})
    topics: dict[str, MemoryStateLog] = {}
    fleet_a = FakeFleet(node_id="a", members=["a", "b"], leader="a")
    fleet_b = FakeFleet(node_id="b", members=["a", "b"], leader="a")

    async def test(nursery: trio.Nursery) -> None:
        a = await Node("a", cluster, topics, fleet_a).start(nursery)
        b = await Node("b", cluster, topics, fleet_b).start(nursery)
        await until(lambda: a.observes(0, 1))
        cluster.produce(TOPIC, 0, [BAD, GOOD])
        cluster.produce(TOPIC, 1, [GOOD])
        await until(lambda: a.counts() == (3, 1) and b.counts() == (3, 1))
        assert not b.runtime.observing and cluster.fetches.get("b", 0) == 0

        # the rebalance: both learn the new generation at once; records keep coming meanwhile
        fleet_a.follow("b")
        fleet_b.lead()
        cluster.produce(TOPIC, 1, [BAD])
        await until(lambda: b.observes(0, 1))
        assert not a.runtime.observing
        cluster.produce(TOPIC, 0, [BAD, GOOD])
        await until(lambda: b.counts() == (6, 3))
        await until(lambda: a.counts() == (6, 3))
        # b went on from a's final checkpoint (a may have read the record written as the rebalance
        # came, before it learnt of it: then its checkpoint says so): nothing counted twice or skipped
        [*_, last_of_a] = [c for c in history_records(topics, "checkpoint") if c["fleetNode"] == "a"]
        assert last_of_a["final"] is True and (TOPIC, 0, 2) in map(tuple, last_of_a["positions"])
        assert b.runtime.observed[CLUSTER] == {f"{TOPIC}-0": 4, f"{TOPIC}-1": 2}
        assert sorted(e["partition"] for e in b.entries()) == [0, 0, 1]
        assert {e["node"] for e in b.entries()} == {a.runtime.node, b.runtime.node}
        assert cluster.fetches.get("b", 0) > 0

        # and back: a leads again and goes on from b's checkpoint, not from its own older positions
        fleet_b.follow("a")
        fleet_a.lead()
        await until(lambda: a.observes(0, 1))
        cluster.produce(TOPIC, 1, [BAD])
        await until(lambda: a.counts() == (7, 4) and b.counts() == (7, 4))
        assert len(a.entries()) == 4
        await a.stop()
        await b.stop()

    run(test)


def test_after_a_vanished_observer_the_next_counts_what_it_had_not_written() -> None:
    """A leader killed mid-way: what it had not written (counts, checkpoint) is lost with it; its
    successor waits a little for a final checkpoint, then goes on from the last one, so those records
    are evaluated again and counted once."""
    cluster = FakeCluster({TOPIC: 1})
    topics: dict[str, MemoryStateLog] = {}
    fleet_a = FakeFleet(node_id="a", members=["a", "b"], leader="a")
    fleet_b = FakeFleet(node_id="b", members=["a", "b"], leader="a")

    async def test(nursery: trio.Nursery) -> None:
        a = await Node("a", cluster, topics, fleet_a).start(nursery)
        b = await Node("b", cluster, topics, fleet_b).start(nursery)
        await until(lambda: a.observes(0))
        cluster.produce(TOPIC, 0, [BAD, GOOD])
        await until(lambda: b.counts() == (2, 1) and (c := b.checkpoint()) is not None and c.positions[(TOPIC, 0)] == 2)
        a.vanished = True  # from now on nothing a writes arrives
        cluster.produce(TOPIC, 0, [BAD, BAD])
        await until(lambda: a.runtime.observed[CLUSTER][f"{TOPIC}-0"] == 4)  # evaluated, not written
        await a.vanish()
        checkpoint = b.checkpoint()
        assert checkpoint is not None and not checkpoint.final and checkpoint.positions == {(TOPIC, 0): 2}

        started = trio.current_time()
        fleet_b.rebalance(members=["b"], leader="b")  # a's session expired
        await until(lambda: b.observes(0))
        assert trio.current_time() - started >= 5.0  # it waited for a final checkpoint that never came
        await until(lambda: b.counts() == (4, 3))
        assert b.runtime.observed[CLUSTER] == {f"{TOPIC}-0": 4}
        await b.stop()

    run(test)


def test_a_checkpoint_past_the_end_of_a_recreated_topic_goes_on_at_its_end() -> None:
    cluster = FakeCluster({TOPIC: 1})
    topics: dict[str, MemoryStateLog] = {}
    fleet_a = FakeFleet(node_id="a", members=["a", "b"], leader="a")
    fleet_b = FakeFleet(node_id="b", members=["a", "b"], leader="a")

    async def test(nursery: trio.Nursery) -> None:
        a = await Node("a", cluster, topics, fleet_a).start(nursery)
        b = await Node("b", cluster, topics, fleet_b).start(nursery)
        await until(lambda: a.observes(0))
        cluster.produce(TOPIC, 0, [GOOD, GOOD, BAD])
        await until(lambda: b.counts() == (3, 1))
        await a.stop()
        await until(lambda: (c := b.checkpoint()) is not None and c.final and c.positions == {(TOPIC, 0): 3})
        cluster.partitions[(TOPIC, 0)] = []  # deleted and created again
        fleet_b.rebalance(members=["b"], leader="b")
        await until(lambda: b.runtime.observed.get(CLUSTER) == {f"{TOPIC}-0": 0})
        cluster.produce(TOPIC, 0, [BAD])
        await until(lambda: b.counts() == (4, 2))
        await b.stop()

    run(test)


def test_a_node_with_the_observer_off_never_observes() -> None:
    cluster = FakeCluster({TOPIC: 1})

    async def test(nursery: trio.Nursery) -> None:
        node = await Node("a", cluster, {}, FakeFleet(), DATA_QUALITY_OBSERVER="false").start(nursery)
        await trio.sleep(QUIET)
        assert not node.runtime.observing and cluster.fetches == {}
        await node.stop()

    run(test)


def test_while_leader_starts_cancels_and_restarts_the_task() -> None:
    fleet = FakeFleet(members=["node-1", "node-2"], leader="node-2")
    runs: list[str] = []

    async def task(name: str) -> None:
        runs.append(f"start {name}")
        try:
            await trio.sleep_forever()
        finally:
            runs.append(f"stop {name}")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(while_leader, fleet, task, "x")
            await trio.testing.wait_all_tasks_blocked()
            assert runs == [] and fleet.leader is not None and fleet.leader.node_id == "node-2"
            fleet.lead()
            await trio.testing.wait_all_tasks_blocked()
            assert runs == ["start x"] and fleet.is_leader and fleet.leader.node_id == "node-1"
            fleet.rebalance(members=["node-1", "node-2", "node-3"])  # still the leader: it goes on
            await trio.testing.wait_all_tasks_blocked()
            assert runs == ["start x"] and len(fleet.members) == 3 and fleet.generation == 3
            fleet.follow("node-3")
            await trio.testing.wait_all_tasks_blocked()
            assert runs == ["start x", "stop x"]
            fleet.lead()
            await trio.testing.wait_all_tasks_blocked()
            assert runs == ["start x", "stop x", "start x"]
            nursery.cancel_scope.cancel()
        assert runs[-1] == "stop x"

    trio.run(main)


def test_the_fake_fleet() -> None:
    fleet = FakeFleet()
    assert fleet.is_leader and [m.node_id for m in fleet.members] == ["node-1"] and fleet.generation == 1
    fleet = FakeFleet(node_id="b", members=["a"], leader=None)
    assert [m.node_id for m in fleet.members] == ["a", "b"] and fleet.leader is None and not fleet.is_leader
    fleet.follow("c")
    assert [m.node_id for m in fleet.members] == ["a", "b", "c"] and fleet.leader is not None
    assert [m.leader for m in fleet.members] == [False, False, True]
    assert len({(m.first_port, m.http_port) for m in fleet.members}) == 3  # made-up, distinct addresses
