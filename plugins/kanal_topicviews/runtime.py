"""What the plugin's interceptor needs beyond its (JSON) config, kept in the plugin's ``services.shared``.

Interceptor configs must stay plain JSON (the admin API shows them), so the TopicView kind builds the
runtime (schema registry decoders, the helper process, the read-ahead flag) once per gateway and
stores it in ``services.shared``, which the plugin's interceptors read: each gateway (and each test's
gateway) has its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import trio

from kanal.api import GatewayServices

from .connections import PREFIX, ValueDecoders
from .pool import HelperPool

__all__ = ["RUNTIME", "Runtime", "close_at_shutdown", "ensure_runtime", "shared_runtime"]

RUNTIME: Final = "runtime"  # the key of the runtime in ``services.shared``
_CLOSER: Final = "runtime.closer"  # the helper process a shutdown task closes
_DECODERS_CLOSER: Final = "runtime.decoders_closer"  # the registry clients a shutdown task closes


@dataclass(frozen=True)
class Runtime:
    decoders: ValueDecoders | None
    read_ahead: bool = True
    pool: HelperPool | None = None


def shared_runtime(services: GatewayServices) -> Runtime | None:
    runtime = services.shared.get(RUNTIME)
    return runtime if isinstance(runtime, Runtime) else None


def ensure_runtime(services: GatewayServices, decoders: ValueDecoders | None = None) -> Runtime:
    """The gateway's runtime, built on first use (decoders from ``GATEWAY_EXTERNAL_CONNECTION_*``
    unless given). Given ``decoders`` replace those of an existing runtime; its helper process stays."""
    existing = shared_runtime(services)
    if existing is not None and decoders is None:
        return existing
    if decoders is None:
        decoders = ValueDecoders.from_env(services.settings(PREFIX))
    if existing is not None:
        runtime = Runtime(decoders, existing.read_ahead, existing.pool)
    else:
        pool = HelperPool(services.start_soon) if services.feature("topic_views_helper_process", True) else None
        runtime = Runtime(decoders, services.feature("topic_views_read_ahead", True), pool)
    services.shared[RUNTIME] = runtime
    return runtime


def close_at_shutdown(services: GatewayServices) -> None:
    """Closes the runtime's helper process and its schema registry clients' connections when the
    gateway shuts down (once: the interceptors share them). There is no plugin shutdown hook: background
    tasks cancelled at shutdown close them."""
    runtime = shared_runtime(services)
    if runtime is not None and runtime.pool is not None and services.shared.get(_CLOSER) is not runtime.pool:
        services.shared[_CLOSER] = runtime.pool
        services.start_soon(_close_pool, runtime.pool, name="topic views helper process")
    decoders = runtime.decoders if runtime is not None else None
    if decoders is not None and decoders.names() and services.shared.get(_DECODERS_CLOSER) is not decoders:
        services.shared[_DECODERS_CLOSER] = decoders
        services.start_soon(_close_decoders, decoders, name="topic views schema registry clients")


async def _close_pool(pool: HelperPool) -> None:
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(pool.close)


async def _close_decoders(decoders: ValueDecoders) -> None:
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            await decoders.aclose()
