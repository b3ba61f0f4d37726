"""The backtests of one gateway: what starts them and keeps them, for the admin API and the console.

One :class:`Backtests` per gateway, built by the ``kanal_admin_routes`` hook and kept on the runtime
(``runtime.backtests``), so that a backtest started through the API shows on the console's pages and
one started from the console is the API's ``GET /backtest/<id>``: the same jobs, the same limit of
backtests running at once. It resolves the policy (stored, or a draft validated as storing it would
be), picks the Kafka client that reads the topic, checks the partitions, and starts the job as a task
of the gateway. Who may start one, and the audit event, are the callers' (both admin-only, both
audited as ``BACKTEST``).
"""

from __future__ import annotations

from typing import Any

from kanal.api import (
    ConfigError,
    GatewayServices,
    KindRegistry,
    ResourceError,
    ResourceStore,
    UpstreamError,
    invalid,
)
from kanal_dataquality.backtest import BacktestJob, BacktestJobs, BacktestRequest, topic_error
from kanal_dataquality.observe import ClusterReader
from kanal_dataquality.policies import CompiledPolicy, compile_policy
from kanal_dataquality.resources import POLICY, RULE
from kanal_dataquality.runtime import Runtime, compile_manifests

__all__ = ["ALIAS_TOPIC", "VIRTUAL_CLUSTER", "Backtests", "stored_topic"]

VIRTUAL_CLUSTER = "VirtualCluster"
ALIAS_TOPIC = "AliasTopic"


def stored_topic(store: Any, services: GatewayServices, topic: str, vcluster: str | None) -> str:
    """The name the backing cluster stores a topic under, as clients of ``vcluster`` (None: the
    passthrough cluster) name it: the gateway's own naming (``services.topic_names.stored``) for the
    passthrough cluster; for a virtual cluster its alias topic, else ``<virtual cluster><topic>`` (as
    docs/multi-tenancy.md says), read from the stored VirtualCluster and AliasTopic resources."""
    if vcluster is None:
        return services.topic_names.stored(topic)
    if not any(m["metadata"]["name"] == vcluster for m in store.resources(VIRTUAL_CLUSTER)):
        raise ResourceError(404, "Not found", f"virtual cluster {vcluster!r} does not exist")
    for alias in store.resources(ALIAS_TOPIC):
        metadata = alias["metadata"]
        if metadata["name"] == topic and metadata.get("vCluster") == vcluster:
            return str(alias["spec"]["physicalName"])
    return vcluster + topic


class Backtests:
    """This node's backtests (:attr:`jobs`) and how one starts (:meth:`start`). Errors are
    :class:`~kanal.api.ResourceError` with the API's statuses and messages, which the console shows
    as they are."""

    def __init__(self, store: ResourceStore, kinds: KindRegistry, runtime: Runtime, services: GatewayServices) -> None:
        self.store = store
        self.kinds = kinds
        self.runtime = runtime
        self.services = services
        self.jobs = BacktestJobs()

    async def resolve_policy(self, wanted: BacktestRequest) -> CompiledPolicy:
        """The policy to run, compiled with the live rules: a stored one, or a draft validated exactly
        as storing it would (the same 400s), without storing it."""
        store, runtime = self.store, self.runtime
        if wanted.draft is not None:
            kind = self.kinds.get(POLICY)
            if kind is None:  # pragma: no cover - this plugin registers it
                raise ResourceError(500, "Internal error", "the DataQualityPolicy kind is not registered")
            manifest = dict((await store.put(kind, wanted.draft, dry_run=True)).resource)
            manifest.pop("status", None)
        else:
            found = store.get(POLICY, (wanted.policy,))
            if found is None:
                raise ResourceError(404, "Not found", f"DataQualityPolicy {wanted.policy!r} does not exist")
            manifest = found
        rules = dict(runtime.engine.rules)  # the live compiled rules: the same functions the policy runs
        unknown = {name for name in manifest["spec"]["rules"] if name not in rules}
        if unknown:  # stored since the engine was built (or never compiled on this node): compiled here
            rules.update(compile_manifests([m for m in store.resources(RULE) if m["metadata"]["name"] in unknown])[0])
        policy = compile_policy(manifest, rules, runtime.checks.observed_clusters)
        if not policy.rules:
            raise invalid(
                f"policy {policy.name!r} has no rule that compiles on this gateway "
                f"(missing: {', '.join(policy.missing_rules)})"
            )
        return policy

    def reader_for(self, policy: CompiledPolicy, wanted: BacktestRequest) -> tuple[ClusterReader, str, bool]:
        """(reader, stored topic name, whether the backtest owns the reader's client)."""
        runtime, services = self.runtime, self.services
        if policy.observed:
            if wanted.virtual_cluster is not None:
                raise invalid("virtualCluster applies to topics of the gateway's own cluster only")
            cluster = runtime.settings.clusters.get(policy.cluster)
            if cluster is None:
                raise invalid(f"cluster {policy.cluster!r} is not configured on this node (DATA_QUALITY_CLUSTERS)")
            properties = {"bootstrap.servers": cluster.bootstrap_servers, **cluster.properties}
            try:
                client = services.connect(properties)
            except ConfigError as exc:
                raise invalid(f"cluster {policy.cluster!r}: {exc}") from None
            return ClusterReader(client), wanted.topic, True
        if policy.cluster != runtime.gateway_cluster:
            raise invalid(
                f"policy {policy.name!r} targets cluster {policy.cluster!r}, which is neither this gateway "
                f"({runtime.gateway_cluster!r}) nor a cluster without a gateway configured here"
            )
        topic = stored_topic(self.store, services, wanted.topic, wanted.virtual_cluster)
        return ClusterReader(services.kafka), topic, False

    async def partitions_of(self, reader: ClusterReader, topic: str, wanted: BacktestRequest) -> list[int]:
        """The partitions to read: the topic's, restricted by ``partitions`` and an offsets range (a
        partition the topic lacks is a 400)."""
        try:
            code, partitions = await reader.partitions(topic)
        except UpstreamError as exc:
            raise ResourceError(502, "Upstream error", f"cannot read the topics of the cluster: {exc}") from None
        if code:
            raise topic_error(code, wanted.topic)
        chosen = list(partitions)
        asked = set(wanted.partitions or ()) | (set(wanted.range.offsets) if wanted.range.kind == "offsets" else set())
        absent = sorted(asked - set(partitions))
        if absent:
            raise invalid(
                f"topic {wanted.topic!r} has no partition {absent[0]} "
                f"(it has {len(partitions)}: 0 to {len(partitions) - 1})"
            )
        if wanted.partitions is not None:
            chosen = [p for p in chosen if p in wanted.partitions]
        if wanted.range.kind == "offsets":
            chosen = [p for p in chosen if p in wanted.range.offsets]
        return chosen

    def find(self, job_id: str) -> BacktestJob:
        """A job this node keeps, or a 404."""
        job = self.jobs.get(job_id)
        if job is None:
            raise ResourceError(404, "Not found", f"no backtest {job_id!r} on this node (finished ones are kept 1 h)")
        return job

    async def start(self, wanted: BacktestRequest, user: str | None) -> BacktestJob:
        """Resolves the policy, checks there is room (429) and the topic, and starts the job as a task
        of the gateway; ``user`` is who asked (shown with the job). The caller audits it."""
        policy = await self.resolve_policy(wanted)
        jobs = self.jobs
        jobs.check_room()
        reader, topic, owned = self.reader_for(policy, wanted)
        try:
            partitions = await self.partitions_of(reader, topic, wanted)
            job = BacktestJob(
                wanted,
                policy,
                topic,
                partitions,
                reader,
                self.runtime.registry,
                draft=wanted.draft is not None,
                user=user,
                owns_client=owned,
            )
            jobs.add(job)
        except BaseException:
            if owned:
                await reader.aclose()
            raise
        self.services.start_soon(job.run, name=f"data quality backtest {job.id}")
        return job
