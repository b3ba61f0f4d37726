"""The ``registry-proxy`` plugin: ``kanal run`` hosts the schema registry proxy when ``SRP_ENABLED=true``,
and ``kanal registry-proxy`` / ``kanal license`` run it and manage it from the command line.

It uses only the public plugin API (:mod:`kanal.api`): the ``kanal_gateway_services`` hook adds the
proxy as a companion service of the gateway. The proxy then reads its settings from the gateway's
environment (``services.settings``), reaches Kafka (topic-acl and reactive modes) through the
gateway's own client and state logs (``KAFKA_*``), and exports its metrics in the gateway's registry
as well (so the admin API's ``/metrics`` shows them). A configuration that cannot work stops
``kanal run`` with a configuration error naming the variable. The ``kanal_cli_commands`` hook adds
the commands.
"""

from __future__ import annotations

from typing import Any

import trio

from kanal.api import CliContext, GatewayServices, Service, hookimpl
from kanal_registry_proxy.settings import load_settings, parse_bool


@hookimpl
def kanal_gateway_services(services: GatewayServices) -> list[Service]:
    enabled = services.settings("SRP_").get("SRP_ENABLED") or "false"
    if not parse_bool(enabled, "SRP_ENABLED"):
        return []
    from kanal_registry_proxy import tracing
    from kanal_registry_proxy.service import ProxyService

    # the proxy's variables have several prefixes (VENDOR_, AUTH_, SCHEMA_REGISTRY_, SRP_, OTEL_ ...)
    settings = load_settings(services.settings(""), hosted=True)
    service = ProxyService(
        settings,
        registry=services.metrics,
        kafka=services.kafka,
        state_log=services.state_log,
        identities=services.identities,
        acls=services.acls,
    )
    tracing.configure(settings.traces_exporter, settings.service_name)

    async def registry_proxy(*, task_status: trio.TaskStatus[None]) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: service.serve(task_status=task_status))
            task_status.started()

    return [registry_proxy]


@hookimpl
def kanal_cli_commands(commands: Any, cli: CliContext) -> None:
    from kanal_registry_proxy.cli import add_commands

    add_commands(commands, cli)
