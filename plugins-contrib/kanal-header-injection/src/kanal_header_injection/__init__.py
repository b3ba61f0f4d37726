"""kanal-header-injection: a Kanal plugin, packaged as any third party would package one.

Kanal loads this module through the ``kanal.plugins`` entry point declared in ``pyproject.toml``
and asks it, once at startup, which interceptor types it provides.
"""

from __future__ import annotations

from kanal.api import Interceptor, hookimpl

from kanal_header_injection.interceptor import TEMPLATE_VARIABLES, HeaderInjection, HeaderInjectionConfig

__all__ = ["TEMPLATE_VARIABLES", "HeaderInjection", "HeaderInjectionConfig", "kanal_interceptor_types"]
__version__ = "0.1.0"


@hookimpl
def kanal_interceptor_types() -> list[type[Interceptor]]:
    """The interceptor types of this plugin: ``contrib-header-injection``."""
    return [HeaderInjection]
