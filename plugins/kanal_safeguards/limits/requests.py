"""Rate limits: offset commits and group joins per minute per group id (``limit-commit-offset``,
``limit-join-group``), new connections per second (``limit-connection``).

Each counts in a :class:`~kanal_safeguards.windows.SlidingWindow` held by the interceptor (per
configured interceptor: every connection its scope matches shares it). The limit holds for the
whole fleet: each node holds its keys to its share of it
(:mod:`~kanal_safeguards.limits.fleet_usage`), the whole limit when it is alone. An event over the
limit is, by ``action``:

- BLOCK: refused (commits and joins: ``POLICY_VIOLATION``; connections: closed at their first
  request) and not counted, so the limit is what gets through;
- INFO: let through, counted and audited;
- THROTTLE: let through, counted, audited, and its response carries ``throttle_time_ms`` equal to
  ``throttleTimeMs`` (the client waits that long before its next request, KIP-219).
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping
from typing import Annotated, Any, ClassVar

import msgspec

from kanal.api import (
    ApiKey,
    Close,
    Connection,
    ErrorCode,
    GatewayServices,
    Reject,
    RequestContext,
    RequestResult,
    ResponseContext,
    ResponseResult,
    hookimpl,
)
from kanal_safeguards.base import SafeguardInterceptor, with_throttle
from kanal_safeguards.decisions import Action, Decisions, Violation
from kanal_safeguards.limits.fleet_usage import SharedLimit, fleet_limits
from kanal_safeguards.limits.windows import SlidingWindow

__all__ = [
    "LimitCommitOffset",
    "LimitCommitOffsetConfig",
    "LimitConnection",
    "LimitConnectionConfig",
    "LimitJoinGroup",
    "LimitJoinGroupConfig",
]

_THROTTLE = "throttle"  # the note a THROTTLE decision leaves for the response hook
_CONNECTIONS = "connections"  # limit-connection's one key
_LIMIT_ACTIONS = (Action.BLOCK, Action.INFO, Action.THROTTLE)
#: Every request but the two that carry records (kept undecoded: see limit-connection's doc).
_FIRST_REQUESTS = frozenset(int(k) for k in ApiKey if k not in (ApiKey.PRODUCE, ApiKey.FETCH))


class _LimitConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True, dict=True):
    action: Action = Action.BLOCK
    throttle_time_ms: Annotated[int, msgspec.Meta(ge=0)] = 100

    def __post_init__(self) -> None:
        if self.action not in _LIMIT_ACTIONS:
            raise ValueError(f"action {self.action.value} is not one of BLOCK, INFO, THROTTLE")


class _GroupLimitConfig(_LimitConfig, kw_only=True):
    group_id: str = ".*"

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            self.group_pattern = re.compile(self.group_id)
        except re.error as exc:
            raise ValueError(f"groupId {self.group_id!r} is not a valid regex: {exc}") from None


class LimitCommitOffsetConfig(_GroupLimitConfig, kw_only=True):
    maximum_commits_per_minute: Annotated[int, msgspec.Meta(ge=0)]


class LimitJoinGroupConfig(_GroupLimitConfig, kw_only=True):
    maximum_joins_per_minute: Annotated[int, msgspec.Meta(ge=0)]


class LimitConnectionConfig(_LimitConfig, kw_only=True):
    maximum_connections_per_second: Annotated[int, msgspec.Meta(ge=0)]


class _GroupRateLimit(SafeguardInterceptor):
    """Counts one request type per group id per minute (groups whose id matches ``groupId``)."""

    api_key: ClassVar[int]
    what: ClassVar[str]  # what the reason calls the requests counted
    responses_on_demand: ClassVar[bool] = True  # only THROTTLE needs the response decoded
    config: _GroupLimitConfig

    def __init__(self, config: _GroupLimitConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        self.window = SlidingWindow(self.limit, 60.0)
        # in a fleet, each group's limit is this node's share of it (fleet_usage.py)
        self.shared = SharedLimit(self, self.limit, seconds=60.0, integral=True, apply=self.set_shares)
        fleet_limits(services).add(self.shared)

    @property
    def limit(self) -> int:
        raise NotImplementedError

    def set_shares(self, limit: float, by_key: Mapping[Hashable, float]) -> None:
        """This node's share of the fleet-wide limit: ``limit`` for any group, ``by_key`` for the
        groups some node counted recently."""
        self.window.set_limits(int(limit), {key: int(n) for key, n in by_key.items()})

    async def aclose(self) -> None:
        fleet_limits(self.services).remove(self.shared)

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> RequestResult:
        group = str(ctx.request.group_id)
        if not self.config.group_pattern.fullmatch(group):
            return None
        action = self.config.action
        allowed = self.window.take(group, always=action is not Action.BLOCK)
        shared = self.shared
        if shared.active:
            shared.add(group, 1.0, not allowed)
        if allowed:
            return None
        reason = f"Too many {self.what} for group '{group}': at most {self.limit} per minute."
        decisions = Decisions([Violation(reason, action, "groupId", group)])
        self.audit(decisions, ctx.connection, groupId=group)
        if action is Action.BLOCK:
            return Reject(ErrorCode.policy_violation, decisions.message)
        if action is Action.THROTTLE:
            ctx.notes[_THROTTLE] = True
            ctx.want_response()
        return None

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> ResponseResult:
        if ctx.notes.get(_THROTTLE):
            ctx.response = with_throttle(ctx.response, self.config.throttle_time_ms)
        return None


class LimitCommitOffset(_GroupRateLimit):
    """At most ``maximumCommitsPerMinute`` OffsetCommit requests per group id: a consumer
    committing after every record loads the group coordinator of everyone."""

    plugin_name: ClassVar[str] = "limit-commit-offset"
    description: ClassVar[str] = "Limits the offset commits per minute of each consumer group."
    config_type: ClassVar[type[Any] | None] = LimitCommitOffsetConfig
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.OFFSET_COMMIT})
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.OFFSET_COMMIT})
    what: ClassVar[str] = "offset commits"
    config: LimitCommitOffsetConfig

    @property
    def limit(self) -> int:
        return self.config.maximum_commits_per_minute


class LimitJoinGroup(_GroupRateLimit):
    """At most ``maximumJoinsPerMinute`` JoinGroup requests per group id: a member that keeps
    rejoining makes the whole group rebalance."""

    plugin_name: ClassVar[str] = "limit-join-group"
    description: ClassVar[str] = "Limits the group joins per minute of each consumer group."
    config_type: ClassVar[type[Any] | None] = LimitJoinGroupConfig
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.JOIN_GROUP})
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.JOIN_GROUP})
    what: ClassVar[str] = "group joins"
    config: LimitJoinGroupConfig

    @property
    def limit(self) -> int:
        return self.config.maximum_joins_per_minute


class LimitConnection(SafeguardInterceptor):
    """At most ``maximumConnectionsPerSecond`` new client connections per second (requests on
    open connections are not counted): a client reconnecting in a loop exhausts the gateway's and
    the brokers' sockets.

    A connection over the limit is decided when it opens and acted on at its first request: BLOCK
    closes it (the client sees a disconnect and reconnects after its backoff, as a new connection
    counted again), THROTTLE puts ``throttleTimeMs`` on the response to its first request
    (usually ApiVersions), INFO only audits. Produce and Fetch are not decoded for this interceptor:
    a connection whose first request is one of them (clients that pin their API version and skip
    ApiVersions) is acted on at its first other request.
    """

    plugin_name: ClassVar[str] = "limit-connection"
    description: ClassVar[str] = "Limits how many new client connections per second the gateway accepts."
    config_type: ClassVar[type[Any] | None] = LimitConnectionConfig
    request_api_keys: ClassVar[frozenset[int] | None] = _FIRST_REQUESTS
    response_api_keys: ClassVar[frozenset[int] | None] = _FIRST_REQUESTS
    responses_on_demand: ClassVar[bool] = True
    config: LimitConnectionConfig

    def __init__(self, config: LimitConnectionConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        limit = config.maximum_connections_per_second
        self.window = SlidingWindow(limit, 1.0)
        self.over: dict[Connection, str] = {}  # connections over the limit, until their first request
        # in a fleet, the limit is this node's share of it (fleet_usage.py)
        self.shared = SharedLimit(
            self, limit, seconds=1.0, integral=True, apply=self.set_shares, single=True, key=_CONNECTIONS
        )
        fleet_limits(services).add(self.shared)

    def set_shares(self, limit: float, by_key: Mapping[Hashable, float]) -> None:
        """This node's share of the fleet-wide limit (one key: every connection shares it)."""
        self.window.set_limits(int(limit), {key: int(n) for key, n in by_key.items()})

    async def aclose(self) -> None:
        fleet_limits(self.services).remove(self.shared)

    @hookimpl
    def kanal_connection_opened(self, connection: Connection) -> None:
        action = self.config.action
        allowed = self.window.take(_CONNECTIONS, always=action is not Action.BLOCK)
        shared = self.shared
        if shared.active:
            shared.add(_CONNECTIONS, 1.0, not allowed)
        if allowed:
            return
        limit = self.config.maximum_connections_per_second
        reason = f"Too many new connections: at most {limit} per second."
        decisions = Decisions([Violation(reason, action, "connection", connection.client_address)])
        self.audit(decisions, connection, clientAddress=connection.client_address)
        if action is not Action.INFO:
            self.over[connection] = decisions.message if action is Action.BLOCK else reason

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> RequestResult:
        reason = self.over.pop(ctx.connection, None)
        if reason is None:
            return None
        if self.config.action is Action.BLOCK:
            return Close(reason)
        ctx.notes[_THROTTLE] = True
        ctx.want_response()
        return None

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> ResponseResult:
        if ctx.notes.get(_THROTTLE):
            ctx.response = with_throttle(ctx.response, self.config.throttle_time_ms)
        return None

    @hookimpl
    def kanal_connection_closed(self, connection: Connection) -> None:
        self.over.pop(connection, None)
