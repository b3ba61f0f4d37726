"""Policies compiled from their manifests, and the per-topic plans the interceptor runs.

Order. The policies that apply to a topic are evaluated in one documented, deterministic order:
blocking policies first, then the others, each group by policy name. A record that violates a
blocking policy stops the evaluation of its batch: the first blocking policy in that order that the
first violating record breaks is the one that counts it and reports it; no other policy counts or
reports anything of that batch (its records are hidden from them: the batch is never written).
When no blocking policy is violated, every policy counts every record and reports each violation.

A :class:`Plan` is what one topic needs: its policies in order, the union of their rules (a rule
listed by several policies runs once per record), and which parts of a record must be decoded.
Plans are cached per topic (bounded), and rebuilt whenever the rules or policies change (a new
:class:`Engine`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kanal_dataquality.resources import LITERAL
from kanal_dataquality.rules import ENFORCE_AVRO, ENFORCE_AVRO_MODE, CompiledRule

__all__ = ["CompiledPolicy", "Engine", "Plan", "Target", "order_policies"]

_PLAN_CACHE_MAX = 10_000


@dataclass(frozen=True, slots=True)
class Target:
    cluster: str
    topic: str
    literal: bool

    def matches(self, topic: str) -> bool:
        return topic == self.topic if self.literal else topic.startswith(self.topic)


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    """A policy ready to run: its rules in the order listed, targets, actions."""

    name: str
    group: str
    rules: tuple[CompiledRule, ...]
    targets: tuple[Target, ...]
    block: bool
    mark: bool
    report: bool
    cluster: str  # the cluster of its targets (they are all on one kind of cluster)
    observed: bool  # True: a cluster without a gateway (observe only)
    missing_rules: tuple[str, ...] = ()
    # Shadow mode: evaluated as a report-only policy (``block`` and ``mark`` are off), and what block
    # would have rejected is counted and reported (see Runtime.record).
    shadow: bool = False

    def applies_to(self, topic: str) -> bool:
        return any(t.matches(topic) for t in self.targets)


def order_policies(policies: Iterable[CompiledPolicy]) -> list[CompiledPolicy]:
    """Blocking policies first, then the others; by name within each group."""
    return sorted(policies, key=lambda p: (not p.block, p.name))


def compile_policy(
    manifest: Mapping[str, Any], rules: Mapping[str, CompiledRule], observed_clusters: frozenset[str]
) -> CompiledPolicy:
    """A policy from its canonical manifest; rules it lists that do not exist are left out (and named)."""
    metadata, spec = manifest["metadata"], manifest["spec"]
    compiled: list[CompiledRule] = []
    missing: list[str] = []
    for name in spec["rules"]:
        rule = rules.get(name)
        if rule is None:
            missing.append(name)
        else:
            compiled.append(rule)
    targets = tuple(Target(t["cluster"], t["topic"], t.get("patternType", LITERAL) == LITERAL) for t in spec["targets"])
    actions = spec.get("actions") or {}
    cluster = targets[0].cluster if targets else ""
    shadow = bool((actions.get("shadow") or {}).get("enabled", False))
    return CompiledPolicy(
        name=metadata["name"],
        group=str(metadata.get("group") or ""),
        rules=tuple(compiled),
        targets=targets,
        # in shadow mode nothing is blocked or marked: the policy runs as a report-only one
        block=bool((actions.get("block") or {}).get("enabled", False)) and not shadow,
        mark=bool((actions.get("mark") or {}).get("enabled", False)) and not shadow,
        report=bool((actions.get("report") or {}).get("enabled", True)),
        cluster=cluster,
        observed=cluster in observed_clusters,
        missing_rules=tuple(missing),
        shadow=shadow,
    )


@dataclass(slots=True, eq=False)
class Plan:
    """What one topic runs: policies in order, the union of their rules, and what to decode."""

    policies: tuple[CompiledPolicy, ...]
    rules: tuple[CompiledRule, ...]
    policy_rules: tuple[tuple[int, ...], ...]  # per policy: indexes into ``rules``, in the policy's order
    blockers: tuple[int, ...]  # indexes of blocking policies (they come first)
    uses_key: bool
    uses_value: bool
    uses_headers: bool
    enforce_avro: bool
    any_mark: bool
    any_shadow: bool = False
    # (mode, evaluate) per rule, for the record loop
    calls: tuple[tuple[int, Any], ...] = field(default=())
    header_names: frozenset[str] | None = frozenset()  # the headers rules read by name; None: any
    scanner: Any = None  # the generated record loop (kanal_dataquality.scan.compile_scanner), made on first use


def build_plan(policies: Sequence[CompiledPolicy]) -> Plan:
    rules: list[CompiledRule] = []
    index: dict[str, int] = {}
    policy_rules: list[tuple[int, ...]] = []
    for policy in policies:
        indexes = []
        for rule in policy.rules:
            if rule.name not in index:
                index[rule.name] = len(rules)
                rules.append(rule)
            indexes.append(index[rule.name])
        policy_rules.append(tuple(indexes))
    return Plan(
        policies=tuple(policies),
        rules=tuple(rules),
        policy_rules=tuple(policy_rules),
        blockers=tuple(i for i, p in enumerate(policies) if p.block),
        uses_key=any(r.uses_key for r in rules),
        uses_value=any(r.uses_value for r in rules),
        uses_headers=any(r.uses_headers for r in rules),
        enforce_avro=any(r.mode == ENFORCE_AVRO_MODE for r in rules),
        any_mark=any(p.mark and not p.block for p in policies),
        any_shadow=any(p.shadow for p in policies),
        calls=tuple((r.mode, r.evaluate) for r in rules),
        header_names=_header_names(rules),
    )


def _header_names(rules: Sequence[CompiledRule]) -> frozenset[str] | None:
    names: set[str] = set()
    for rule in rules:
        if rule.uses_headers:
            if rule.header_names is None:
                return None
            names |= rule.header_names
    return frozenset(names)


class Engine:
    """The compiled rules and policies of one configuration; immutable once built (swap to change)."""

    def __init__(
        self,
        rules: Mapping[str, CompiledRule],
        policies: Sequence[CompiledPolicy],
        gateway_cluster: str,
    ) -> None:
        self.rules = dict(rules)
        self.policies = order_policies(policies)
        self.gateway_cluster = gateway_cluster
        self.enforced = [p for p in self.policies if not p.observed and p.cluster == gateway_cluster]
        self.observed = [p for p in self.policies if p.observed]
        self._plans: dict[str, Plan | None] = {}
        self._by_policies: dict[tuple[str, ...], Plan] = {}  # topics with the same policies share a plan

    @property
    def empty(self) -> bool:
        """No policy enforced on this gateway: the interceptor need not run."""
        return not self.enforced

    def plan(self, topic: str) -> Plan | None:
        """The plan of a topic on this gateway, or None when no policy targets it."""
        plans = self._plans
        try:
            return plans[topic]
        except KeyError:
            pass
        if len(plans) >= _PLAN_CACHE_MAX:
            plans.clear()
        policies = [p for p in self.enforced if p.rules and p.applies_to(topic)]
        if not policies:
            plans[topic] = None
            return None
        names = tuple(p.name for p in policies)
        plan = self._by_policies.get(names)
        if plan is None:
            plan = self._by_policies[names] = build_plan(policies)
        plans[topic] = plan
        return plan

    def observed_plan(self, cluster: str, topic: str) -> Plan | None:
        policies = [p for p in self.observed if p.cluster == cluster and p.rules and p.applies_to(topic)]
        return build_plan(policies) if policies else None

    def policy(self, name: str) -> CompiledPolicy | None:
        return next((p for p in self.policies if p.name == name), None)


EMPTY = Engine({}, [], "")

__all__ += ["EMPTY", "ENFORCE_AVRO", "build_plan", "compile_policy"]
