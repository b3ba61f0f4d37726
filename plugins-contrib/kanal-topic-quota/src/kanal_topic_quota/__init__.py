"""kanal-topic-quota: a Kanal plugin, packaged as any third party would package one.

Kanal loads this module through the ``kanal.plugins`` entry point declared in ``pyproject.toml``
and asks it, once at startup, which interceptor types it provides. The plugin imports nothing of
Kanal but ``kanal.api``: that is enough to send requests upstream, keep per-request notes, have
its config validated by the core, publish metrics and release them when it is closed.
"""

from __future__ import annotations

from kanal.api import Interceptor, hookimpl

from kanal_topic_quota.interceptor import CREATED_METRIC, TopicQuota, TopicQuotaConfig

__all__ = ["CREATED_METRIC", "TopicQuota", "TopicQuotaConfig", "kanal_interceptor_types"]
__version__ = "0.1.0"


@hookimpl
def kanal_interceptor_types() -> list[type[Interceptor]]:
    """The interceptor types of this plugin: ``topic-quota``."""
    return [TopicQuota]
