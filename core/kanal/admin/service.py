"""Wiring the admin API and the resource store into a gateway as companion services."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import MutableMapping
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from kanal.admin.kafka_log import CompactedLog
from kanal.admin.resources import KindRegistry, ResourceKind
from kanal.admin.store import LogBackend, ResourceStore
from kanal.admin.users import EXAMPLE, USERS_ENV
from kanal.pipeline.registry import PluginError

if TYPE_CHECKING:
    from kanal.admin.app import AdminApi
    from kanal.gateway import Gateway

log = logging.getLogger(__name__)


def resources_topic(gateway: Gateway) -> str:
    settings = gateway.settings
    return settings.resources_topic or f"_kanal_{settings.cluster_id}_resources"


def collect_kinds(gateway: Gateway) -> KindRegistry:
    """The Interceptor kind and every kind the plugins contribute (``kanal_admin_resources``)."""
    from kanal.admin.interceptors import interceptor_kind

    kinds = KindRegistry()
    kinds.add(interceptor_kind(gateway))
    manager = gateway.registry.manager
    for impl in manager.hook.kanal_admin_resources.get_hookimpls():
        plugin_name = manager.get_name(impl.plugin) or "?"
        contributed: Any = impl.function(**{name: {"gateway": gateway}[name] for name in impl.argnames})
        for kind in contributed or ():
            if not isinstance(kind, ResourceKind):
                raise PluginError(f"plugin {plugin_name}: kanal_admin_resources returned {kind!r}, not a ResourceKind")
            try:
                kinds.add(kind)
            except ValueError as exc:
                raise PluginError(f"plugin {plugin_name}: {exc}") from exc
    return kinds


def build_admin(gateway: Gateway, writer: LogBackend | None = None, reader: LogBackend | None = None) -> AdminApi:
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
    manager = gateway.registry.manager

    def plugin_routes(admin: AdminApi) -> None:
        manager.hook.kanal_admin_routes(admin=admin)

    create_app(api, [plugin_routes])
    gateway.metrics.registry.register(StateCollector(store, gateway.pipeline))
    return api


async def _serve_state(api: AdminApi, gateway: Gateway, *, task_status: trio.TaskStatus[None]) -> None:
    try:
        await api.store.run(task_status=task_status)
    finally:
        with trio.CancelScope(shield=True):
            await api.store.writer.aclose()
            await api.store.reader.aclose()


async def _serve_http(api: AdminApi, gateway: Gateway, *, task_status: trio.TaskStatus[None]) -> None:
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


def install(gateway: Gateway) -> AdminApi:
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
    gateway.services.append(partial(_serve_http, api))
    gateway.services.append(partial(_serve_state, api))
    return api


def dev_admin_user(env: MutableMapping[str, str]) -> str | None:
    """For ``kanal dev``: sets a generated admin user unless ``GATEWAY_ADMIN_API_USERS`` is set, and
    returns the line that tells it."""
    if env.get(USERS_ENV):
        return None
    password = secrets.token_urlsafe(12)
    env[USERS_ENV] = json.dumps([{"username": "admin", "password": password, "admin": True}])
    return (
        f"Kanal dev: admin API user 'admin', password '{password}' "
        f"(export KANAL_USER=admin KANAL_PASSWORD={password}); set {USERS_ENV} to choose your own"
    )


def dev_http_port(env: MutableMapping[str, str]) -> None:
    """For ``kanal dev``: 8888 when free, else a free port (unless ``GATEWAY_HTTP_PORT`` is set)."""
    if env.get("GATEWAY_HTTP_PORT"):
        return
    import socket

    from kanal.embedded.tansu import free_port

    try:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 8888))
        env["GATEWAY_HTTP_PORT"] = "8888"
    except OSError:
        env["GATEWAY_HTTP_PORT"] = str(free_port())


__all__ = ["build_admin", "collect_kinds", "dev_admin_user", "dev_http_port", "install"]
