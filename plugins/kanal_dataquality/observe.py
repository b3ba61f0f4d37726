"""Policies on Kafka clusters without a gateway: evaluated by consuming their target topics.

A policy whose targets name a cluster of ``DATA_QUALITY_CLUSTERS`` cannot act on produced records (no
gateway sees them), so it observes: a node reads the target topics of that cluster after the records
are written and counts and reports them like a gateway policy (evaluated and violation counts,
history entries with action ``OBSERVED``); block and mark are refused when the policy is created.

One node of the fleet observes: the leader of the fleet's membership group (``services.fleet``),
while it leads. When the leadership moves (the leader stops or vanishes, the group rebalances), the
old leader stops and the new one goes on from where the observer stood, as the history topic's
checkpoints say (:class:`~kanal_dataquality.history.Checkpoints`): a node that becomes the leader
first reads the history topic to its end (and waits up to :data:`HANDOVER_WAIT` seconds for the
previous observer's last, final checkpoint when it has not come yet), then starts each partition at
the checkpoint's offset. A partition that no checkpoint names starts at its end when it is first seen
(records written earlier are not evaluated).

Checkpoints are written with the node's counts, after them in one request (every
``DATA_QUALITY_COUNTS_FLUSH_INTERVAL``, and at once when the node stops observing or stops), so the
counts of the records before a checkpoint are in the history topic exactly when the checkpoint is:

* a handover by a stop (SIGTERM, a rebalance that moves the leadership) counts every record once:
  the old observer's last counts and final checkpoint are written before the new one starts;
* when the observer vanishes (SIGKILL, a lost machine), the records after its last checkpoint are
  evaluated again by the next one, and their counts, which the vanished node had not written, are
  counted once; their history entries (written as they come) may appear twice, as with a Kafka
  consumer's at-least-once delivery.

It fetches from the partition leaders, long-polling, with a Kafka client of the gateway's own
(``services.connect``, configured like the gateway's upstream from the cluster's ``bootstrapServers``
and ``properties``; no client library). Records are evaluated with the same plans and engines as on
the gateway; schema ids go through the registry as for produced records. Every few seconds the
observer lists the cluster's topics (Metadata) to find new targeted partitions.

``DATA_QUALITY_OBSERVER=false`` keeps a node from observing even when it leads: set it alike on every
node of a fleet.
"""

from __future__ import annotations

import logging

import trio

from kanal.api import (
    GatewayServices,
    LogError,
    RecordSet,
    StateLog,
    TopicReader,
    UpstreamError,
    while_leader,
)
from kanal_dataquality.evaluate import evaluate, needed, schema_refs
from kanal_dataquality.history import Positions
from kanal_dataquality.policies import Plan
from kanal_dataquality.runtime import Runtime
from kanal_dataquality.settings import ObservedCluster

__all__ = ["HANDOVER_WAIT", "ClusterReader", "observe", "observe_as_leader", "observe_cluster"]

log = logging.getLogger(__name__)

REFRESH = 3.0  # seconds between topic listings
#: How long a new observer waits for its predecessor's final checkpoint (when the last checkpoint is
#: not final: the predecessor may be writing it, or it vanished).
HANDOVER_WAIT = 5.0


class ClusterReader(TopicReader):
    """Reads partitions of one cluster (the plugin API's :class:`~kanal.api.TopicReader`), and owns
    its client: an observer's client of a cluster without a gateway is closed with it."""

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self.client.aclose()


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


async def observe_cluster(
    runtime: Runtime, services: GatewayServices, cluster: ObservedCluster, positions: Positions
) -> None:
    """Follows the targeted topics of one cluster while policies target it, from ``positions`` (changed
    in place: the checkpoints read them)."""
    properties = {"bootstrap.servers": cluster.bootstrap_servers, **cluster.properties}
    reader = ClusterReader(services.connect(properties))
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
                    for tp in [tp for tp in positions if not engine.observed_plan(cluster.name, tp[0])]:
                        del positions[tp]
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
                    if next_offset < 0:  # out of range, and where to go unknown: at its end, at the next listing
                        del positions[(topic, partition)]
                        next_refresh = 0.0
                        continue
                    plan = plans.get(topic)
                    if plan is not None:
                        await _evaluate(
                            runtime, cluster.name, plan, topic, partition, records, positions[(topic, partition)]
                        )
                    # (no await since the counts: a checkpoint never has positions ahead of them)
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


async def _catch_up(runtime: Runtime, history_log: StateLog, clusters: list[str]) -> None:
    """Reads the history topic to its end (the last checkpoints), and waits a little for the previous
    observer's final checkpoint when the last one is not final."""
    delay = 0.5
    while True:
        try:
            end = await history_log.end_offset()
            break
        except LogError as exc:
            log.warning("data quality observer: cannot read the history topic: %s (retrying)", exc)
            await trio.sleep(delay)
            delay = min(delay * 2, 10.0)
    await runtime.history.reach(end)
    checkpoints = runtime.history.checkpoints
    if checkpoints.handing_over(clusters):
        log.info("data quality observer: waiting up to %.0f s for the last observer's final checkpoint", HANDOVER_WAIT)
        with trio.move_on_after(HANDOVER_WAIT):
            while checkpoints.handing_over(clusters):
                await runtime.history.moved()


async def observe_as_leader(runtime: Runtime, services: GatewayServices, history_log: StateLog) -> None:
    """Observes every configured cluster (one task each) until cancelled: when this node stops leading
    its fleet, or stops. Then the checkpoints say so (final), at once."""
    clusters = list(runtime.settings.clusters.values())
    names = [c.name for c in clusters]
    checkpoints = runtime.history.checkpoints
    checkpoints.fleet_node = services.fleet.node_id
    log.info(
        "data quality observer: this node leads its fleet (generation %d): observing %s",
        services.fleet.generation,
        ", ".join(names),
    )
    try:
        await _catch_up(runtime, history_log, names)
        runtime.observing = True
        runtime.metrics.observing.set(1)
        async with trio.open_nursery() as nursery:
            for cluster in clusters:
                positions = checkpoints.resume(cluster.name)
                nursery.start_soon(observe_cluster, runtime, services, cluster, positions)
    finally:
        runtime.observing = False
        runtime.metrics.observing.set(0)
        for name in names:
            checkpoints.stop(name)
            runtime.observed.pop(name, None)
        runtime.reporter.flush_soon()
        log.info("data quality observer: stopped observing %s", ", ".join(names))


async def observe(runtime: Runtime, services: GatewayServices, history_log: StateLog) -> None:
    """Observes the clusters without a gateway while this node leads its fleet (until cancelled);
    ``history_log`` is the history topic (its end offset: see :func:`_catch_up`)."""
    await while_leader(services.fleet, observe_as_leader, runtime, services, history_log)
