"""Chaos by delay: ``chaos-latency``, ``chaos-slow-broker`` and ``chaos-slow-producers-consumers``.

A request is delayed in the request hook, before it goes on to the broker: the broker handles it
late. ``chaos-latency`` can also delay responses (``applyTo``), as the reference's
SimulateLatencyPlugin delays "requests and responses": the response hook holds the broker's answer
before it reaches the client, so the broker has already acted (a Produce is written) while the
client still waits, which is what a client with a short ``request.timeout.ms`` must cope with.
The slow-broker types are described by a random latency only, and delay requests.

Every delay is a ``trio.sleep`` of this client connection's task, never of the gateway; a
connection's requests and responses stay in order: the ones after a delayed one wait behind it.
Every hook call has the core's deadline (``GATEWAY_HOOK_TIMEOUT_MS``, 10 s by default): a delay
longer than that closes the client's connection, so keep latencies below it.
"""

from __future__ import annotations

import enum
from typing import Annotated, ClassVar

import msgspec
import trio

from kanal.api import (
    ApiKey,
    GatewayServices,
    InterceptorConfigError,
    RequestContext,
    RequestResult,
    ResponseContext,
    ResponseResult,
    api_name,
    hookimpl,
)
from kanal_safeguards.base import TopicMatcher
from kanal_safeguards.chaos.common import ChaosConfig, ChaosInterceptor, Percent, request_topics

__all__ = [
    "ApplyTo",
    "Latency",
    "LatencyConfig",
    "SlowBroker",
    "SlowBrokerConfig",
    "SlowProducersConsumers",
    "SlowProducersConsumersConfig",
]

Millis = Annotated[int, msgspec.Meta(ge=0, description="Milliseconds")]


class ApplyTo(enum.Enum):
    """What ``chaos-latency`` delays: the request before the broker has it, or the broker's answer
    before the client has it (the broker has acted), or each of them (drawn apart)."""

    REQUESTS = "REQUESTS"
    RESPONSES = "RESPONSES"
    BOTH = "BOTH"


class LatencyConfig(ChaosConfig, kw_only=True):
    """What operators write under ``config:`` (camelCase keys)."""

    applied_percentage: Percent
    latency_ms: Millis
    apply_to: ApplyTo = ApplyTo.REQUESTS


class SlowBrokerConfig(ChaosConfig, kw_only=True):
    """What operators write under ``config:`` (camelCase keys)."""

    rate_in_percent: Percent
    min_latency_ms: Millis
    max_latency_ms: Millis


class SlowProducersConsumersConfig(SlowBrokerConfig, kw_only=True):
    """What operators write under ``config:`` (camelCase keys)."""

    topic: str = ".*"


_DELAY_RESPONSE = "delay_response"  # the note a request leaves when its response is to be delayed


class Latency(ChaosInterceptor):
    """Delays ``appliedPercentage`` % of all requests, of all responses or of each (``applyTo``)
    by ``latencyMs``."""

    plugin_name: ClassVar[str] = "chaos-latency"
    description: ClassVar[str] = "Chaos (test environments): delays requests or responses by a fixed latency."
    config_type: ClassVar[type[LatencyConfig]] = LatencyConfig
    # Every request: this decodes every request of the connections in scope (a test-environment cost).
    request_api_keys: ClassVar[frozenset[int] | None] = None
    # Every response, but decoded only when the request hook drew a delay for it (a response hook
    # on Fetch still makes the core decode Fetch responses whole for other records hooks: test cost).
    response_api_keys: ClassVar[frozenset[int] | None] = None
    responses_on_demand: ClassVar[bool] = True
    config: LatencyConfig

    def __init__(self, config: LatencyConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        self.delays_requests = config.apply_to is not ApplyTo.RESPONSES
        self.delays_responses = config.apply_to is not ApplyTo.REQUESTS

    @hookimpl
    async def kanal_request(self, ctx: RequestContext) -> RequestResult:
        percent = self.config.applied_percentage
        # Both draws before the sleep: a seeded run draws in the same order whatever the timing.
        delay_request = self.delays_requests and self.chance(percent)
        if self.delays_responses and self.chance(percent):
            ctx.notes[_DELAY_RESPONSE] = True
            ctx.want_response()
        if delay_request:
            await self.delay(ctx, ApplyTo.REQUESTS)
        return None

    @hookimpl
    async def kanal_response(self, ctx: ResponseContext) -> ResponseResult:
        # Counted here, not when drawn: a request with no response (acks=0) delays nothing.
        if ctx.notes.get(_DELAY_RESPONSE):
            await self.delay(ctx, ApplyTo.RESPONSES)
        return None

    async def delay(self, ctx: RequestContext | ResponseContext, what: ApplyTo) -> None:
        """Counts the injection (``delayed``: requests or responses), then sleeps ``latencyMs``."""
        latency = self.config.latency_ms
        self.injected(ctx.connection, api=api_name(ctx.api_key), latencyMs=latency, delayed=what.value)
        await trio.sleep(latency / 1000)


class SlowBroker(ChaosInterceptor):
    """Delays ``rateInPercent`` % of all requests by a random latency within the range."""

    plugin_name: ClassVar[str] = "chaos-slow-broker"
    description: ClassVar[str] = "Chaos (test environments): delays requests by a random latency."
    config_type: ClassVar[type[SlowBrokerConfig]] = SlowBrokerConfig
    request_api_keys: ClassVar[frozenset[int] | None] = None  # every request, as chaos-latency
    config: SlowBrokerConfig

    def __init__(self, config: SlowBrokerConfig, services: GatewayServices) -> None:
        if config.min_latency_ms > config.max_latency_ms:
            raise InterceptorConfigError(
                f"maxLatencyMs: {config.max_latency_ms} is less than minLatencyMs ({config.min_latency_ms})"
            )
        super().__init__(config, services)

    async def delay(self, ctx: RequestContext) -> None:
        """Sleeps a random latency within the range, for ``rateInPercent`` % of the calls."""
        if not self.chance(self.config.rate_in_percent):
            return
        latency = self.random.randint(self.config.min_latency_ms, self.config.max_latency_ms)
        self.injected(ctx.connection, api=api_name(ctx.api_key), latencyMs=latency)
        await trio.sleep(latency / 1000)

    @hookimpl
    async def kanal_request(self, ctx: RequestContext) -> RequestResult:
        await self.delay(ctx)
        return None


class SlowProducersConsumers(SlowBroker):
    """Delays the Produce and Fetch requests naming a topic that matches ``topic``, as a slow
    broker would for those topics only."""

    plugin_name: ClassVar[str] = "chaos-slow-producers-consumers"
    description: ClassVar[str] = "Chaos (test environments): delays Produce and Fetch of some topics."
    config_type: ClassVar[type[SlowBrokerConfig]] = SlowProducersConsumersConfig
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.PRODUCE, ApiKey.FETCH})
    config: SlowProducersConsumersConfig

    def __init__(self, config: SlowProducersConsumersConfig, services: GatewayServices) -> None:
        self._matches = TopicMatcher(config.topic)  # a bad regex fails before the counter is taken
        super().__init__(config, services)

    @hookimpl
    async def kanal_request(self, ctx: RequestContext) -> RequestResult:
        if any(self._matches(topic) for topic in await request_topics(ctx)):
            await self.delay(ctx)
        return None
