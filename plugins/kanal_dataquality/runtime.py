"""The data-quality state of one gateway: compiled rules and policies, metrics, history, alerts.

One :class:`Runtime` per gateway, built by the plugin's hooks and kept in ``services.shared`` under
:data:`RUNTIME` (where the interceptor finds it). The admin resource kinds apply their stored manifests
to it (on every node, whenever one changes); it compiles them into an
:class:`~kanal_dataquality.policies.Engine` and swaps it in (the interceptor reads ``runtime.engine`` on
every batch, so a change takes effect at once, without rebuilding the chain). The interceptor is
installed (``services.install``) only while some policy is enforced on this gateway: with none,
Produce requests are not even decoded for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson
import trio

from kanal.api import READY, HelperProcess, Key, Manifest, StateView, Status
from kanal_dataquality.actions import block_message, details, mark, violation_text
from kanal_dataquality.alerts import Alerts, Firing, audit_alert
from kanal_dataquality.avro import SchemaRegistry
from kanal_dataquality.batches import new_helper
from kanal_dataquality.evaluate import BatchResult
from kanal_dataquality.history import History, Reporter, new_node_id
from kanal_dataquality.metrics import DataQualityMetrics
from kanal_dataquality.policies import EMPTY, Engine, Plan, compile_policy
from kanal_dataquality.resources import ALERT, POLICY, RULE, Checks
from kanal_dataquality.rules import ENFORCE_AVRO, CompiledRule, RuleCompileError, compile_rule, enforce_avro
from kanal_dataquality.settings import Settings

if TYPE_CHECKING:
    from kanal_dataquality.backtest_service import Backtests

__all__ = ["RUNTIME", "SHADOW_STATUS", "WOULD_BLOCK", "Runtime", "compile_manifests"]

log = logging.getLogger(__name__)

#: The key of the gateway's runtime in the plugin's ``services.shared``.
RUNTIME = "runtime"
#: The history action of a violation a policy in shadow mode let through (block would have rejected it).
WOULD_BLOCK = "WOULD_BLOCK"
#: The status message of a policy in shadow mode.
SHADOW_STATUS = "shadow mode: nothing is blocked or marked; what block would have rejected is reported"


def compile_manifests(
    manifests: Sequence[Manifest], known: Mapping[str, tuple[bytes, CompiledRule]] | None = None
) -> tuple[dict[str, CompiledRule], dict[str, tuple[bytes, CompiledRule]]]:
    """Rules by name (EnforceAvro included), reusing ``known`` compilations of unchanged specs; also
    returns the new cache."""
    rules: dict[str, CompiledRule] = {ENFORCE_AVRO: enforce_avro()}
    cache: dict[str, tuple[bytes, CompiledRule]] = {}
    for manifest in manifests:
        name = manifest["metadata"]["name"]
        fingerprint = orjson.dumps(manifest["spec"], option=orjson.OPT_SORT_KEYS)
        previous = (known or {}).get(name)
        if previous is not None and previous[0] == fingerprint:
            cache[name] = previous
            rules[name] = previous[1]
            continue
        try:
            rule = compile_rule(name, manifest["spec"])
        except RuleCompileError as exc:  # validated when stored: another version of the engine?
            log.error("data quality rule %s cannot be compiled on this node: %s", name, exc)
            continue
        cache[name] = (fingerprint, rule)
        rules[name] = rule
    return rules, cache


def _now_ms() -> int:
    return int(time.time() * 1000)


class Runtime:
    """Everything the plugin keeps for one gateway."""

    def __init__(
        self,
        settings: Settings,
        gateway_cluster: str = "gateway",
        metrics_registry: Any = None,
        start_soon: Callable[..., None] | None = None,
    ) -> None:
        self.settings = settings
        self.gateway_cluster = gateway_cluster
        self.checks = Checks(gateway_cluster, frozenset(settings.clusters), settings.registry_url is not None)
        self.metrics = DataQualityMetrics(metrics_registry)
        self.node = new_node_id()
        self.history = History(self.node, settings.history_max_entries)
        self.reporter = Reporter(self.history, settings.max_reports_per_second)
        self.reporter.dropped_hook = lambda policy, n: self.metrics.reports_dropped.labels(policy).inc(n)
        self.registry: SchemaRegistry | None = None
        if settings.registry_url is not None:
            self.registry = SchemaRegistry(
                settings.registry_url,
                user_info=settings.registry_user_info,
                timeout=settings.registry_timeout,
                cache_size=settings.registry_cache_size,
                negative_ttl=settings.registry_negative_ttl,
            )
        self.engine: Engine = EMPTY
        # starts when first used, as a task of the gateway (start_soon)
        self.helper: HelperProcess | None = new_helper(start_soon) if settings.helper_process else None
        self.alerts = Alerts(self.metrics, self.node, gateway_cluster, self._fired)
        self.history.listeners.append(self.alerts.on_violation)
        self.firings: trio.MemoryReceiveChannel[Firing] | None = None
        self._firing_send: trio.MemorySendChannel[Firing] | None = None
        self.manifests: dict[str, list[Manifest]] = {RULE: [], POLICY: [], ALERT: []}
        self._compiled: dict[str, tuple[bytes, CompiledRule]] = {}
        self.installer: Callable[[bool], None] | None = None  # puts the interceptor in the chain, or takes it out
        self.installed = False
        self.statuses: dict[str, Status] = {}
        # The observer (clusters without a gateway): whether this node observes now (it leads its fleet),
        # and what: cluster -> "topic-partition" -> next offset.
        self.observing = False
        self.observed: dict[str, dict[str, int]] = {}
        self.engine_changed = trio.Event()  # set (and replaced) whenever the engine changes
        self.inline_policies = False  # an interceptor configured by hand (config file) reports here
        # this node's backtests, shared by the admin API and the console (set by the admin routes hook)
        self.backtests: Backtests | None = None

    async def aclose(self) -> None:
        """Stops the helper process (the gateway then does all the work, should a batch still come) and
        closes the registry client's connections."""
        helper, self.helper = self.helper, None
        if helper is not None:
            await trio.to_thread.run_sync(helper.close)
        if self.registry is not None:
            await self.registry.aclose()  # its kept-alive connections

    # -- configuration -----------------------------------------------------------------------------

    def apply(
        self, kind: str, resources: Sequence[Manifest], state: StateView | None = None
    ) -> dict[Key, Status] | None:
        """The stored resources of one kind, applied on this node (the ResourceKind's ``apply``)."""
        self.manifests[kind] = list(resources)
        if state is not None:  # keep the other kinds as stored (they are applied in order at startup)
            for other in (RULE, POLICY, ALERT):
                if other != kind:
                    self.manifests[other] = list(state.resources(other))
        if kind == ALERT:
            self.alerts.configure(self.manifests[ALERT])
            return None
        self.rebuild()
        if kind == POLICY:
            return {(name,): status for name, status in self.statuses.items()}
        return None

    def compile_rules(self, manifests: Sequence[Manifest]) -> dict[str, CompiledRule]:
        """Compiled rules by name (compiled once per version of each rule); EnforceAvro included."""
        rules, self._compiled = compile_manifests(manifests, self._compiled)
        return rules

    def rebuild(self) -> None:
        rules = self.compile_rules(self.manifests[RULE])
        policies = []
        statuses: dict[str, Status] = {}
        for manifest in self.manifests[POLICY]:
            name = manifest["metadata"]["name"]
            try:
                policy = compile_policy(manifest, rules, self.checks.observed_clusters)
            except (KeyError, TypeError, ValueError) as exc:
                statuses[name] = Status("Failed", f"cannot deploy the policy: {exc}")
                continue
            problems = []
            if policy.missing_rules:
                problems.append(f"unknown rules {', '.join(policy.missing_rules)} (deleted?)")
            if ENFORCE_AVRO in (r.name for r in policy.rules) and self.registry is None:
                problems.append(
                    f"{ENFORCE_AVRO} needs a schema registry (DATA_QUALITY_SCHEMA_REGISTRY_URL) on this node"
                )
            if not policy.observed and policy.cluster != self.gateway_cluster:
                problems.append(f"cluster {policy.cluster!r} is not this gateway ({self.gateway_cluster!r})")
            if policy.observed and policy.cluster not in self.settings.clusters:
                problems.append(f"cluster {policy.cluster!r} is not configured on this node (DATA_QUALITY_CLUSTERS)")
            policies.append(policy)
            if problems:
                statuses[name] = Status("Failed", "; ".join(problems))
            else:
                statuses[name] = Status("Ready", SHADOW_STATUS) if policy.shadow else READY
        engine = Engine(rules, policies, self.gateway_cluster)
        self.engine = engine
        self.metrics.forget({p.name for p in policies})
        self.statuses = statuses
        self._install(not engine.empty)
        changed, self.engine_changed = self.engine_changed, trio.Event()
        changed.set()

    def use_inline(self) -> None:
        """An interceptor with policies in its own config reports to this runtime: start the services."""
        if not self.inline_policies:
            self.inline_policies = True
            changed, self.engine_changed = self.engine_changed, trio.Event()
            changed.set()

    def _install(self, wanted: bool) -> None:
        if self.installer is None or wanted == self.installed:
            return
        try:
            self.installer(wanted)
        except Exception as exc:
            log.exception("cannot install the data quality interceptor")
            for name in self.statuses:
                self.statuses[name] = Status("Failed", f"cannot install the data quality interceptor: {exc}")
            return
        self.installed = wanted

    # -- traffic -----------------------------------------------------------------------------------

    def record(
        self,
        plan: Plan,
        result: BatchResult,
        topic: str,
        partition: int,
        client_id: str | None,
        cluster: str | None = None,
        enforce: bool = True,
    ) -> str | None:
        """Counts, reports and marks one batch's result; returns the block message when it is blocked."""
        now = _now_ms()
        cluster = cluster or self.gateway_cluster
        reporter = self.reporter
        metrics = self.metrics
        blocked = result.blocked

        def report(policy_name: str, rule_indexes: tuple[int, ...], outcomes: Any, action: str) -> None:
            rules = [plan.rules[i] for i in rule_indexes]
            entry = {
                "time": now,
                "policy": policy_name,
                "cluster": cluster,
                "topic": topic,
                "partition": partition,
                "rules": [r.name for r in rules],
                "message": violation_text(rules),
                "details": details(rules, outcomes),
                "clientId": client_id,
                "action": action,
            }
            if action == WOULD_BLOCK:
                entry["shadow"] = True
            reporter.report(entry)

        if blocked is not None:
            policy = plan.policies[blocked.policy]
            evaluated, violations, blocked_batches, _ = metrics.policy(policy.name)
            evaluated.inc()
            violations.inc()
            blocked_batches.inc()
            reporter.count(policy.name, 1, 1, now)
            index = blocked.index
            if policy.report:
                report(policy.name, blocked.rules, blocked.outcomes, "BLOCKED")
            self._flush_if_detached()
            return block_message(plan, blocked, topic, partition, index)
        counts = [0] * len(plan.policies)
        for v in result.violations:
            counts[v.policy] += 1
            policy = plan.policies[v.policy]
            if policy.report:
                if not enforce:
                    action = "OBSERVED"
                elif policy.shadow:
                    action = WOULD_BLOCK
                else:
                    action = "MARKED" if policy.mark else "REPORTED"
                report(policy.name, v.rules, v.outcomes, action)
        if enforce and plan.any_shadow and result.violations:
            self._shadow(plan, result, counts, now)
        marked: dict[str, int] = {}
        if enforce and plan.any_mark and result.violations:
            mark(plan, result.violations)
            for v in result.violations:
                policy = plan.policies[v.policy]
                if policy.mark:
                    marked[policy.name] = marked.get(policy.name, 0) + 1
        for i, policy in enumerate(plan.policies):
            evaluated, violations, _, marked_counter = metrics.policy(policy.name)
            evaluated.inc(result.evaluated)
            if counts[i]:
                violations.inc(counts[i])
            if marked.get(policy.name):
                marked_counter.inc(marked[policy.name])
            reporter.count(policy.name, result.evaluated, counts[i], now)
        self._flush_if_detached()
        return None

    def _shadow(self, plan: Plan, result: BatchResult, counts: list[int], now: int) -> None:
        """Counts what the policies in shadow mode would have blocked: the partition's records (block
        rejects them whole) when they broke the policy, and the records that broke each rule."""
        for i, policy in enumerate(plan.policies):
            if not policy.shadow or not counts[i]:
                continue
            rules: dict[str, int] = {}
            for v in result.violations:
                if v.policy == i:
                    for r in v.rules:
                        name = plan.rules[r].name
                        rules[name] = rules.get(name, 0) + 1
            self.metrics.shadow(policy.name, 1, result.evaluated, rules)
            self.reporter.count_shadow(policy.name, 1, result.evaluated, rules, now)

    def _flush_if_detached(self) -> None:
        if not self.reporter.connected:
            self.reporter.flush_local()

    # -- alerts ------------------------------------------------------------------------------------

    def _fired(self, firing: Firing) -> None:
        if not firing.deliver:
            return
        audit_alert(firing)
        if self._firing_send is not None:
            try:
                self._firing_send.send_nowait(firing)
            except trio.WouldBlock:
                log.warning("alert %s: delivery queue full, webhook not called", firing.rule.name)
        elif (firing.rule.destination or {}).get("type") == "Webhook":
            log.warning("alert %s fired, but this gateway runs no alert delivery service", firing.rule.name)

    def open_firing_channel(self) -> trio.MemoryReceiveChannel[Firing]:
        send, receive = trio.open_memory_channel[Firing](1000)
        self._firing_send = send
        return receive

    def describe_rules(self) -> Mapping[str, CompiledRule]:
        return self.engine.rules
