"""``create-topic-policy``: rules on the topics of CreateTopics requests (name, partitions,
replication factor, topic configs, configs that must not be set).

A topic that breaks a BLOCK rule fails alone with ``POLICY_VIOLATION`` and the policy's message; the
other topics of the request are created (validateOnly requests follow the same rules). INFO lets the
topic through and audits it; OVERRIDE rewrites the request with the rule's ``overrideValue``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import msgspec

from kanal.api import (
    ApiKey,
    GatewayServices,
    RequestContext,
    RequestResult,
    Respond,
    ResponseContext,
    ResponseResult,
    hookimpl,
)
from kanal_safeguards.base import SafeguardInterceptor, compile_topic
from kanal_safeguards.decisions import Action, Decisions, Violation
from kanal_safeguards.policies.entities import Failed, Key, failed_response, merge_failed
from kanal_safeguards.policies.topic_configs import (
    TOPIC_CONFIGS,
    Blacklist,
    apply_rewrites,
    config_rules,
    config_struct,
    refuse_override,
)
from kanal_safeguards.rules import RangeRule, RegexRule

__all__ = ["CreateTopicPolicy", "CreateTopicPolicyConfig"]


class _CreateTopicRules(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    topic: str = ".*"
    naming_convention: RegexRule | None = None
    num_partition: RangeRule | None = None
    replication_factor: RangeRule | None = None
    blacklist: Blacklist | None = None


#: The config of ``create-topic-policy``: the keys above and every rule of ``TOPIC_CONFIGS``.
CreateTopicPolicyConfig = config_struct("CreateTopicPolicyConfig", _CreateTopicRules, TOPIC_CONFIGS, TOPIC_CONFIGS)

_NOTES = "create-topic-policy"


def _key(topic: Any) -> Key:
    return (("name", topic.name),)


class CreateTopicPolicy(SafeguardInterceptor):
    """Checks each topic of a CreateTopics request; fails, lets through or rewrites it alone."""

    plugin_name: ClassVar[str] = "create-topic-policy"
    description: ClassVar[str] = "Rules on topic names, partitions, replication and configs at creation."
    config_type: ClassVar[type[Any]] = CreateTopicPolicyConfig
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.CREATE_TOPICS})
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.CREATE_TOPICS})
    responses_on_demand: ClassVar[bool] = True  # only when some topics were failed here
    config: _CreateTopicRules

    def __init__(self, config: _CreateTopicRules, services: GatewayServices) -> None:
        super().__init__(config, services)
        self._topic = compile_topic(config.topic)
        refuse_override(config.naming_convention, "namingConvention")
        self._configs = config_rules(config, TOPIC_CONFIGS, TOPIC_CONFIGS)

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> RequestResult:
        request = ctx.request
        kept: list[Any] = []
        failed: list[Failed] = []
        changed = False
        for topic in request.topics:
            if not self._topic.fullmatch(topic.name):
                kept.append(topic)
                continue
            decisions = Decisions()
            checked = self._check(topic, decisions)
            if decisions.blocked:
                failed.append(Failed(_key(topic), decisions.message))
                decisions = Decisions([v for v in decisions.violations if v.action is not Action.OVERRIDE])
            else:
                kept.append(checked)
                changed = changed or checked is not topic
            self.audit(decisions, ctx.connection, topic=topic.name)
        if failed and not kept:
            return Respond(failed_response(ctx.api_key, ctx.api_version, "topics", failed))
        if failed:
            ctx.notes[_NOTES] = (failed, [_key(t) for t in request.topics])
            ctx.want_response()
        if failed or changed:
            ctx.request = dataclasses.replace(request, topics=tuple(kept))
        return None

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> ResponseResult:
        noted = ctx.notes.get(_NOTES)
        if noted is not None:
            failed, order = noted
            ctx.response = merge_failed(ctx.response, "topics", failed, order)
        return None

    def _check(self, topic: Any, decisions: Decisions) -> Any:
        """Adds the topic's violations to ``decisions``; answers the topic as OVERRIDE rewrites it."""
        config = self.config
        if config.naming_convention is not None:
            decisions.add(config.naming_convention.check("Topic name", topic.name))
        partitions, replicas = _layout(topic)
        new_partitions = _override(config.num_partition, "numPartition", partitions, decisions)
        new_replicas = _override(config.replication_factor, "replicationFactor", replicas, decisions)
        checked = self._configs.check(((c.name, c.value) for c in topic.configs), decisions)
        if decisions.blocked:
            return topic
        changes: dict[str, Any] = {}
        if new_partitions is not None or new_replicas is not None:
            changes["num_partitions"] = _count(new_partitions if new_partitions is not None else partitions)
            changes["replication_factor"] = _count(new_replicas if new_replicas is not None else replicas)
            if topic.assignments:  # a manual layout gives way to counts (the broker places them)
                changes["assignments"] = ()
        if checked.rewrites:
            changes["configs"] = apply_rewrites(topic.configs, checked.rewrites)
        return dataclasses.replace(topic, **changes) if changes else topic


def _layout(topic: Any) -> tuple[int | None, int | None]:
    """Partitions and replication factor the topic asks for; None for the broker's default (-1)."""
    if topic.assignments:
        return len(topic.assignments), len(topic.assignments[0].broker_ids)
    partitions = topic.num_partitions if topic.num_partitions != -1 else None
    replicas = topic.replication_factor if topic.replication_factor != -1 else None
    return partitions, replicas


def _count(value: int | None) -> int:
    return value if value is not None else -1


def _override(rule: RangeRule | None, name: str, value: int | None, decisions: Decisions) -> int | None:
    """Checks a count; answers the value OVERRIDE writes instead, or None."""
    if rule is None:
        return None
    violation: Violation | None = rule.check(name, value)
    decisions.add(violation)
    if violation is not None and violation.action is Action.OVERRIDE:
        return int(violation.override)
    return None
