"""``alter-topic-config-policy`` and ``alter-broker-config-policy``: rules on the configs that
AlterConfigs and IncrementalAlterConfigs requests set on topics (resource type 2) and brokers (4).

A resource that breaks a BLOCK rule fails alone with ``POLICY_VIOLATION`` and the policy's message;
the other resources of the request are altered. INFO lets it through and audits it; OVERRIDE writes
the rule's ``overrideValue`` instead of the requested value (a blacklisted config under OVERRIDE is
removed from the request). Deleting a config (IncrementalAlterConfigs DELETE) brings back the
default, so it is never refused.
"""

from __future__ import annotations

import dataclasses
import re
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
from kanal_safeguards.decisions import Action, Decisions
from kanal_safeguards.policies.entities import Failed, Key, failed_response, merge_failed
from kanal_safeguards.policies.topic_configs import (
    BROKER_CONFIGS,
    TOPIC_ALTER_KEYS,
    TOPIC_CONFIGS,
    Blacklist,
    ConfigRules,
    apply_rewrites,
    config_rules,
    config_struct,
)

__all__ = [
    "AlterBrokerConfigPolicy",
    "AlterBrokerConfigPolicyConfig",
    "AlterTopicConfigPolicy",
    "AlterTopicConfigPolicyConfig",
]

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
_DELETE, _SUBTRACT = 1, 3  # IncrementalAlterConfigs operations (0 SET, 2 APPEND)


class _AlterTopicRules(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    topic: str = ".*"
    blacklist: Blacklist | None = None


class _AlterBrokerRules(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    blacklist: Blacklist | None = None


#: The config of ``alter-topic-config-policy``: ``topic``, ``blacklist`` and its topic config rules.
AlterTopicConfigPolicyConfig = config_struct(
    "AlterTopicConfigPolicyConfig", _AlterTopicRules, TOPIC_CONFIGS, TOPIC_ALTER_KEYS
)

#: The config of ``alter-broker-config-policy``: ``blacklist`` and its broker config rules.
AlterBrokerConfigPolicyConfig = config_struct(
    "AlterBrokerConfigPolicyConfig", _AlterBrokerRules, BROKER_CONFIGS, BROKER_CONFIGS
)


def _key(resource: Any) -> Key:
    return (("resource_type", resource.resource_type), ("resource_name", resource.resource_name))


def _checked_values(resource: Any) -> list[tuple[str, str | None]]:
    """The ``(name, value)`` pairs a request sets on a resource: every config of AlterConfigs;
    for IncrementalAlterConfigs no DELETE, and SUBTRACT without a value to check (only the
    blacklist applies to it)."""
    pairs: list[tuple[str, str | None]] = []
    for config in resource.configs:
        operation = getattr(config, "config_operation", 0)
        if operation == _DELETE:
            continue
        pairs.append((config.name, None if operation == _SUBTRACT else config.value))
    return pairs


class _AlterConfigPolicy(SafeguardInterceptor):
    """Checks each resource of one type in AlterConfigs / IncrementalAlterConfigs requests."""

    resource_type: ClassVar[int]
    audit_key: ClassVar[str]
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset(
        {ApiKey.ALTER_CONFIGS, ApiKey.INCREMENTAL_ALTER_CONFIGS}
    )
    response_api_keys: ClassVar[frozenset[int] | None] = request_api_keys
    responses_on_demand: ClassVar[bool] = True  # only when some resources were failed here
    _rules: ConfigRules

    def _applies(self, name: str) -> bool:
        return True

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> RequestResult:
        request = ctx.request
        kept: list[Any] = []
        failed: list[Failed] = []
        changed = False
        for resource in request.resources:
            if resource.resource_type != self.resource_type or not self._applies(resource.resource_name):
                kept.append(resource)
                continue
            checked = self._rules.check(_checked_values(resource))
            decisions = checked.decisions
            if decisions.blocked:
                failed.append(Failed(_key(resource), decisions.message))
                decisions = Decisions([v for v in decisions.violations if v.action is not Action.OVERRIDE])
            elif checked.rewrites:
                kept.append(dataclasses.replace(resource, configs=apply_rewrites(resource.configs, checked.rewrites)))
                changed = True
            else:
                kept.append(resource)
            self.audit(decisions, ctx.connection, **{self.audit_key: resource.resource_name})
        if failed and not kept:
            return Respond(failed_response(ctx.api_key, ctx.api_version, "responses", failed))
        if failed:
            ctx.notes[self.plugin_name] = (failed, [_key(r) for r in request.resources])
            ctx.want_response()
        if failed or changed:
            ctx.request = dataclasses.replace(request, resources=tuple(kept))
        return None

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> ResponseResult:
        noted = ctx.notes.get(self.plugin_name)
        if noted is not None:
            failed, order = noted
            ctx.response = merge_failed(ctx.response, "responses", failed, order)
        return None


class AlterTopicConfigPolicy(_AlterConfigPolicy):
    """Rules on the configs altered on topics (those matching ``topic``)."""

    plugin_name: ClassVar[str] = "alter-topic-config-policy"
    description: ClassVar[str] = "Rules on the topic configs that AlterConfigs requests set."
    config_type: ClassVar[type[Any]] = AlterTopicConfigPolicyConfig
    resource_type: ClassVar[int] = TOPIC_RESOURCE
    audit_key: ClassVar[str] = "topic"
    config: _AlterTopicRules

    def __init__(self, config: _AlterTopicRules, services: GatewayServices) -> None:
        super().__init__(config, services)
        self._topic: re.Pattern[str] = compile_topic(config.topic)
        self._rules = config_rules(config, TOPIC_CONFIGS, TOPIC_ALTER_KEYS)

    def _applies(self, name: str) -> bool:
        return self._topic.fullmatch(name) is not None


class AlterBrokerConfigPolicy(_AlterConfigPolicy):
    """Rules on the configs altered on brokers (one broker, or the cluster default: name "")."""

    plugin_name: ClassVar[str] = "alter-broker-config-policy"
    description: ClassVar[str] = "Rules on the broker configs that AlterConfigs requests set."
    config_type: ClassVar[type[Any]] = AlterBrokerConfigPolicyConfig
    resource_type: ClassVar[int] = BROKER_RESOURCE
    audit_key: ClassVar[str] = "broker"
    config: _AlterBrokerRules

    def __init__(self, config: _AlterBrokerRules, services: GatewayServices) -> None:
        super().__init__(config, services)
        self._rules = config_rules(config, BROKER_CONFIGS, BROKER_CONFIGS)
