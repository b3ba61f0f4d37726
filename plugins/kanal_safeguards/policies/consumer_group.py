"""``consumer-group-policy``: what a consumer may ask when it joins a group: the group id, member id
and group instance id (regexes), the session and rebalance timeouts (ranges).

It checks JoinGroup, the request every member of a classic consumer group sends first and
again at every rebalance, so a member refused there never gets into the group. BLOCK answers the
JoinGroup with ``POLICY_VIOLATION`` (the client's join fails: JoinGroup has no error message
field, so the reasons are in the audit log); INFO lets it join; OVERRIDE (the timeouts) rewrites
the request's value with ``overrideValue``, audited with the value before and after.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, ClassVar

import msgspec

from kanal.api import (
    ApiKey,
    ErrorCode,
    Reject,
    RequestContext,
    RequestResult,
    hookimpl,
)
from kanal_safeguards.base import SafeguardInterceptor
from kanal_safeguards.decisions import Action, Decisions, Violation
from kanal_safeguards.rules import RangeRule, RegexRule

__all__ = ["ConsumerGroupPolicy", "ConsumerGroupPolicyConfig"]

_TIMEOUTS = (("session_timeout", "sessionTimeoutMs"), ("rebalance_timeout", "rebalanceTimeoutMs"))


class ConsumerGroupPolicyConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    group_id: RegexRule | None = None
    member_id: RegexRule | None = None
    group_instance_id: RegexRule | None = None
    session_timeout_ms: RangeRule | None = None
    rebalance_timeout_ms: RangeRule | None = None

    def __post_init__(self) -> None:
        for name in ("group_id", "member_id", "group_instance_id"):
            rule = getattr(self, name)
            if rule is not None and rule.action not in (Action.BLOCK, Action.INFO):
                raise ValueError(f"{_camel(name)}: action {rule.action.value} is not one of BLOCK, INFO")
        for _, key in _TIMEOUTS:
            rule = getattr(self, _snake(key))
            if rule is not None and rule.action is Action.THROTTLE:
                raise ValueError(f"{key}: action THROTTLE is not one of BLOCK, INFO, OVERRIDE")


class ConsumerGroupPolicy(SafeguardInterceptor):
    """Checks JoinGroup requests against the configured rules."""

    plugin_name: ClassVar[str] = "consumer-group-policy"
    description: ClassVar[str] = "Rules on consumer group ids, member ids, instance ids and timeouts."
    config_type: ClassVar[type[Any] | None] = ConsumerGroupPolicyConfig
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.JOIN_GROUP})
    config: ConsumerGroupPolicyConfig

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> RequestResult:
        request = ctx.request
        config = self.config
        group = str(request.group_id)
        decisions = Decisions()
        if config.group_id is not None:
            decisions.add(config.group_id.check("GroupId", group))
        member = str(request.member_id)
        if config.member_id is not None and member:  # "": a first join, before the broker names it
            decisions.add(config.member_id.check("MemberId", member))
        if config.group_instance_id is not None:
            decisions.add(_instance_check(config.group_instance_id, getattr(request, "group_instance_id", None)))
        changes: dict[str, datetime.timedelta] = {}
        for field, key in _TIMEOUTS:
            rule: RangeRule | None = getattr(config, _snake(key))
            value = getattr(request, field, None)
            if rule is None or value is None:
                continue
            violation = rule.check(key, _ms(value))
            decisions.add(violation)
            if violation is not None and violation.action is Action.OVERRIDE:
                changes[field] = datetime.timedelta(milliseconds=violation.override)
        if not decisions.violations:
            return None
        self.audit(decisions, ctx.connection, groupId=group, memberId=member)
        if decisions.blocked:
            return Reject(ErrorCode.policy_violation, decisions.message)
        if changes:
            ctx.request = dataclasses.replace(request, **changes)
        return None


def _instance_check(rule: RegexRule, instance: str | None) -> Violation | None:
    """A consumer without ``group.instance.id`` (or a JoinGroup version before static membership)
    breaks a groupInstanceId rule: reported with the rule's action, with a reason saying so."""
    if instance is None:
        reason = f"GroupInstanceId is not set (group.instance.id), must match '{rule.value}'."
        return Violation(reason, rule.action, "GroupInstanceId", None)
    return rule.check("GroupInstanceId", str(instance))


def _ms(value: datetime.timedelta | int) -> int:
    """A kio timeout (a timedelta) in milliseconds."""
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    return int(value)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _snake(key: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)
