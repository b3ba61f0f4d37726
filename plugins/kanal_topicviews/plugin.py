"""The topic-views plugin object (entry point ``topic-views`` of the ``kanal.plugins`` group).

* ``kanal_interceptor_types``: the ``topic-views`` interceptor type, which the TopicView resources
  install in every node's pipeline (see :mod:`kanal_topicviews.interceptor`).
* ``kanal_admin_resources``: the ``TopicView`` kind, served at ``/gateway/v2/topic-view`` (see
  :mod:`kanal_topicviews.resource`); its schema registry connections are read from the gateway's
  settings at startup (``GATEWAY_EXTERNAL_CONNECTION_<NAME>_...``, see
  :mod:`kanal_topicviews.connections`), and the helper process it may start is closed at shutdown.
* ``kanal_console_pages``: the console's topic-view pages (list, edit, preview; :mod:`kanal_topicviews.console`).
* ``kanal_settings``: the family ``GATEWAY_EXTERNAL_CONNECTION_*``, checked at startup by
  :func:`~kanal_topicviews.connections.check_connections`, and the plugin's feature flags.
"""

from __future__ import annotations

from kanal.api import ConsolePages, GatewayServices, Interceptor, ResourceKind, SettingsFamily, hookimpl

from . import console as console_pages
from .connections import PREFIX, check_connections
from .interceptor import TopicViewsInterceptor
from .resource import topic_view_kind
from .runtime import close_at_shutdown

__all__ = ["kanal_admin_resources", "kanal_console_pages", "kanal_interceptor_types", "kanal_settings"]


@hookimpl
def kanal_interceptor_types() -> list[type[Interceptor]]:
    return [TopicViewsInterceptor]


@hookimpl
def kanal_admin_resources(services: GatewayServices) -> list[ResourceKind]:
    kind = topic_view_kind(services)
    close_at_shutdown(services)
    return [kind]


@hookimpl
def kanal_console_pages(console: ConsolePages, services: GatewayServices) -> None:
    console_pages.add_pages(console, services)


@hookimpl
def kanal_settings() -> list[str | SettingsFamily]:
    """The schema registry connections views decode through (checked at startup: a misspelt property
    or an unknown TYPE stops the gateway unless another plugin reads it), and the two helpers' switches."""
    return [
        SettingsFamily(PREFIX, check_connections),
        "GATEWAY_FEATURE_FLAGS_TOPIC_VIEWS_HELPER_PROCESS",
        "GATEWAY_FEATURE_FLAGS_TOPIC_VIEWS_READ_AHEAD",
    ]
