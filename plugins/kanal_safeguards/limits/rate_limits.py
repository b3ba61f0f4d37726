"""Byte-rate limits: bytes produced per second (``producer-rate-limiting``) and bytes fetched per
second (``consumer-rate-limiting``), per interceptor, principal or virtual cluster (``limitBy``).

A broker quota, as KIP-219 has it: a request is never failed. Bytes are taken from a token bucket
(:class:`~kanal_safeguards.buckets.TokenBuckets`, rate ``maximumBytesPerSecond``, burst one
second's worth) even past zero; a client whose bucket is in debt is told how long until it is back
at zero (``throttle_time_ms``) and, since librdkafka does not wait that long by itself (it only
reports it to ``throttle_cb``), the gateway *holds* the bucket's next request that long before
forwarding it, as a broker mutes a throttled channel. So the rate holds whatever the client does,
and a client that does wait is never held. ``action: INFO`` only audits.

Only bytes of topics matching ``topic`` count: Produce ``records`` fields (their length: no record
is decoded) and Fetch record sets (their batch sizes, read from the batch headers).

The limit holds for the whole fleet: a bucket's rate is this node's share of the limit
(:mod:`~kanal_safeguards.limits.fleet_usage`), the whole limit when the node is alone.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Annotated, Any, ClassVar

import msgspec
import trio
from prometheus_client import Counter

from kanal.api import (
    ApiKey,
    Connection,
    GatewayServices,
    Interceptor,
    RecordsContext,
    RecordsResult,
    RequestContext,
    RequestResult,
    ResponseContext,
    ResponseResult,
    hookimpl,
)
from kanal_safeguards.base import SafeguardInterceptor, TopicMatcher, check_action, with_throttle
from kanal_safeguards.decisions import Action, Decisions, Violation
from kanal_safeguards.limits.buckets import TokenBuckets
from kanal_safeguards.limits.fleet_usage import SharedLimit, fleet_limits
from kanal_safeguards.limits.windows import Clock, SlidingWindow

__all__ = [
    "INTERCEPTORS",
    "ByteRateConfig",
    "ConsumerRateLimiting",
    "LimitBy",
    "ProducerRateLimiting",
    "counted_bytes",
]

_ACTIONS = frozenset({Action.BLOCK, Action.INFO})
_THROTTLE = "throttle_ms"  # the note a request leaves for its response: the throttle time to report
_HELD = "held"  # the note a held Fetch leaves: report the debt its response leaves


class LimitBy(enum.Enum):
    """Whose bytes share a bucket."""

    RULE = "RULE"  # every client in the interceptor's scope
    PRINCIPAL = "PRINCIPAL"  # each principal of each virtual cluster (the anonymous clients share one)
    VCLUSTER = "VCLUSTER"  # each virtual cluster (the passthrough clients share one)


class ByteRateConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True, dict=True):
    maximum_bytes_per_second: Annotated[int, msgspec.Meta(gt=0)]
    topic: str = ".*"
    limit_by: LimitBy = LimitBy.RULE
    action: Action = Action.BLOCK


def _rule_key(connection: Connection) -> Hashable:
    return None


def _principal_key(connection: Connection) -> Hashable:
    """A principal is a name within its virtual cluster: ``app`` of two tenants is two accounts,
    and one tenant's traffic must not throttle the other's."""
    return (connection.vcluster, connection.principal)


def _vcluster_key(connection: Connection) -> Hashable:
    return connection.vcluster


_KEYS: dict[LimitBy, Callable[[Connection], Hashable]] = {
    LimitBy.RULE: _rule_key,
    LimitBy.PRINCIPAL: _principal_key,
    LimitBy.VCLUSTER: _vcluster_key,
}


def _whose(limit_by: LimitBy, connection: Connection) -> tuple[str | None, str]:
    """The bucket as the audit event names it (``bucket``: the principal or the virtual cluster,
    None for the rule) and the end of its reason."""
    principal, vcluster = connection.principal, connection.vcluster
    if limit_by is LimitBy.PRINCIPAL:
        who = "anonymous clients" if principal is None else f"principal {principal!r}"
        where = "" if vcluster is None else f" in virtual cluster {vcluster!r}"
        return principal, f" for {who}{where}"
    if limit_by is LimitBy.VCLUSTER:
        return (
            vcluster,
            " for clients in no virtual cluster" if vcluster is None else f" for virtual cluster {vcluster!r}",
        )
    return None, ""


def _max_hold(services: GatewayServices) -> float:
    """The longest hold, in seconds: under the hook deadline, which would close the connection."""
    return max(services.hook_timeout, 0.1) * 0.8


def _counted(services: GatewayServices) -> Counter:
    """The bytes the limiters counted, by interceptor type, registered once per gateway."""
    shared = services.shared
    if "rate_limits.counted" not in shared:
        shared["rate_limits.counted"] = Counter(
            "kanal_rate_limit_bytes", "Bytes the byte-rate limiters counted", ["plugin"], registry=services.metrics
        )
    counter: Counter = shared["rate_limits.counted"]
    return counter


def counted_bytes(services: GatewayServices) -> dict[str, float]:
    """The bytes counted since the gateway started, by interceptor type (``kanal_rate_limit_bytes_total``),
    read from the counter itself (not the whole registry): the console's figures. Empty before the
    first limiter."""
    counter = services.shared.get("rate_limits.counted")
    if not isinstance(counter, Counter):
        return {}
    return {
        sample.labels["plugin"]: sample.value
        for metric in counter.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    }


class _ByteRateLimit(SafeguardInterceptor):
    """What both directions share: buckets by ``limitBy``, the hold, the audit (at most one event
    per bucket per second: a throttled client sends many requests a second)."""

    what: ClassVar[str]  # what the audit reason calls the bytes counted
    responses_on_demand: ClassVar[bool] = True  # only throttled responses are decoded
    config: ByteRateConfig

    def __init__(self, config: ByteRateConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        check_action(self.plugin_name, "action", config.action, _ACTIONS)
        self.topics = TopicMatcher(config.topic)
        self.every_topic = config.topic == ".*"
        self.enforce = config.action is Action.BLOCK
        self.key_of = _KEYS[config.limit_by]
        self.max_hold = _max_hold(services)
        self.sleep: Callable[[float], Awaitable[Any]] = trio.sleep
        self.counted = _counted(services).labels(self.plugin_name)
        self.use_clock()
        # in a fleet, the buckets' rate is this node's share of the limit (fleet_usage.py)
        limit = config.maximum_bytes_per_second
        single = config.limit_by is LimitBy.RULE
        self.shared = SharedLimit(self, limit, seconds=1.0, integral=False, apply=self.set_shares, single=single)
        fleet_limits(services).add(self.shared)

    def use_clock(self, clock: Clock | None = None) -> None:
        """(Re)starts the buckets and the audit window on ``clock`` (tests inject one)."""
        clock = clock or time.monotonic
        self.buckets = TokenBuckets(self.config.maximum_bytes_per_second, clock=clock)
        self.audits = SlidingWindow(1, 1.0, clock)

    def set_shares(self, rate: float, by_key: Mapping[Hashable, float]) -> None:
        """This node's share of the fleet-wide limit: ``rate`` for any key, ``by_key`` for the keys
        some node used recently."""
        self.buckets.set_rates(rate, by_key)

    async def aclose(self) -> None:
        fleet_limits(self.services).remove(self.shared)

    def throttle_ms(self, debt: float) -> int:
        """The throttle time of a debt of ``debt`` seconds, capped at the longest hold."""
        return math.ceil(min(debt, self.max_hold) * 1000)

    async def hold(self, key: Hashable) -> float:
        """Holds a request of a bucket in debt until the bucket is back at zero (at most
        ``max_hold``): a client that waited its throttle time is not held. Returns the wait."""
        wait = min(self.buckets.debt(key), self.max_hold)
        if wait > 0:
            await self.sleep(wait)
        return wait

    def over(self, connection: Connection, key: Hashable, debt: float) -> None:
        """Audits that ``key`` went over the limit (at most once a second per bucket)."""
        if not self.audits.take(key):
            return
        limit = self.config.maximum_bytes_per_second
        bucket, whose = _whose(self.config.limit_by, connection)
        reason = f"{self.what} over {limit} bytes per second{whose}."
        action = self.config.action
        decisions = Decisions([Violation(reason, action, "maximumBytesPerSecond", limit)])
        self.audit(
            decisions,
            connection,
            level="ERROR" if self.enforce else "WARNING",
            limitBy=self.config.limit_by.value,
            bucket=bucket,
            throttleTimeMs=self.throttle_ms(debt) if self.enforce else 0,
        )


class ProducerRateLimiting(_ByteRateLimit):
    """At most ``maximumBytesPerSecond`` bytes of records produced per second: a producer that
    floods a shared cluster slows everyone's writes and replication.

    The bytes are the ``records`` fields of the Produce request (batch framing and compression
    included, as a broker's quota counts them), known before the request is forwarded: the response
    to the request that went over the limit carries the throttle time, and the bucket's next
    request is held until the debt is paid. An ``acks=0`` request has no response: its bytes count,
    and the next request is held.
    """

    plugin_name: ClassVar[str] = "producer-rate-limiting"
    description: ClassVar[str] = "Limits the bytes per second producers send (a broker-style quota)."
    config_type: ClassVar[type[Any] | None] = ByteRateConfig
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.PRODUCE})
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.PRODUCE})
    what: ClassVar[str] = "Produce rate"

    async def produced_bytes(self, ctx: RequestContext) -> int:
        """The record bytes of the request's topics that match ``topic`` (no record decoded)."""
        total = 0
        for topic in ctx.request.topic_data:
            if not self.every_topic:
                name = getattr(topic, "name", None)
                if name is None:  # Produce v13+ names topics by id
                    name = ctx.topic_names.name(topic.topic_id) or await ctx.topic_names.resolve(topic.topic_id)
                if not self.topics(str(name)):
                    continue
            for part in topic.partition_data:
                if part.records is not None:
                    total += len(part.records)
        return total

    @hookimpl
    async def kanal_request(self, ctx: RequestContext) -> RequestResult:
        size = await self.produced_bytes(ctx)
        if not size:
            return None
        connection = ctx.connection
        key = self.key_of(connection)
        if self.enforce:
            await self.hold(key)
        debt = self.buckets.take(key, size)
        self.counted.inc(size)
        shared = self.shared
        if shared.active:
            shared.add(key, size, debt > 0)
        if debt <= 0:
            return None
        self.over(connection, key, debt)
        if self.enforce and ctx.request.acks != 0:
            ctx.notes[_THROTTLE] = self.throttle_ms(debt)
            ctx.want_response()
        return None

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> ResponseResult:
        throttle_ms = ctx.notes.get(_THROTTLE)
        if throttle_ms:
            ctx.response = with_throttle(ctx.response, throttle_ms)
        return None


class ConsumerRateLimiting(_ByteRateLimit):
    """At most ``maximumBytesPerSecond`` bytes of records fetched per second: a consumer reading
    a topic from the start at full speed saturates the brokers' disks and network for everyone.

    The bytes are the record sets of the Fetch response (their batch sizes, from the batch
    headers), known only when the response comes back: that response goes out as it is, and the
    bucket's next Fetch is held until the debt is paid; the response to a held Fetch carries the
    throttle time its own bytes leave (how long until the bucket is back at zero).
    """

    plugin_name: ClassVar[str] = "consumer-rate-limiting"
    description: ClassVar[str] = "Limits the bytes per second consumers fetch (a broker-style quota)."
    config_type: ClassVar[type[Any] | None] = ByteRateConfig
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.FETCH})
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.FETCH})
    what: ClassVar[str] = "Fetch rate"

    @hookimpl
    async def kanal_request(self, ctx: RequestContext) -> RequestResult:
        if self.enforce and await self.hold(self.key_of(ctx.connection)) > 0:
            ctx.notes[_HELD] = True
            ctx.want_response()
        return None

    @hookimpl
    def kanal_fetch_records(self, ctx: RecordsContext) -> RecordsResult:
        if not self.every_topic and not self.topics(ctx.topic):
            return None
        records = ctx.records
        size = len(records.tail)
        for batch in records.batches:
            size += batch.size
        if not size:
            return None
        key = self.key_of(ctx.connection)
        debt = self.buckets.take(key, size)
        self.counted.inc(size)
        shared = self.shared
        if shared.active:
            shared.add(key, size, debt > 0)
        if debt > 0:
            self.over(ctx.connection, key, debt)
        return None

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> ResponseResult:
        if ctx.notes.get(_HELD):
            debt = self.buckets.debt(self.key_of(ctx.connection))
            if debt > 0:
                ctx.response = with_throttle(ctx.response, self.throttle_ms(debt))
        return None


INTERCEPTORS: list[type[Interceptor]] = [ProducerRateLimiting, ConsumerRateLimiting]
