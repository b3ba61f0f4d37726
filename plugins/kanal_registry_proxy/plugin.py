"""The ``registry-proxy`` plugin: ``kanal run`` hosts the schema registry proxy when ``SRP_ENABLED=true``.

It uses only the public plugin API: the ``kanal_gateway_services`` hook adds the proxy as a
companion service of the gateway. The proxy then reads its settings from the same environment
variables as ``kanal registry-proxy``, reaches Kafka (topic-acl and reactive modes) with the gateway's
own upstream settings (``KAFKA_*``), and exports its metrics in the gateway's registry as well (so
the admin API's ``/metrics`` shows them). A configuration that cannot work stops ``kanal run`` with a
configuration error naming the variable.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import trio

from kanal.pipeline.hookspecs import hookimpl
from kanal_registry_proxy.settings import load_settings, parse_bool

if TYPE_CHECKING:
    from kanal.gateway import Gateway, Service


@hookimpl
def kanal_gateway_services(gateway: Gateway) -> list[Service]:
    env = os.environ
    if not parse_bool(env.get("SRP_ENABLED") or "false", "SRP_ENABLED"):
        return []
    from kanal_registry_proxy import tracing
    from kanal_registry_proxy.service import ProxyService

    settings = load_settings(env, kafka=gateway.settings.upstream)
    service = ProxyService(settings, registry=gateway.metrics.registry)
    tracing.configure(settings.traces_exporter, settings.service_name)

    async def registry_proxy(gateway: Gateway, *, task_status: trio.TaskStatus[None]) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: service.serve(task_status=task_status))
            task_status.started()

    return [registry_proxy]
