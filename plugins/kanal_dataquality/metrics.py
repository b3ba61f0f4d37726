"""Prometheus metrics of the data-quality plugin, in the gateway's registry (served at ``/metrics``).

Counted per policy, once per partition batch (never per record):

* ``gateway_data_quality_messages_evaluated_total{policy}``: records a policy evaluated;
* ``gateway_data_quality_violations_total{policy}``: records that broke at least one of its rules;
* ``gateway_data_quality_blocked_batches_total{policy}``: partition batches it blocked;
* ``gateway_data_quality_marked_records_total{policy}``: records written with its marking;
* ``gateway_data_quality_reports_dropped_total{policy}``: history entries not kept (rate limit);
* ``gateway_data_quality_shadow_blocked_batches_total{policy}``: partition batches a policy in shadow
  mode would have rejected with block on;
* ``gateway_data_quality_shadow_blocked_records_total{policy}``: the records of those batches (block
  rejects a batch whole, its valid records too);
* ``gateway_data_quality_shadow_violations_total{policy, rule}``: records that broke a rule of a policy
  in shadow mode;
* ``gateway_data_quality_alert_firing{alert, policy}``: 1 while an alert is firing (until its window ends);
* ``gateway_data_quality_alerts_fired_total{alert, policy}``: times an alert fired;
* ``gateway_data_quality_schema_lookups_total{result}``: schema registry lookups (found, unknown, unreachable);
* ``gateway_data_quality_observer_active``: 1 while this node observes the clusters without a gateway
  (it leads its fleet), else 0.

These are this node's live counters. The admin API's per-policy counts over 30 minutes to 7 days
are fleet-wide: each node publishes its counts to the history topic (every
``DATA_QUALITY_COUNTS_FLUSH_INTERVAL``), so they lag by at most that interval.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["DataQualityMetrics"]


class DataQualityMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        self.evaluated = Counter(
            "gateway_data_quality_messages_evaluated",
            "Records evaluated by a data quality policy",
            ["policy"],
            registry=r,
        )
        self.violations = Counter(
            "gateway_data_quality_violations", "Records that violated a data quality policy", ["policy"], registry=r
        )
        self.blocked = Counter(
            "gateway_data_quality_blocked_batches",
            "Produce partition batches rejected by a blocking data quality policy",
            ["policy"],
            registry=r,
        )
        self.marked = Counter(
            "gateway_data_quality_marked_records",
            "Records written with the data quality marking header, by policy",
            ["policy"],
            registry=r,
        )
        self.reports_dropped = Counter(
            "gateway_data_quality_reports_dropped",
            "Violation reports not kept in the history (DATA_QUALITY_MAX_REPORTS_PER_SECOND)",
            ["policy"],
            registry=r,
        )
        self.shadow_blocked = Counter(
            "gateway_data_quality_shadow_blocked_batches",
            "Produce partition batches a data quality policy in shadow mode would have rejected with block on",
            ["policy"],
            registry=r,
        )
        self.shadow_blocked_records = Counter(
            "gateway_data_quality_shadow_blocked_records",
            "Records of the batches a data quality policy in shadow mode would have rejected",
            ["policy"],
            registry=r,
        )
        self.shadow_violations = Counter(
            "gateway_data_quality_shadow_violations",
            "Records that broke a rule of a data quality policy in shadow mode, by policy and rule",
            ["policy", "rule"],
            registry=r,
        )
        self._shadow_policies: set[str] = set()  # the series to drop with their policy (forget)
        self._shadow_rules: set[tuple[str, str]] = set()
        self.alert_firing = Gauge(
            "gateway_data_quality_alert_firing",
            "1 while a data quality alert is firing (from its trigger until its window has passed)",
            ["alert", "policy"],
            registry=r,
        )
        self.alerts_fired = Counter(
            "gateway_data_quality_alerts_fired", "Data quality alerts fired", ["alert", "policy"], registry=r
        )
        self.schema_lookups = Counter(
            "gateway_data_quality_schema_lookups",
            "Schema registry lookups of the data quality plugin, by result",
            ["result"],
            registry=r,
        )
        self.observing = Gauge(
            "gateway_data_quality_observer_active",
            "1 while this node observes the clusters without a gateway (it leads its fleet)",
            registry=r,
        )
        self._bound: dict[str, tuple[Counter, Counter, Counter, Counter]] = {}

    def policy(self, name: str) -> tuple[Counter, Counter, Counter, Counter]:
        """(evaluated, violations, blocked, marked) children of one policy, bound once."""
        bound = self._bound.get(name)
        if bound is None:
            bound = self._bound[name] = (
                self.evaluated.labels(name),
                self.violations.labels(name),
                self.blocked.labels(name),
                self.marked.labels(name),
            )
        return bound

    def shadow(self, policy: str, batches: int, records: int, rules: dict[str, int]) -> None:
        """Counts what a policy in shadow mode would have blocked: ``batches`` partition batches of
        ``records`` records, and the records that broke each rule."""
        if batches:
            self._shadow_policies.add(policy)
            self.shadow_blocked.labels(policy).inc(batches)
            self.shadow_blocked_records.labels(policy).inc(records)
        for rule, count in rules.items():
            self._shadow_rules.add((policy, rule))
            self.shadow_violations.labels(policy, rule).inc(count)

    def forget(self, names: set[str]) -> None:
        """Drops the series of policies that no longer exist."""
        for name in list(self._bound):
            if name not in names:
                del self._bound[name]
                for metric in (self.evaluated, self.violations, self.blocked, self.marked, self.reports_dropped):
                    with contextlib.suppress(KeyError):
                        metric.remove(name)
        for name in [p for p in self._shadow_policies if p not in names]:
            self._shadow_policies.discard(name)
            for metric in (self.shadow_blocked, self.shadow_blocked_records):
                with contextlib.suppress(KeyError):
                    metric.remove(name)
        for policy, rule in [pr for pr in self._shadow_rules if pr[0] not in names]:
            self._shadow_rules.discard((policy, rule))
            with contextlib.suppress(KeyError):
                self.shadow_violations.remove(policy, rule)
