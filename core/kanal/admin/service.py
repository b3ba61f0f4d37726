"""Wiring the admin API and the resource store into a gateway as companion services."""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import TYPE_CHECKING

import trio

from kanal.admin.store import LogBackend, ResourceStore
from kanal.api.resources import KindRegistry, ResourceKind
from kanal.config.users import EXAMPLE, USERS_ENV
from kanal.net.state_log import CompactedLog
from kanal.pipeline.registry import PluginError

if TYPE_CHECKING:
    from kanal.admin.app import AdminApi
    from kanal.admin.host import GatewayHost

log = logging.getLogger(__name__)


def resources_topic(gateway: GatewayHost) -> str:
    settings = gateway.settings
    return settings.resources_topic or f"_kanal_{settings.cluster_id}_resources"


def collect_kinds(gateway: GatewayHost) -> KindRegistry:
    """The core's kinds (Interceptor, GatewayServiceAccount, GatewayScramCredential, GatewayGroup,
    VirtualCluster, AliasTopic) and every kind
    the plugins contribute (``kanal_admin_resources``)."""
    from kanal.admin.alias_topics import alias_topic_kind
    from kanal.admin.credentials import scram_credential_kind
    from kanal.admin.groups import group_kind
    from kanal.admin.identity import service_account_kind
    from kanal.admin.interceptors import interceptor_kind
    from kanal.admin.virtual_clusters import virtual_cluster_kind

    kinds = KindRegistry()
    kinds.add(interceptor_kind(gateway))
    kinds.add(service_account_kind(gateway.service_accounts))
    kinds.add(scram_credential_kind(gateway))
    kinds.add(group_kind(gateway.groups))
    kinds.add(virtual_cluster_kind(gateway))
    kinds.add(alias_topic_kind(gateway))
    for plugin_name, contributed in gateway.registry.call_each("kanal_admin_resources", gateway.services_for):
        for kind in contributed or ():
            if not isinstance(kind, ResourceKind):
                raise PluginError(f"plugin {plugin_name}: kanal_admin_resources returned {kind!r}, not a ResourceKind")
            try:
                kinds.add(kind)
            except ValueError as exc:
                raise PluginError(f"plugin {plugin_name}: {exc}") from exc
    return kinds


def build_admin(gateway: GatewayHost, writer: LogBackend | None = None, reader: LogBackend | None = None) -> AdminApi:
    """The admin API of a gateway (store, kinds, app); the Kafka state topic unless logs are given."""
    from kanal.admin.app import AdminApi, create_app
    from kanal.admin.metrics import StateCollector

    settings = gateway.settings
    kinds = collect_kinds(gateway)
    if writer is None:
        topic = resources_topic(gateway)
        timeout = settings.upstream_connect_timeout_ms / 1000
        writer = CompactedLog(topic, settings.upstream, timeout, settings.state_replication_factor)
        reader = CompactedLog(topic, settings.upstream, timeout, settings.state_replication_factor)
    store = ResourceStore(kinds, writer, reader)
    api = AdminApi(gateway, store, kinds, tuple(settings.admin_api_users))

    def plugin_routes(admin: AdminApi) -> None:
        gateway.registry.call_each("kanal_admin_routes", gateway.services_for, admin=admin)

    create_app(api, [plugin_routes])
    _add_console(api, gateway)
    gateway.metrics.registry.register(StateCollector(store, gateway.pipeline))
    return api


def _add_console(api: AdminApi, gateway: GatewayHost) -> None:
    """The web console on the same app: the core's pages, then the plugins' (kanal_console_pages)."""
    from kanal.admin.console.app import Console
    from kanal.admin.console.gateway_pages import add_gateway_pages
    from kanal.admin.console.identity_pages import add_identity_pages
    from kanal.admin.console.metrics_history import MetricsHistory
    from kanal.admin.console.topics_page import add_topic_pages

    console = Console(api)
    history = MetricsHistory(gateway.metrics.registry)
    api.background.append(history.run)
    add_gateway_pages(console, gateway, history, time.time())
    client = gateway.services_for("console")
    add_topic_pages(console, lambda: client.kafka, console.record_columns, console.value_decoders)
    add_identity_pages(console, gateway)
    gateway.registry.call_each("kanal_console_pages", gateway.services_for, console=console)


async def _serve_state(api: AdminApi, gateway: GatewayHost, *, task_status: trio.TaskStatus[None]) -> None:
    try:
        await api.store.run(task_status=task_status)
    finally:
        with trio.CancelScope(shield=True):
            await api.store.writer.aclose()
            await api.store.reader.aclose()


async def _serve_http(api: AdminApi, gateway: GatewayHost, *, task_status: trio.TaskStatus[None]) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    settings = gateway.settings
    host = settings.bind_host
    config = Config()
    config.bind = [f"[{host}]:{settings.http_port}" if ":" in host else f"{host}:{settings.http_port}"]
    config.accesslog = None
    http_log = logging.getLogger("kanal.admin.http")
    http_log.setLevel(logging.WARNING)  # Hypercorn's "Running on ..." line; ours says it better
    config.errorlog = http_log
    config.graceful_timeout = 1.0
    async with trio.open_nursery() as nursery:
        try:
            binds = await nursery.start(partial(serve, api.app, config))
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot serve the admin API on {config.bind[0]}: {exc.strerror} (set GATEWAY_HTTP_PORT)"
            ) from exc
        log.info(
            "admin API on %s%s",
            ", ".join(binds),
            "" if api.users else f" (disabled: no users; set {USERS_ENV}); health and metrics only",
        )
        task_status.started()


def install(gateway: GatewayHost) -> AdminApi:
    """Adds the admin HTTP API and the resource store to the gateway's companion services."""
    api = build_admin(gateway)
    if not api.users:
        log.warning(
            "the admin API is not started: no users are configured. Set %s to a YAML/JSON list of users, "
            "e.g. %s='%s' (users without admin: true are read-only). Health and metrics are still served.",
            USERS_ENV,
            USERS_ENV,
            EXAMPLE,
        )
    gateway.services.append(partial(_serve_http, api, gateway))
    gateway.services.append(partial(_serve_state, api, gateway))
    gateway.services.extend(api.background)
    return api


__all__ = ["build_admin", "collect_kinds", "install"]
