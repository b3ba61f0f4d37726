"""The ``data-quality`` interceptor: evaluates the policies of a topic on each produced partition batch.

Installed by the plugin itself (``services.install``) while some DataQualityPolicy targets this
gateway; its config is then ``{managed: true}`` and it reads the policies the admin API stores, from
the plugin's runtime in ``services.shared``. It may also be configured by hand (gateway config file),
with the manifests inline, for a gateway without the admin API::

    interceptors:
      - name: orders-quality
        plugin: data-quality
        config:
          clusterId: gateway            # optional; targets must name this cluster (default: gateway)
          rules: [ {apiVersion: v1, kind: DataQualityRule, metadata: {name: ...}, spec: {...}} ]
          policies: [ {apiVersion: v1, kind: DataQualityPolicy, metadata: {name: ..., group: ...}, spec: {...}} ]

Per partition batch: return at once for a topic no policy targets (its bytes are forwarded untouched);
otherwise decode the records, look up schema ids the cache lacks (async, only then), run the plan,
then count, report, mark (changed batches only) or block with ``INVALID_RECORD``.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Awaitable
from typing import Annotated, Any, ClassVar, TypedDict

import msgspec

from kanal.api import (
    GatewayServices,
    HelperProcess,
    Interceptor,
    InterceptorConfigError,
    PartitionError,
    Record,
    RecordBatch,
    RecordsContext,
    RecordsResult,
    ResourceError,
    hookimpl,
)
from kanal_dataquality.actions import INVALID_RECORD
from kanal_dataquality.batches import may_split, scan_batches, scan_batches_split
from kanal_dataquality.evaluate import BatchResult, evaluate, needed, schema_refs
from kanal_dataquality.policies import Engine, Plan, compile_policy
from kanal_dataquality.resources import POLICY, RULE, Checks, canonical_policy, canonical_rule, resource_kinds
from kanal_dataquality.runtime import RUNTIME, Runtime, compile_manifests
from kanal_dataquality.settings import Settings

__all__ = ["PLUGIN_NAME", "DataQualityInterceptor"]

PLUGIN_NAME = "data-quality"


audit_log = logging.getLogger("kanal.audit")  # policy decisions, beside the admin API's events


class DataQualityConfig(TypedDict, total=False):
    """The interceptor's config: ``managed`` (set by the plugin), or the manifests inline."""

    managed: Annotated[
        bool,
        msgspec.Meta(description="set by the plugin when it installs the interceptor: the stored policies apply"),
    ]
    clusterId: Annotated[
        str, msgspec.Meta(min_length=1, description="the cluster name policies target (default: gateway)")
    ]
    rules: Annotated[list[dict[str, Any]], msgspec.Meta(description="DataQualityRule manifests")]
    policies: Annotated[list[dict[str, Any]], msgspec.Meta(description="DataQualityPolicy manifests")]


class _Inline:
    """Rules and policies given in the interceptor's own config."""

    def __init__(self, config: DataQualityConfig) -> None:
        cluster = config.get("clusterId", "gateway")
        self.cluster = cluster
        kinds = {k.kind: k for k in resource_kinds(lambda: Checks(cluster), lambda *a: None)}
        rules = config.get("rules") or []
        policies = config.get("policies") or []
        if not policies:
            raise InterceptorConfigError("policies: expected a non-empty list of DataQualityPolicy manifests")
        self.rules: list[dict[str, Any]] = []
        for i, manifest in enumerate(rules):
            self.rules.append(_checked(f"rules[{i}]", lambda m=manifest: canonical_rule(m, kinds[RULE])))
        self.policies: list[dict[str, Any]] = []
        for i, manifest in enumerate(policies):
            self.policies.append(
                _checked(
                    f"policies[{i}]",
                    lambda m=manifest: canonical_policy(
                        m, kinds[POLICY], self, Checks(cluster, registry_configured=True)
                    ),
                )
            )

    def resources(self, kind: str) -> list[dict[str, Any]]:
        return self.rules if kind == RULE else self.policies if kind == POLICY else []


def _checked(where: str, make: Any) -> dict[str, Any]:
    try:
        manifest: dict[str, Any] = make()
        return manifest
    except ResourceError as exc:
        raise InterceptorConfigError(f"{where}: {exc.msg}") from None


class DataQualityInterceptor(Interceptor):
    """Data quality policies (CEL, JSON schema, EnforceAvro rules) on produced records: block, mark, report."""

    plugin_name: ClassVar[str] = PLUGIN_NAME
    description: ClassVar[str] = (
        "Data quality rules and policies on produced records: block, mark and report violations."
    )
    config_type: ClassVar[type[Any] | None] = DataQualityConfig

    def __init__(self, config: DataQualityConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        self.config: DataQualityConfig = config
        self._managed = bool(config.get("managed"))
        self._runtime: Runtime | None = None
        self._own_runtime: Runtime | None = None  # a runtime of this interceptor's alone (closed with it)
        self._inline: _Inline | None = None
        self._engine: Engine | None = None
        if not self._managed:
            self._inline = _Inline(config)
        elif "rules" in config or "policies" in config:
            raise InterceptorConfigError("rules, policies: not with managed (the admin API's resources are used)")

    async def aclose(self) -> None:
        """Closes the runtime this interceptor made for itself (the plugin's shared one stays)."""
        runtime, self._own_runtime = self._own_runtime, None
        if runtime is not None:
            await runtime.aclose()

    # -- wiring

    def _resolve(self) -> Runtime:
        shared = self.services.shared.get(RUNTIME)
        runtime = shared if isinstance(shared, Runtime) else None
        if runtime is None:
            if self._managed:
                raise RuntimeError("the data quality plugin's runtime is not set up on this gateway")
            # configured by hand on a gateway that does not host the plugin's hooks: counts and
            # history in this interceptor's memory
            cluster = self._inline.cluster if self._inline else "gateway"
            runtime = self._own_runtime = Runtime(Settings(), cluster, start_soon=self.services.start_soon)
        self._runtime = runtime
        if self._inline is not None:
            runtime.use_inline()
            rules = compile_manifests(self._inline.rules)[0]
            policies = [compile_policy(m, rules, frozenset()) for m in self._inline.policies]
            self._engine = Engine(rules, policies, self._inline.cluster)
        return runtime

    # -- the hook

    def wants_produce_records(self, topic: str) -> bool:
        """Only the topics a policy targets: produce to the others is forwarded as it arrives."""
        return self._plan(topic)[1] is not None

    def _plan(self, topic: str) -> tuple[Runtime, Plan | None]:
        runtime = self._runtime or self._resolve()
        engine = self._engine if self._engine is not None else runtime.engine
        return runtime, engine.plan(topic)

    @hookimpl
    def kanal_produce_records(self, ctx: RecordsContext) -> RecordsResult | Awaitable[RecordsResult]:
        runtime, plan = self._plan(ctx.topic)
        if plan is None:
            return None
        batches = [b for b in ctx.records.batches if not b.is_control and b.records_count]
        if not batches:
            return None
        registry = runtime.registry
        if not plan.enforce_avro and (registry is None or not (plan.uses_value or plan.uses_key)):
            helper = runtime.helper
            if helper is not None and helper.usable and any(may_split(b) for b in batches):
                return self._after_split(ctx, runtime, plan, batches, helper)
            return self._finish(ctx, runtime, plan, scan_batches(plan, batches))
        # schema ids: decoded records, registry lookups first (async, only for ids the cache lacks)
        records = [r for b in batches for r in b.records()]
        refs = schema_refs(plan, records, registry is not None and plan.uses_key)
        if registry is not None:
            missing = registry.missing(needed(refs))
            if missing:
                return self._after_lookup(ctx, runtime, plan, batches, records, refs, missing)
        return self._finish(ctx, runtime, plan, _attach(batches, evaluate(plan, records, registry, refs)))

    async def _after_split(
        self, ctx: RecordsContext, runtime: Runtime, plan: Plan, batches: list[RecordBatch], helper: HelperProcess
    ) -> RecordsResult:
        return self._finish(ctx, runtime, plan, await scan_batches_split(plan, batches, helper))

    async def _after_lookup(
        self,
        ctx: RecordsContext,
        runtime: Runtime,
        plan: Plan,
        batches: list[RecordBatch],
        records: list[Record],
        refs: list[tuple[Any, Any]],
        missing: set[Any],
    ) -> RecordsResult:
        registry = runtime.registry
        assert registry is not None
        await registry.resolve(missing)
        for ref in missing:
            info = registry.cached(ref)
            result = "unreachable" if info is None or info.unreachable else "unknown" if info.error else "found"
            runtime.metrics.schema_lookups.labels(result).inc()
        return self._finish(ctx, runtime, plan, _attach(batches, evaluate(plan, records, registry, refs)))

    def _finish(self, ctx: RecordsContext, runtime: Runtime, plan: Plan, result: BatchResult) -> RecordsResult:
        message = runtime.record(plan, result, ctx.topic, ctx.partition, ctx.client_id or ctx.connection.client_id)
        if message is not None:
            audit_log.info(
                "DATA_QUALITY BLOCKED topic=%s partition=%d client=%s: %s",
                ctx.topic,
                ctx.partition,
                ctx.connection.client_address,
                message,
                extra={
                    "event": "DATA_QUALITY",
                    "action": "BLOCKED",
                    "topic": ctx.topic,
                    "partition": ctx.partition,
                    "clientId": ctx.client_id,
                    "clientAddress": ctx.connection.client_address,
                    "listenerAddress": ctx.connection.listener_address,
                    "reason": message,
                },
            )
            self.services.audit(
                "DATA_QUALITY", ctx.connection, {"action": "BLOCKED", "topic": ctx.topic, "reason": message}
            )
            return PartitionError(INVALID_RECORD, message)
        return None


def _attach(batches: list[RecordBatch], result: BatchResult) -> BatchResult:
    """Sets the batch of each violation (from its index among the partition's records)."""
    if len(batches) == 1:
        for v in (*result.violations, *((result.blocked,) if result.blocked else ())):
            v.batch = batches[0]
        return result
    ends = []
    total = 0
    for batch in batches:
        total += len(batch.records())
        ends.append(total)
    for v in (*result.violations, *((result.blocked,) if result.blocked else ())):
        v.batch = batches[bisect.bisect_right(ends, v.index)]
    return result
