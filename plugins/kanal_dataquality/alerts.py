"""Policy violation alerts: ``triggerAfter`` violations within ``withinInSeconds`` fire an alert.

Every node follows the history topic, so every node sees the whole fleet's violations in the same
order, and agrees on which report made an alert cross its threshold. That report's node delivers
the alert (an audit event on the ``kanal.audit`` logger and, with a Webhook destination, a JSON POST);
every node shows it in the gauge ``gateway_data_quality_alert_firing``. So an alert fires once per
fleet, not once per node.

Window. Violations are counted over a sliding window of ``withinInSeconds`` (by the time they
happened). When the count reaches ``triggerAfter`` the alert fires and stays firing for one window;
then it re-arms, counting only violations that happen after it fired.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import trio

from kanal_dataquality.http import HttpError, request
from kanal_dataquality.metrics import DataQualityMetrics

__all__ = ["AlertRule", "Alerts", "Firing", "audit_alert", "deliver"]

log = logging.getLogger(__name__)
audit_log = logging.getLogger("kanal.audit")


@dataclass(frozen=True)
class AlertRule:
    name: str
    policy: str
    trigger_after: int
    within_ms: int
    destination: Mapping[str, Any] | None
    group: str | None = None

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> AlertRule:
        spec, metadata = manifest["spec"], manifest["metadata"]
        return cls(
            name=metadata["name"],
            policy=spec["policyName"],
            trigger_after=int(spec["triggerAfter"]),
            within_ms=int(spec["withinInSeconds"]) * 1000,
            destination=spec.get("destination"),
            group=metadata.get("group"),
        )


@dataclass
class _State:
    rule: AlertRule
    events: collections.deque[tuple[int, int]] = field(default_factory=collections.deque)
    total: int = 0
    fired_at: int | None = None
    fired: int = 0


@dataclass(frozen=True)
class Firing:
    """One time an alert fired."""

    rule: AlertRule
    at: int  # ms
    violations: int
    window_start: int
    cluster: str
    deliver: bool  # this node delivers it

    def payload(self) -> dict[str, Any]:
        return {
            "alert": self.rule.name,
            "type": "DataQualityPolicyAlert",
            "policyName": self.rule.policy,
            "triggerAfter": self.rule.trigger_after,
            "withinInSeconds": self.rule.within_ms // 1000,
            "violations": self.violations,
            "firedAt": _iso(self.at),
            "windowStart": _iso(self.window_start),
            "cluster": self.cluster,
            "group": self.rule.group,
        }


def _iso(ms: int) -> str:
    return (
        datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


class Alerts:
    """The alerts of this gateway and their windows."""

    def __init__(self, metrics: DataQualityMetrics, node: str, cluster: str, on_fire: Callable[[Firing], None]) -> None:
        self.metrics = metrics
        self.node = node
        self.cluster = cluster
        self.on_fire = on_fire
        self._states: dict[str, _State] = {}
        self._by_policy: dict[str, list[_State]] = {}

    def configure(self, manifests: Sequence[Mapping[str, Any]]) -> None:
        """The alerts as stored; an unchanged alert keeps its window and firing state."""
        states: dict[str, _State] = {}
        for manifest in manifests:
            rule = AlertRule.from_manifest(manifest)
            old = self._states.get(rule.name)
            states[rule.name] = old if old is not None and old.rule == rule else _State(rule)
        for name, old in self._states.items():
            if name not in states or states[name] is not old:
                with contextlib.suppress(KeyError):
                    self.metrics.alert_firing.remove(name, old.rule.policy)
        self._states = states
        by_policy: dict[str, list[_State]] = {}
        for state in states.values():
            by_policy.setdefault(state.rule.policy, []).append(state)
            self.metrics.alert_firing.labels(state.rule.name, state.rule.policy).set(1 if state.fired_at else 0)
        self._by_policy = by_policy

    def on_violation(self, policy: str, at: int, count: int, origin: str) -> None:
        """``count`` violations of ``policy`` at ``at`` (ms), reported by node ``origin``, in log order."""
        states = self._by_policy.get(policy)
        if not states or count <= 0:
            return
        for state in states:
            rule = state.rule
            if state.fired_at is not None and at < state.fired_at + rule.within_ms:
                continue  # firing: re-arms after its window
            events = state.events
            events.append((at, count))
            state.total += count
            horizon = at - rule.within_ms
            while events and events[0][0] <= horizon:
                state.total -= events.popleft()[1]
            if state.total >= rule.trigger_after:
                firing = Firing(rule, at, state.total, events[0][0], self.cluster, origin == self.node)
                state.fired_at = at
                state.fired += 1
                state.events.clear()
                state.total = 0
                self.metrics.alert_firing.labels(rule.name, rule.policy).set(1)
                self.metrics.alerts_fired.labels(rule.name, rule.policy).inc()
                self.on_fire(firing)

    def tick(self, now_ms: int) -> None:
        """Ends the firing state of alerts whose window has passed."""
        for state in self._states.values():
            if state.fired_at is not None and now_ms >= state.fired_at + state.rule.within_ms:
                state.fired_at = None
                self.metrics.alert_firing.labels(state.rule.name, state.rule.policy).set(0)

    def describe(self) -> list[dict[str, Any]]:
        return [
            {
                "name": s.rule.name,
                "policyName": s.rule.policy,
                "firing": s.fired_at is not None,
                "firedAt": _iso(s.fired_at) if s.fired_at is not None else None,
                "timesFired": s.fired,
                "violationsInWindow": s.total,
            }
            for s in self._states.values()
        ]


def audit_alert(firing: Firing) -> None:
    """The audit event of an alert (``kanal.audit`` logger, event DATA_QUALITY, action ALERT_FIRED)."""
    fields = {"event": "DATA_QUALITY", "action": "ALERT_FIRED", **firing.payload()}
    fields = {k: v for k, v in fields.items() if v is not None}
    summary = " ".join(f"{k}={v}" for k, v in fields.items() if k not in ("event", "action"))
    audit_log.info("DATA_QUALITY ALERT_FIRED %s", summary, extra=fields)


async def deliver(firing: Firing, timeout: float = 5.0, attempts: int = 3) -> bool:
    """POSTs the alert to its webhook (retried); returns whether the webhook accepted it."""
    destination = firing.rule.destination or {}
    if destination.get("type") != "Webhook":
        return True
    headers = {"Content-Type": "application/json", **dict(destination.get("headers") or {})}
    body = orjson.dumps(firing.payload())
    for attempt in range(attempts):
        try:
            response = await request("POST", destination["url"], body=body, headers=headers, timeout=timeout)
            if 200 <= response.status < 300:
                return True
            log.warning("alert %s: webhook answered HTTP %d", firing.rule.name, response.status)
        except HttpError as exc:
            log.warning("alert %s: webhook failed: %s", firing.rule.name, exc)
        await trio.sleep(0.5 * (attempt + 1))
    return False
