"""A gateway running in this test process (in a thread), with plugins the test defines.

Plugins in tests register directly with the registry instead of through entry points, so a test
can exercise hooks with real clients and a real broker without packaging anything.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import trio

from kanal.api.interceptor import InterceptorSpec
from kanal.config.settings import KnownSettings, build_settings
from kanal.embedded import SHORT_MEMBERSHIP_TIMINGS, TansuBroker, free_port_block
from kanal.gateway import Gateway
from kanal.pipeline.registry import PluginRegistry

T = TypeVar("T")


@contextmanager
def inprocess_gateway(
    broker: TansuBroker,
    plugins: Mapping[str, Any] = {},
    interceptors: Sequence[InterceptorSpec] = (),
    env: Mapping[str, str] = {},
) -> Iterator[Gateway]:
    registry = PluginRegistry()
    for name, plugin in plugins.items():
        registry.register(plugin, name)
    environ = {
        **SHORT_MEMBERSHIP_TIMINGS,  # (Tansu holds a JoinGroup for half the session timeout)
        "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
        "GATEWAY_BIND_HOST": "127.0.0.1",
        "GATEWAY_ADVERTISED_HOST": "127.0.0.1",
        "GATEWAY_PORT_START": str(free_port_block(3)),
        "GATEWAY_PORT_COUNT": "3",
        "GATEWAY_MIN_BROKERID": str(broker.node_id),
        # a fleet of its own: gateways sharing a group spread their clients over each other
        "GATEWAY_GROUP_ID": f"kanal-inprocess-{uuid.uuid4().hex[:12]}",
        **env,
    }
    settings = build_settings(environ, known=KnownSettings(registry.declared_settings()))
    gateway = Gateway(settings, registry, environ)  # (what the plugins' settings read: ``env`` alone)
    gateway.pipeline.configure(interceptors)
    ready = threading.Event()
    stop = threading.Event()
    token: list[trio.lowlevel.TrioToken] = []
    failure: list[BaseException] = []

    async def main() -> None:
        token.append(trio.lowlevel.current_trio_token())
        async with trio.open_nursery() as nursery:
            await nursery.start(gateway.run)
            ready.set()
            await trio.to_thread.run_sync(stop.wait)
            gateway.shutdown()

    def target() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # surfaced to the test below
            failure.append(exc)
            ready.set()

    thread = threading.Thread(target=target, name="kanal-gateway", daemon=True)
    thread.start()
    assert ready.wait(30), "gateway did not start"
    if failure:
        raise failure[0]
    _TOKENS[id(gateway)] = token[0]
    try:
        yield gateway
    finally:
        _TOKENS.pop(id(gateway), None)
        stop.set()
        thread.join(30)
        assert not thread.is_alive(), "gateway did not stop"
        if failure:
            raise failure[0]


_TOKENS: dict[int, trio.lowlevel.TrioToken] = {}


def in_gateway(gateway: Gateway, fn: Callable[..., T], *args: Any) -> T:
    """Runs ``fn(*args)`` in the gateway's trio thread (as the admin API applies resources there)."""
    return trio.from_thread.run_sync(fn, *args, trio_token=_TOKENS[id(gateway)])


def bootstrap_of(gateway: Gateway) -> str:
    return f"127.0.0.1:{gateway.settings.port_start}"
