"""Chaos by delay: ``chaos-latency``, ``chaos-slow-broker`` and ``chaos-slow-producers-consumers``.

The request hook sleeps (``trio.sleep``: only this client connection waits, never the gateway)
before the request goes on to the broker, so its response reaches the client at least that much
later. A connection's requests stay in order: the next one is read once the delayed one went on.

Every request hook call has the core's deadline (``GATEWAY_HOOK_TIMEOUT_MS``, 10 s by default): a
delay longer than that closes the client's connection, so keep latencies below it.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec
import trio

from kanal.api import (
    ApiKey,
    GatewayServices,
    InterceptorConfigError,
    RequestContext,
    RequestResult,
    api_name,
    hookimpl,
)
from kanal_safeguards.base import TopicMatcher
from kanal_safeguards.chaos.common import ChaosConfig, ChaosInterceptor, Percent, request_topics

__all__ = [
    "Latency",
    "LatencyConfig",
    "SlowBroker",
    "SlowBrokerConfig",
    "SlowProducersConsumers",
    "SlowProducersConsumersConfig",
]

Millis = Annotated[int, msgspec.Meta(ge=0, description="Milliseconds")]


class LatencyConfig(ChaosConfig, kw_only=True):
    """What operators write under ``config:`` (camelCase keys)."""

    applied_percentage: Percent
    latency_ms: Millis


class SlowBrokerConfig(ChaosConfig, kw_only=True):
    """What operators write under ``config:`` (camelCase keys)."""

    rate_in_percent: Percent
    min_latency_ms: Millis
    max_latency_ms: Millis


class SlowProducersConsumersConfig(SlowBrokerConfig, kw_only=True):
    """What operators write under ``config:`` (camelCase keys)."""

    topic: str = ".*"


class Latency(ChaosInterceptor):
    """Delays ``appliedPercentage`` % of all requests by ``latencyMs``."""

    plugin_name: ClassVar[str] = "chaos-latency"
    description: ClassVar[str] = "Chaos (test environments): delays requests by a fixed latency."
    config_type: ClassVar[type[LatencyConfig]] = LatencyConfig
    # Every request: this decodes every request of the connections in scope (a test-environment cost).
    request_api_keys: ClassVar[frozenset[int] | None] = None
    config: LatencyConfig

    @hookimpl
    async def kanal_request(self, ctx: RequestContext) -> RequestResult:
        if self.chance(self.config.applied_percentage):
            self.injected(ctx.connection, api=api_name(ctx.api_key), latencyMs=self.config.latency_ms)
            await trio.sleep(self.config.latency_ms / 1000)
        return None


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
