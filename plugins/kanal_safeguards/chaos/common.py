"""What the chaos interceptors share: the config keys every one has (``seed``), the percentages,
the seeded randomness, the injection counter and the one audit event of a first injection.

Chaos interceptors exist to test how client applications cope with a misbehaving cluster; they are
for test environments. Their randomness comes from a :class:`random.Random` per interceptor, seeded
with ``seed`` when the config has one (tests do), so a run can be replayed.
"""

from __future__ import annotations

import collections
import enum
import random
from typing import Annotated, Any, ClassVar

import msgspec
from prometheus_client import CollectorRegistry, Counter

from kanal.api import ApiKey, Connection, GatewayServices, RequestContext
from kanal_safeguards.base import SafeguardInterceptor
from kanal_safeguards.decisions import AUDIT_TYPE

__all__ = [
    "INJECTIONS_METRIC",
    "ChaosConfig",
    "ChaosInterceptor",
    "Percent",
    "Target",
    "request_topics",
]

#: The counter of injections, by interceptor type (Prometheus adds ``_total``).
INJECTIONS_METRIC = "kanal_chaos_injections"
_SHARED_KEY = "chaos.injections"

Percent = Annotated[float, msgspec.Meta(ge=0, le=100, description="A percentage, 0 to 100")]


class Target(enum.Enum):
    """Where a records chaos acts: on what producers write, or only on what consumers fetch."""

    PRODUCE = "PRODUCE"
    CONSUME = "CONSUME"


class ChaosConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """The keys every chaos config has (camelCase keys; subclasses add theirs)."""

    seed: int | None = None  # for tests: the same seed, the same injections


class _Injections:
    """``kanal_chaos_injections_total{plugin=...}``, one counter for every chaos interceptor of a
    gateway, in ``services.shared``: a counter per instance would clash by name in the registry
    (a replacement is built before the instance it replaces is closed). The last instance to close
    unregisters it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.counter = Counter(
            INJECTIONS_METRIC,
            "Faults injected by the chaos interceptors, by interceptor type",
            ["plugin"],
            registry=registry,
        )
        self.users: collections.Counter[str] = collections.Counter()

    def acquire(self, plugin: str) -> Counter:
        self.users[plugin] += 1
        return self.counter.labels(plugin=plugin)

    def release(self, plugin: str) -> bool:
        """True when no chaos interceptor uses the counter any more."""
        self.users[plugin] -= 1
        if self.users[plugin] <= 0:
            del self.users[plugin]
        if self.users:
            return False
        self.registry.unregister(self.counter)
        return True


class ChaosInterceptor(SafeguardInterceptor):
    """Base of the chaos types: seeded randomness, the injection counter, one audit event."""

    plugin_name: ClassVar[str] = ""
    config: Any

    def __init__(self, config: ChaosConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        self.random = random.Random(config.seed)
        shared = services.shared.get(_SHARED_KEY)
        if shared is None:
            shared = services.shared[_SHARED_KEY] = _Injections(services.metrics)
        self._injections: _Injections = shared
        self._counter = shared.acquire(self.plugin_name)
        self._announced = False
        self._closed = False

    def chance(self, percent: float) -> bool:
        """True for ``percent`` % of the calls (never at 0, always at 100)."""
        return percent > 0 and self.random.random() * 100 < percent

    def injected(self, connection: Connection | None, count: int = 1, **context: Any) -> None:
        """Counts ``count`` injections; the first one of this interceptor is also an audit event
        (one per injection would flood the audit log)."""
        self._counter.inc(count)
        if not self._announced:
            self._announced = True
            data = {"plugin": self.plugin_name, "action": "CHAOS", **context}
            data["reasons"] = [f"{self.plugin_name} injects faults (first injection; later ones are only counted)"]
            self.services.audit(AUDIT_TYPE, connection, data)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._injections.release(self.plugin_name):
            self.services.shared.pop(_SHARED_KEY, None)


async def request_topics(ctx: RequestContext) -> list[str]:
    """The topics a Produce or Fetch request names (resolved from topic ids where it has only ids)."""
    entries = ctx.request.topic_data if ctx.api_key == ApiKey.PRODUCE else ctx.request.topics
    names: list[str] = []
    for entry in entries:
        name = getattr(entry, "name", None) or getattr(entry, "topic", None)
        if name is None and getattr(entry, "topic_id", None) is not None:
            name = await ctx.topic_names.resolve(entry.topic_id)
        if name is not None:
            names.append(str(name))
    return names
