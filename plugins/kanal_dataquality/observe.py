"""Policies on Kafka clusters without a gateway: evaluated by consuming their target topics.

A policy whose targets name a cluster of ``DATA_QUALITY_CLUSTERS`` cannot act on produced records (no
gateway sees them), so it observes: this node reads the target topics of that cluster after the
records are written and counts and reports them like a gateway policy (evaluated and violation
counts, history entries with action ``OBSERVED``); block and mark are refused when the policy is
created.

How: every few seconds the observer lists the cluster's topics (Metadata) and starts following each
partition of every targeted topic from its end at the moment it is first seen (records written
earlier are not evaluated; a restart starts again from the end). It fetches from the partition
leaders, long-polling, with a Kafka client of the gateway's own (``services.connect``, configured
like the gateway's upstream from the cluster's ``bootstrapServers`` and ``properties``; no client
library).
Records are evaluated with the same plans and engines as on the gateway; schema ids go through the
registry as for produced records.

In a fleet every node with ``DATA_QUALITY_OBSERVER=true`` (the default) observes; set it to false on
all nodes but one (there is no partition assignment between nodes).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable
from typing import Any

import trio

from kanal.api import ErrorCode, GatewayServices, KafkaClient, RecordSet, UpstreamError, build, has_field, nested
from kanal_dataquality.evaluate import evaluate, needed, schema_refs
from kanal_dataquality.policies import Plan
from kanal_dataquality.runtime import Runtime
from kanal_dataquality.settings import ObservedCluster

__all__ = ["ClusterReader", "observe"]

log = logging.getLogger(__name__)

_MAX_BYTES = 8 * 1024 * 1024
REFRESH = 3.0  # seconds between topic listings


def _build(cls: Any, **values: Any) -> Any:
    return build(cls, **{k: v for k, v in values.items() if has_field(cls, k)})


def _ms(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=int(seconds * 1000))


class ClusterReader:
    """Reads partitions of one cluster: topic listing, end offsets, fetches from leaders."""

    def __init__(self, client: KafkaClient, timeout: float = 10.0) -> None:
        self.client = client
        self.timeout = timeout
        self.leaders: dict[tuple[str, int], int] = {}

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self.client.aclose()

    async def topics(self) -> dict[str, list[int]]:
        """Every topic of the cluster and its partitions (leaders and brokers learnt on the way)."""
        reply = await self.client.metadata(None)
        out: dict[str, list[int]] = {}
        for topic in reply.topics:
            if topic.error_code != ErrorCode.none or not topic.name or getattr(topic, "is_internal", False):
                continue
            partitions = []
            for p in topic.partitions:
                partitions.append(int(p.partition_index))
                self.leaders[(str(topic.name), int(p.partition_index))] = int(p.leader_id)
            out[str(topic.name)] = sorted(partitions)
        return out

    async def end_offsets(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = {}
        by_leader: dict[int, list[tuple[str, int]]] = {}
        for tp in partitions:
            by_leader.setdefault(self.leaders.get(tp, -1), []).append(tp)
        for leader, tps in by_leader.items():
            cls = self.client.request_class(2)
            topic_cls = nested(cls, "topics")
            part_cls = nested(topic_cls, "partitions")
            topics: dict[str, list[Any]] = {}
            for topic, p in tps:
                topics.setdefault(topic, []).append(_build(part_cls, partition_index=p, timestamp=-1))
            body = _build(
                cls,
                replica_id=-1,
                isolation_level=0,
                topics=tuple(_build(topic_cls, name=t, partitions=tuple(ps)) for t, ps in topics.items()),
            )
            reply = await self.client.call(body, node_id=leader if leader >= 0 else None, timeout=self.timeout)
            for topic in reply.topics:
                for part in topic.partitions:
                    if part.error_code == ErrorCode.none:
                        out[(str(topic.name), int(part.partition_index))] = int(part.offset)
        return out

    async def fetch(
        self, positions: dict[tuple[str, int], int], max_wait: float = 0.5
    ) -> dict[tuple[str, int], tuple[RecordSet, int]]:
        """New records of the partitions (one Fetch per leader): (records, next offset) per partition."""
        out: dict[tuple[str, int], tuple[RecordSet, int]] = {}
        by_leader: dict[int, list[tuple[str, int]]] = {}
        for tp in positions:
            by_leader.setdefault(self.leaders.get(tp, -1), []).append(tp)
        for leader, tps in by_leader.items():
            cls = self.client.request_class(1)
            topic_cls = nested(cls, "topics")
            part_cls = nested(topic_cls, "partitions")
            topics: dict[str, list[Any]] = {}
            for topic, p in tps:
                topics.setdefault(topic, []).append(
                    _build(part_cls, partition=p, fetch_offset=positions[(topic, p)], partition_max_bytes=_MAX_BYTES)
                )
            body = _build(
                cls,
                replica_id=-1,
                max_wait=_ms(max_wait),
                min_bytes=1,
                max_bytes=_MAX_BYTES,
                isolation_level=1,
                session_epoch=-1,
                topics=tuple(_build(topic_cls, topic=t, partitions=tuple(ps)) for t, ps in topics.items()),
            )
            reply = await self.client.call(
                body, node_id=leader if leader >= 0 else None, timeout=self.timeout + max_wait
            )
            for topic in reply.responses:
                for part in topic.partitions:
                    tp = (str(topic.topic), int(part.partition_index))
                    if part.error_code != ErrorCode.none:
                        if part.error_code == ErrorCode.offset_out_of_range:
                            out[tp] = (RecordSet.parse(None), max(positions[tp], int(part.log_start_offset)))
                        continue
                    records = RecordSet.parse(part.records)
                    next_offset = positions[tp]
                    for batch in records.batches:
                        next_offset = max(next_offset, batch.next_offset)
                    out[tp] = (records, next_offset)
        return out


async def _evaluate(
    runtime: Runtime, cluster: str, plan: Plan, topic: str, partition: int, records: RecordSet, start: int
) -> None:
    batches = [b for b in records.batches if not b.is_control and b.records_count]
    recs = [r for b in batches for r in b.records() if b.offset_of(r) >= start]
    if not recs:
        return
    registry = runtime.registry
    refs = None
    if plan.enforce_avro or (registry is not None and (plan.uses_value or plan.uses_key)):
        refs = schema_refs(plan, recs, registry is not None and plan.uses_key)
        if registry is not None:
            missing = registry.missing(needed(refs))
            if missing:
                await registry.resolve(missing)
    result = evaluate(plan, recs, registry, refs)
    runtime.record(plan, result, topic, partition, None, cluster=cluster, enforce=False)


async def observe_cluster(runtime: Runtime, services: GatewayServices, cluster: ObservedCluster) -> None:
    """Follows the targeted topics of one cluster while policies target it."""
    properties = {"bootstrap.servers": cluster.bootstrap_servers, **cluster.properties}
    reader = ClusterReader(services.connect(properties))
    positions: dict[tuple[str, int], int] = {}
    plans: dict[str, Plan | None] = {}
    engine = None
    next_refresh = 0.0
    delay = 0.5
    try:
        while True:
            try:
                if runtime.engine is not engine:
                    engine = runtime.engine
                    plans = {}
                    positions = {tp: o for tp, o in positions.items() if engine.observed_plan(cluster.name, tp[0])}
                    next_refresh = 0.0
                if trio.current_time() >= next_refresh:
                    next_refresh = trio.current_time() + REFRESH
                    topics = await reader.topics()
                    new = []
                    for topic, partitions in topics.items():
                        if topic not in plans:
                            plans[topic] = engine.observed_plan(cluster.name, topic)
                        if plans[topic] is None:
                            continue
                        new += [(topic, p) for p in partitions if (topic, p) not in positions]
                    if new:
                        positions.update(await reader.end_offsets(new))
                runtime.observed[cluster.name] = {f"{t}-{p}": o for (t, p), o in sorted(positions.items())}
                if not positions:
                    with trio.move_on_after(REFRESH):
                        await runtime.engine_changed.wait()
                    continue
                fetched = await reader.fetch(dict(positions))
                for (topic, partition), (records, next_offset) in fetched.items():
                    plan = plans.get(topic)
                    if plan is not None:
                        await _evaluate(
                            runtime, cluster.name, plan, topic, partition, records, positions[(topic, partition)]
                        )
                    positions[(topic, partition)] = next_offset
                runtime.observed[cluster.name] = {f"{t}-{p}": o for (t, p), o in sorted(positions.items())}
                delay = 0.5
            except (
                UpstreamError,
                OSError,
                trio.BrokenResourceError,
                trio.ClosedResourceError,
                trio.TooSlowError,
            ) as exc:
                log.warning("data quality observer of cluster %s: %s (retrying)", cluster.name, exc)
                await reader.aclose()  # a new client: brokers and leaders are listed again first
                reader = ClusterReader(services.connect(properties))
                next_refresh = 0.0
                await trio.sleep(delay)
                delay = min(delay * 2, 10.0)
    finally:
        await reader.aclose()


async def observe(runtime: Runtime, services: GatewayServices) -> None:
    """Observes every configured cluster without a gateway (one task each)."""
    async with trio.open_nursery() as nursery:
        for cluster in runtime.settings.clusters.values():
            nursery.start_soon(observe_cluster, runtime, services, cluster)
