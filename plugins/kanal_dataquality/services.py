"""The plugin's background tasks beside the gateway (``kanal_gateway_services``).

* the history publisher: writes violation reports as they come (batched) and counts every flush
  interval to the history topic;
* the history follower: reads the topic from its start and follows it (history, counts, alerts);
* alert delivery: webhook POSTs of the alerts this node fired, and the end of firing windows;
* the observer: consumes the target topics of policies on clusters without a gateway, on the node
  that leads the fleet (:mod:`kanal_dataquality.observe`).

They start with the first DataQualityPolicy this node applies (from the admin API or the state topic
at startup); before that the plugin does not touch the cluster. At shutdown they stop, and the helper
process of the gateway's runtime with them.
"""

from __future__ import annotations

import logging
import time

import trio

from kanal.api import GatewayServices
from kanal_dataquality.alerts import Firing, deliver
from kanal_dataquality.history import follow, publish
from kanal_dataquality.resources import POLICY
from kanal_dataquality.runtime import Runtime

__all__ = ["history_topic", "run_services"]

log = logging.getLogger(__name__)


def history_topic(runtime: Runtime) -> str:
    return runtime.settings.history_topic or f"_kanal_{runtime.gateway_cluster}_data_quality_violations"


async def _alerts(runtime: Runtime, firings: trio.MemoryReceiveChannel[Firing]) -> None:
    async def ticker() -> None:
        while True:
            runtime.alerts.tick(int(time.time() * 1000))
            await trio.sleep(1.0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        async for firing in firings:
            nursery.start_soon(deliver, firing, runtime.settings.webhook_timeout)


async def run_services(
    runtime: Runtime,
    services: GatewayServices,
    firings: trio.MemoryReceiveChannel[Firing],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    task_status.started()
    try:
        # Nothing touches the cluster until the first policy exists: a gateway that does not use data
        # quality gets no history topic and no follower.
        while not (runtime.manifests[POLICY] or runtime.inline_policies):
            await runtime.engine_changed.wait()
        await _run(runtime, services, firings)
    finally:
        with trio.CancelScope(shield=True):
            await runtime.aclose()


async def _run(runtime: Runtime, services: GatewayServices, firings: trio.MemoryReceiveChannel[Firing]) -> None:
    topic = history_topic(runtime)
    retention_ms = int(runtime.settings.history_retention * 1000)
    # two logs: the follower's long-polling reads never delay the publisher's writes
    reader = services.state_log(topic, compacted=False, retention_ms=retention_ms)
    writer = services.state_log(topic, compacted=False, retention_ms=retention_ms)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow, runtime.history, reader)
            nursery.start_soon(publish, runtime.reporter, writer, runtime.settings.flush_interval)
            nursery.start_soon(_alerts, runtime, firings)
            if runtime.settings.clusters and runtime.settings.observer:
                from kanal_dataquality.observe import observe

                nursery.start_soon(observe, runtime, services, writer)
    finally:
        with trio.CancelScope(shield=True):
            await reader.aclose()
            await writer.aclose()
