"""``fetch-policy``: how a consumer must fetch from the matching topics (isolation level, rack id,
fetch sizes, wait time, Fetch API version).

Every rule is a property of the request, so a BLOCK rejects the whole Fetch with POLICY_VIOLATION
on every partition: the consumer backs off and fetches again (its log shows the error), and the
audit log records each refusal.

A Fetch of an incremental fetch session (KIP-227) lists only what changed, yet fetches every topic
of its session: the policy keeps each connection's sessions (:mod:`.fetch_sessions`) and checks a
Fetch when a topic it lists or its session holds matches. An incremental Fetch of a session the
policy did not see open (it was opened before the policy applied to the connection) is answered
FETCH_SESSION_ID_NOT_FOUND, as a broker that lost the session would: the client opens a new one.
"""

from __future__ import annotations

import itertools
from typing import Annotated, Any, ClassVar

import msgspec

from kanal.api import (
    ApiKey,
    Connection,
    ErrorCode,
    GatewayServices,
    InterceptorConfigError,
    Reject,
    RequestContext,
    RequestResult,
    Respond,
    ResponseContext,
    ResponseResult,
    hookimpl,
)
from kanal_safeguards.base import SafeguardInterceptor, TopicMatcher, check_actions, with_throttle
from kanal_safeguards.decisions import Action, Decisions, Violation
from kanal_safeguards.policies.fetch_sessions import (
    FetchSessions,
    Session,
    forgotten_topics,
    listed_topics,
    session_not_found,
)
from kanal_safeguards.rules import RangeRule, ValueRule

__all__ = ["FetchPolicy", "FetchPolicyConfig"]

#: Fetch's ``isolation_level`` byte, as operators name it.
ISOLATION_LEVELS: dict[int, str] = {0: "read_uncommitted", 1: "read_committed"}

_OPENING = "opening"  # notes: the topics of a Fetch that asks for a session (its response names it)
_INSTANCES = itertools.count(1)  # connection.state keys: one per instance, never reused


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
        self._rules = any(rule is not None for rule in rules.values())
        # connection.state: this instance's FetchSessions (a key per instance: one configured later
        # has not seen the sessions opened before it)
        self._state_key = f"fetch-policy.sessions.{next(_INSTANCES)}"

    @hookimpl
    async def kanal_request(self, ctx: RequestContext) -> RequestResult:
        if not self._rules:
            return None
        fetched = await self._fetched_topics(ctx)
        if fetched is None:
            return Respond(session_not_found(ctx.api_version))
        matching = sorted({n for n in fetched if n is not None and self._matches(n)})
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
        opening: Session | None = ctx.notes.get(_OPENING)
        if opening is not None:
            session_id = int(getattr(ctx.response, "session_id", 0))
            if session_id > 0 and int(getattr(ctx.response, "error_code", 0)) == 0:
                self._sessions(ctx.connection).open(session_id, opening)
        if ctx.notes.get("throttle"):
            ctx.response = with_throttle(ctx.response, self.config.throttle_time_ms)
        return None

    @hookimpl
    def kanal_connection_closed(self, connection: Connection) -> None:
        connection.state.pop(self._state_key, None)

    async def _fetched_topics(self, ctx: RequestContext) -> set[str | None] | None:
        """The names of the topics a Fetch fetches: those it lists, and for an incremental Fetch
        those of its session (which it updates); None for an incremental Fetch of a session not
        known here. A Fetch that asks for a session has its response decoded, to learn the id."""
        request = ctx.request
        listed = await listed_topics(ctx)
        names = {topic.name for topic in listed.values()}
        session_id = int(getattr(request, "session_id", 0))
        epoch = int(getattr(request, "session_epoch", -1))
        if epoch > 0:
            session = self._sessions(ctx.connection).incremental(session_id, listed, forgotten_topics(request))
            if session is None:
                return None
            names.update(topic.name for topic in session.values())
            return names
        if session_id != 0 and self._state_key in ctx.connection.state:
            self._sessions(ctx.connection).close(session_id)
        if epoch == 0:
            ctx.notes[_OPENING] = listed
            ctx.want_response()
        return names

    def _sessions(self, connection: Connection) -> FetchSessions:
        """This instance's view of the connection's fetch sessions (created on first use)."""
        sessions: FetchSessions | None = connection.state.get(self._state_key)
        if sessions is None:
            sessions = connection.state[self._state_key] = FetchSessions()
        return sessions

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
