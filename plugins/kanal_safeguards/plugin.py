"""The ``safeguards`` plugin object (entry point ``safeguards = "kanal_safeguards.plugin"``): the
safeguard and traffic-control interceptor types (public plugin API only), by area: ``policies``,
``limits``, ``caching``, ``claim_check``, ``usage`` and ``chaos``; and, with ``kanal_console_pages``, the
console's traffic-control pages (:mod:`kanal_safeguards.console`)."""

from __future__ import annotations

from kanal.api import ConsolePages, GatewayServices, Interceptor, hookimpl
from kanal_safeguards import caching, chaos, claim_check, limits, policies, usage
from kanal_safeguards.caching.cache import SESSIONS_VARIABLE
from kanal_safeguards.console import add_pages
from kanal_safeguards.limits.fleet_usage import TOPIC_SETTING

__all__ = ["kanal_console_pages", "kanal_interceptor_types", "kanal_settings"]


@hookimpl
def kanal_interceptor_types() -> list[type[Interceptor]]:
    return [
        *policies.INTERCEPTORS,
        *limits.INTERCEPTORS,
        *caching.INTERCEPTORS,
        *claim_check.INTERCEPTORS,
        *usage.INTERCEPTORS,
        *chaos.INTERCEPTORS,
    ]


@hookimpl
def kanal_settings() -> list[str]:
    """The feature flag the cache refuses to run with (spec 03's known issue), so that operators
    can set it (to false) with the plugin installed; the topic of the fleet-wide limits' usage."""
    return [SESSIONS_VARIABLE, TOPIC_SETTING]


@hookimpl
def kanal_console_pages(console: ConsolePages, services: GatewayServices) -> None:
    """Traffic control (``/console/traffic``) and chargeback usage (``/console/traffic/usage``)."""
    add_pages(console, services)
