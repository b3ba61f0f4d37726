"""The ``data-quality`` plugin object (entry point ``data-quality = "kanal_dataquality.plugin"``).

Public plugin API only:

* ``kanal_interceptor_types``: the ``data-quality`` interceptor type;
* ``kanal_admin_resources``: the DataQualityRule (v1), DataQualityPolicy (v1) and Alert (v3) kinds; their
  ``apply`` compiles the stored resources and installs the interceptor in the pipeline (source
  ``data-quality``) while a policy targets this gateway;
* ``kanal_admin_routes``: rule test, metrics, history, alerts, group-permitted writes;
* ``kanal_gateway_services``: the history publisher and follower, alert delivery, and the observer of
  clusters without a gateway.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import TYPE_CHECKING

import trio

from kanal.pipeline.hookspecs import hookimpl
from kanal.pipeline.interceptor import Interceptor, InterceptorSpec
from kanal_dataquality.interceptor import PLUGIN_NAME, DataQualityInterceptor
from kanal_dataquality.resources import resource_kinds
from kanal_dataquality.runtime import Runtime
from kanal_dataquality.settings import load_settings

if TYPE_CHECKING:
    from kanal.admin.app import AdminApi
    from kanal.admin.resources import ResourceKind
    from kanal.gateway import Gateway, Service

__all__ = ["runtime_for"]

log = logging.getLogger(__name__)

_BY_GATEWAY: weakref.WeakKeyDictionary[Gateway, Runtime] = weakref.WeakKeyDictionary()
SOURCE = "data-quality"


def runtime_for(gateway: Gateway) -> Runtime:
    """The plugin's state for this gateway (created on first use, from the environment)."""
    runtime = _BY_GATEWAY.get(gateway)
    if runtime is None:
        settings = load_settings(os.environ, gateway.settings.cluster_id)
        runtime = Runtime(settings, gateway.settings.cluster_id, gateway.metrics.registry)
        pipeline = gateway.pipeline

        def install(wanted: bool) -> None:
            specs = []
            if wanted:
                specs.append(
                    InterceptorSpec(
                        name=PLUGIN_NAME,
                        plugin=PLUGIN_NAME,
                        priority=settings.priority,
                        config={"runtime": runtime.id},
                    )
                )
            pipeline.configure(specs, source=SOURCE)

        runtime.installer = install
        _BY_GATEWAY[gateway] = runtime
    return runtime


@hookimpl
def kanal_interceptor_types() -> list[type[Interceptor]]:
    return [DataQualityInterceptor]


@hookimpl
def kanal_admin_resources(gateway: Gateway) -> list[ResourceKind]:
    runtime = runtime_for(gateway)
    return resource_kinds(lambda: runtime.checks, runtime.apply)


@hookimpl
def kanal_admin_routes(admin: AdminApi) -> None:
    from kanal_dataquality.routes import add_routes

    add_routes(admin, runtime_for(admin.gateway))


@hookimpl
def kanal_gateway_services(gateway: Gateway) -> list[Service]:
    runtime = runtime_for(gateway)
    runtime.reporter.connected = True  # the publisher below serves the reporter's queue from now on
    firings = runtime.open_firing_channel()

    async def data_quality(gateway: Gateway, *, task_status: trio.TaskStatus[None]) -> None:
        from kanal_dataquality.services import run_services

        await run_services(runtime, gateway, firings, task_status=task_status)

    return [data_quality]
