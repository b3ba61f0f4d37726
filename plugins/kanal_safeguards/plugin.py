"""The ``safeguards`` plugin object (entry point ``safeguards = "kanal_safeguards.plugin"``): the
safeguard and traffic-control interceptor types (public plugin API only)."""

from __future__ import annotations

from kanal.api import Interceptor, hookimpl

from . import groups, records_policies, topics

__all__ = ["kanal_interceptor_types"]


@hookimpl
def kanal_interceptor_types() -> list[type[Interceptor]]:
    return [*records_policies.INTERCEPTORS, *topics.INTERCEPTORS, *groups.INTERCEPTORS]
