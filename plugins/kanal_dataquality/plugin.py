"""The ``data-quality`` plugin object (entry point ``data-quality = "kanal_dataquality.plugin"``).

Public plugin API only (``kanal.api``):

* ``kanal_interceptor_types``: the ``data-quality`` interceptor type;
* ``kanal_admin_resources``: the DataQualityRule (v1), DataQualityPolicy (v1) and Alert (v3) kinds; their
  ``apply`` compiles the stored resources and installs the interceptor (``services.install``) while a
  policy targets this gateway;
* ``kanal_admin_routes``: rule test, metrics, history, alerts, group-permitted writes, backtests;
* ``kanal_console_pages``: the console's data-quality pages (policies, rules, alerts, backtests);
* ``kanal_gateway_services``: the history publisher and follower, alert delivery, and the observer of
  clusters without a gateway (on the fleet's leader);
* ``kanal_cli_commands``: ``kanal test-rule`` and ``kanal dq backtest``.

The gateway's :class:`~kanal_dataquality.runtime.Runtime` is built by the first of these hooks to run,
from the plugin's services, and kept in ``services.shared`` (one per plugin per gateway), where the
interceptor finds it.
"""

from __future__ import annotations

import argparse

import trio

from kanal.api import (
    AdminRoutes,
    CliContext,
    ConsolePages,
    GatewayServices,
    Interceptor,
    InterceptorSpec,
    ResourceKind,
    Service,
    hookimpl,
)
from kanal_dataquality.interceptor import PLUGIN_NAME, DataQualityInterceptor
from kanal_dataquality.resources import resource_kinds
from kanal_dataquality.runtime import RUNTIME, Runtime
from kanal_dataquality.settings import load_settings

__all__ = ["runtime_of"]

# The environment variables load_settings reads: its own, and the registry's shared ones.
_SETTING_PREFIXES = ("SCHEMA_REGISTRY_", "DATA_QUALITY_")


def runtime_of(services: GatewayServices) -> Runtime:
    """The plugin's state for this gateway: built on first use from the gateway's settings, then kept
    in ``services.shared`` (raises ``ConfigError`` naming a bad ``DATA_QUALITY_*`` variable)."""
    runtime = services.shared.get(RUNTIME)
    if isinstance(runtime, Runtime):
        return runtime
    env = {key: value for prefix in _SETTING_PREFIXES for key, value in services.settings(prefix).items()}
    settings = load_settings(env, services.cluster_id)
    runtime = Runtime(settings, services.cluster_id, services.metrics, services.start_soon)

    def install(wanted: bool) -> None:
        specs = []
        if wanted:
            specs.append(
                InterceptorSpec(
                    name=PLUGIN_NAME, plugin=PLUGIN_NAME, priority=settings.priority, config={"managed": True}
                )
            )
        services.install(specs)

    runtime.installer = install
    services.shared[RUNTIME] = runtime
    return runtime


@hookimpl
def kanal_interceptor_types() -> list[type[Interceptor]]:
    return [DataQualityInterceptor]


@hookimpl
def kanal_admin_resources(services: GatewayServices) -> list[ResourceKind]:
    runtime = runtime_of(services)
    return resource_kinds(lambda: runtime.checks, runtime.apply)


@hookimpl
def kanal_admin_routes(admin: AdminRoutes, services: GatewayServices) -> None:
    from kanal_dataquality.backtest_routes import add_backtest_routes
    from kanal_dataquality.backtest_service import Backtests
    from kanal_dataquality.routes import add_routes

    runtime = runtime_of(services)
    add_routes(admin, runtime, services.fleet)
    # kept on the runtime: the console's pages (added after the admin routes) show the same jobs
    runtime.backtests = Backtests(admin.store, admin.kinds, runtime, services)
    add_backtest_routes(admin, runtime.backtests)


@hookimpl
def kanal_console_pages(console: ConsolePages, services: GatewayServices) -> None:
    from kanal_dataquality.backtest_service import Backtests
    from kanal_dataquality.console import add_pages

    runtime = runtime_of(services)
    if runtime.backtests is None:  # the admin routes build it first; a console without them still works
        runtime.backtests = Backtests(console.store, console.kinds, runtime, services)
    add_pages(console, runtime, runtime.backtests)


@hookimpl
def kanal_gateway_services(services: GatewayServices) -> list[Service]:
    runtime = runtime_of(services)
    runtime.reporter.connected = True  # the publisher below serves the reporter's queue from now on
    firings = runtime.open_firing_channel()

    async def data_quality(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        from kanal_dataquality.services import run_services

        await run_services(runtime, services, firings, task_status=task_status)

    return [data_quality]


@hookimpl
def kanal_cli_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser], cli: CliContext) -> None:
    from kanal_dataquality.cli import add_commands

    add_commands(commands, cli)
