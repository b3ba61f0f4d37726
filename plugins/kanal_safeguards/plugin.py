"""The ``safeguards`` plugin object (entry point ``safeguards = "kanal_safeguards.plugin"``): the
safeguard and traffic-control interceptor types (public plugin API only)."""

from __future__ import annotations

from kanal.api import Interceptor, hookimpl

from . import cache, chaos, groups, large_messages, rate_limits, records_policies, topics, usage
from .cache import SESSIONS_VARIABLE

__all__ = ["kanal_interceptor_types", "kanal_settings"]


@hookimpl
def kanal_interceptor_types() -> list[type[Interceptor]]:
    return [
        *records_policies.INTERCEPTORS,
        *topics.INTERCEPTORS,
        *groups.INTERCEPTORS,
        *rate_limits.INTERCEPTORS,
        *cache.INTERCEPTORS,
        *large_messages.INTERCEPTORS,
        *usage.INTERCEPTORS,
        *chaos.INTERCEPTORS,
    ]


@hookimpl
def kanal_settings() -> list[str]:
    """The feature flag the cache refuses to run with (spec 03's known issue), so that operators
    can set it (to false) with the plugin installed."""
    return [SESSIONS_VARIABLE]
