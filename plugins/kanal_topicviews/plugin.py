"""The topic-views plugin object (entry point ``topic-views`` of the ``kanal.plugins`` group).

* ``kanal_interceptor_types``: the ``topic-views`` interceptor type, which the TopicView resources
  install in every node's pipeline (see :mod:`kanal_topicviews.interceptor`).
* ``kanal_admin_resources``: the ``TopicView`` kind, served at ``/gateway/v2/topic-view`` (see
  :mod:`kanal_topicviews.resource`); its schema registry connections are read from the environment
  at startup (``GATEWAY_EXTERNAL_CONNECTION_<NAME>_...``, see :mod:`kanal_topicviews.connections`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from kanal.pipeline.hookspecs import hookimpl
from kanal.pipeline.interceptor import Interceptor

from .connections import ValueDecoders
from .interceptor import TopicViewsInterceptor
from .resource import topic_view_kind

if TYPE_CHECKING:
    from kanal.admin.resources import ResourceKind
    from kanal.gateway import Gateway

__all__ = ["kanal_admin_resources", "kanal_interceptor_types"]


@hookimpl
def kanal_interceptor_types() -> list[type[Interceptor]]:
    return [TopicViewsInterceptor]


@hookimpl
def kanal_admin_resources(gateway: Gateway) -> list[ResourceKind]:
    return [topic_view_kind(gateway, ValueDecoders.from_env(os.environ))]
