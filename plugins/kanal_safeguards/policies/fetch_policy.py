"""``fetch-policy``: how a consumer must fetch from the matching topics (isolation level, rack id,
fetch sizes, wait time, Fetch API version).

Every rule is a property of the request, so a BLOCK rejects the whole Fetch with POLICY_VIOLATION
on every partition: the consumer backs off and fetches again (its log shows the error), and the
audit log records each refusal.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec

from kanal.api import (
    ApiKey,
    ErrorCode,
    GatewayServices,
    InterceptorConfigError,
    Reject,
    RequestContext,
    RequestResult,
    ResponseContext,
    ResponseResult,
    hookimpl,
)
from kanal_safeguards.base import SafeguardInterceptor, TopicMatcher, check_actions, with_throttle
from kanal_safeguards.decisions import Action, Decisions, Violation
from kanal_safeguards.rules import RangeRule, ValueRule

__all__ = ["FetchPolicy", "FetchPolicyConfig", "fetch_topic_names"]

#: Fetch's ``isolation_level`` byte, as operators name it.
ISOLATION_LEVELS: dict[int, str] = {0: "read_uncommitted", 1: "read_committed"}


class FetchPolicyConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """What operators write under ``config:`` (camelCase keys)."""

    topic: str = ".*"
    isolation_level: ValueRule | None = None
    rack_id_required: ValueRule | None = None
    fetch_max_bytes: RangeRule | None = None
    fetch_min_bytes: RangeRule | None = None
    max_wait_ms: RangeRule | None = None
    version: RangeRule | None = None
    throttle_time_ms: Annotated[int, msgspec.Meta(ge=0)] = 100


async def fetch_topic_names(ctx: RequestContext) -> list[str | None]:
    """The topic names of a Fetch request (v13+ names topics by id; None for an unknown one)."""
    names: list[str | None] = []
    for topic in ctx.request.topics:
        name = getattr(topic, "topic", None)
        topic_id = getattr(topic, "topic_id", None)
        if name is None and topic_id is not None:
            name = ctx.topic_names.name(topic_id) or await ctx.topic_names.resolve(topic_id)
        names.append(name)
    return names


class FetchPolicy(SafeguardInterceptor):
    """Checks Fetch requests for the matching topics against the configured rules."""

    plugin_name: ClassVar[str] = "fetch-policy"
    description: ClassVar[str] = "Requires an isolation level, a rack id, fetch sizes and waits, a Fetch version."
    config_type: ClassVar[type[FetchPolicyConfig]] = FetchPolicyConfig
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.FETCH})
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.FETCH})
    responses_on_demand: ClassVar[bool] = True
    config: FetchPolicyConfig

    ALLOWED: ClassVar[frozenset[Action]] = frozenset({Action.BLOCK, Action.INFO, Action.THROTTLE})

    def __init__(self, config: FetchPolicyConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        c = config
        rules: dict[str, Any] = {
            "isolationLevel": c.isolation_level,
            "rackIdRequired": c.rack_id_required,
            "fetchMaxBytes": c.fetch_max_bytes,
            "fetchMinBytes": c.fetch_min_bytes,
            "maxWaitMs": c.max_wait_ms,
            "version": c.version,
        }
        check_actions(self.plugin_name, rules, self.ALLOWED)
        if c.isolation_level is not None and c.isolation_level.value not in ISOLATION_LEVELS.values():
            raise InterceptorConfigError(
                f"isolationLevel.value: {c.isolation_level.value!r} is not an isolation level"
                " (use read_committed or read_uncommitted)"
            )
        if c.rack_id_required is not None and not isinstance(c.rack_id_required.value, bool):
            value = c.rack_id_required.value
            raise InterceptorConfigError(f"rackIdRequired.value: expected true or false, got {value!r}")
        self._matches = TopicMatcher(c.topic)
        self._may_throttle = any(rule is not None and rule.action is Action.THROTTLE for rule in rules.values())

    @hookimpl
    async def kanal_request(self, ctx: RequestContext) -> RequestResult:
        matching = sorted({n for n in await fetch_topic_names(ctx) if n is not None and self._matches(n)})
        if not matching:
            return None
        decisions = Decisions()
        for violation in self._violations(ctx.request, ctx.api_version):
            decisions.add(violation)
        if not decisions.violations:
            return None
        self.audit(decisions, ctx.connection, topics=matching, apiVersion=ctx.api_version)
        if decisions.blocked:
            return Reject(ErrorCode.policy_violation, decisions.message)
        if decisions.of(Action.THROTTLE):
            ctx.notes["throttle"] = True
            ctx.want_response()
        return None

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> ResponseResult:
        if ctx.notes.get("throttle"):
            ctx.response = with_throttle(ctx.response, self.config.throttle_time_ms)
        return None

    def _violations(self, request: Any, version: int) -> list[Violation | None]:
        c = self.config
        found: list[Violation | None] = []
        if c.isolation_level is not None:
            level = ISOLATION_LEVELS.get(int(getattr(request, "isolation_level", 0)), "read_uncommitted")
            found.append(c.isolation_level.check("isolationLevel", level))
        rack = c.rack_id_required
        if rack is not None and rack.value is True and not getattr(request, "rack_id", ""):
            found.append(Violation("rackId is required", rack.action, "rackId", None))
        if c.fetch_max_bytes is not None:
            found.append(c.fetch_max_bytes.check("fetchMaxBytes", getattr(request, "max_bytes", None)))
        if c.fetch_min_bytes is not None:
            found.append(c.fetch_min_bytes.check("fetchMinBytes", request.min_bytes))
        if c.max_wait_ms is not None:
            found.append(c.max_wait_ms.check("maxWaitMs", int(request.max_wait.total_seconds() * 1000)))
        if c.version is not None:
            found.append(c.version.check("version", version))
        return found
