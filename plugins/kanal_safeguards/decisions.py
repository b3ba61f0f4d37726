"""What a policy decides about a request, and how the decision reaches the client and the audit log.

A check answers a :class:`Violation` (or None): the reason, the action, and for OVERRIDE the value
to write instead. :class:`Decisions` gathers one request's violations; the policy then

- BLOCK: answers the request (or the offending topics, partitions, resources) with
  ``POLICY_VIOLATION`` (44) and the message :func:`violation_message` (``Request parameters do
  not satisfy the configured policy.`` then the reasons), as Kafka brokers do for their own create
  topic policies, so clients raise ``PolicyViolationException`` with it;
- INFO: lets it through;
- OVERRIDE: rewrites the request with the override value;
- THROTTLE: lets it through and the response carries ``throttle_time_ms`` (KIP-219: the client
  waits that long before its next request to the gateway).

Every decision is one audit event of type ``SAFEGUARD`` (per request, not per record), with the
plugin, the action, the reasons and for OVERRIDE the values before and after.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from kanal.api import Connection, GatewayServices

__all__ = ["AUDIT_TYPE", "PREFIX", "Action", "Decisions", "Violation", "violation_message"]

#: How every violation message starts (clients show it as the exception's message).
PREFIX = "Request parameters do not satisfy the configured policy."
AUDIT_TYPE = "SAFEGUARD"


class Action(enum.Enum):
    BLOCK = "BLOCK"
    INFO = "INFO"
    OVERRIDE = "OVERRIDE"
    THROTTLE = "THROTTLE"


@dataclass(frozen=True, slots=True)
class Violation:
    """One value that breaks a rule: ``reason`` (for the client and the audit), the rule's
    ``action``, the ``field`` and ``value`` at fault, and ``override`` (OVERRIDE writes it)."""

    reason: str
    action: Action
    field: str
    value: Any
    override: Any = None


def violation_message(reasons: list[str]) -> str:
    """The message of a BLOCK: the fixed prefix, then each reason."""
    return " ".join([PREFIX, *reasons])


@dataclass
class Decisions:
    """The violations of one request (or of one of its resources), by action."""

    violations: list[Violation] = field(default_factory=list)

    def add(self, violation: Violation | None) -> None:
        if violation is not None:
            self.violations.append(violation)

    def of(self, action: Action) -> list[Violation]:
        return [v for v in self.violations if v.action is action]

    @property
    def blocked(self) -> bool:
        return any(v.action is Action.BLOCK for v in self.violations)

    @property
    def message(self) -> str:
        """The client's message for what is blocked."""
        return violation_message([v.reason for v in self.of(Action.BLOCK)])

    def audit(self, services: GatewayServices, connection: Connection | None, plugin: str, **context: Any) -> None:
        """One audit event per action taken (``context``: the topic, group... it concerns)."""
        for action in Action:
            taken = self.of(action)
            if not taken:
                continue
            data: dict[str, Any] = {"plugin": plugin, "action": action.value, **context}
            data["reasons"] = [v.reason for v in taken]
            if action is Action.OVERRIDE:
                data["overrides"] = [{"field": v.field, "from": v.value, "to": v.override} for v in taken]
            services.audit(AUDIT_TYPE, connection, data)
