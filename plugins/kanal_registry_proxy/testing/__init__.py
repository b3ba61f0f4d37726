"""A small stateful schema registry for tests, pinned to the captured Karapace behaviour.

Usage (from any test or plugin)::

    from kanal_registry_proxy.testing import TestRegistry

    with TestRegistry() as registry:          # a thread of its own, on a free port
        client = SchemaRegistryClient({"url": registry.url})

    registry = TestRegistry(mode="process").start()   # a process of its own (benchmarks)
    ...
    registry.stop()

``TestRegistry(users={"admin": "admin-pass"}, permissions=[{"username": "admin", "operation": "Write",
"resource": ".*"}])`` turns on Karapace's authfile behaviour. ``registry.registry`` is the
:class:`~kanal_registry_proxy.testing.registry.Registry` state (thread mode). ``python -m
kanal_registry_proxy.testing --port 8081`` runs one from a shell.

The behaviour is checked by replaying ``captures/registry/karapace.jsonl`` against it
(``tests/registry_proxy/test_srp_test_registry.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Literal

import trio

from kanal_registry_proxy.testing.registry import Registry

__all__ = ["Registry", "TestRegistry", "asgi_app"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def asgi_app(registry: Registry) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """An ASGI app serving ``registry``."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        status, headers, payload = registry.handle(
            scope["method"],
            scope.get("raw_path") or scope["path"].encode(),
            scope.get("query_string", b""),
            list(scope["headers"]),
            body,
        )
        headers.append((b"content-length", str(len(payload)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    return app


async def serve(
    registry: Registry,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serves ``registry`` until cancelled; reports its URL."""
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    quiet = logging.getLogger("kanal_registry_proxy.testing.http")
    quiet.setLevel(logging.WARNING)
    config.errorlog = quiet
    config.keep_alive_timeout = 75.0
    config.graceful_timeout = 0.5
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(hypercorn_serve, asgi_app(registry), config)
        task_status.started(binds[0])


class TestRegistry:
    """A test registry on a free local port, in a thread or a process."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        mode: Literal["thread", "process"] = "thread",
        users: dict[str, str] | None = None,
        permissions: list[dict[str, str]] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.mode = mode
        self.users = users
        self.permissions = permissions
        self.registry: Registry | None = None
        self.url = ""
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._process: subprocess.Popen[str] | None = None

    def start(self, timeout: float = 15.0) -> TestRegistry:
        if self.mode == "process":
            return self._start_process(timeout)
        self.registry = Registry(self.users, self.permissions)
        ready = threading.Event()
        problem: list[BaseException] = []

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as scope:
                self._scope = scope
                async with trio.open_nursery() as nursery:
                    assert self.registry is not None
                    self.url = (
                        "http://" + (await nursery.start(serve, self.registry, self.host, self.port)).split("//")[-1]
                    )
                    ready.set()

        def run() -> None:
            try:
                trio.run(main)
            except BaseException as exc:  # reported to start()
                problem.append(exc)
                ready.set()

        self._thread = threading.Thread(target=run, name="test-registry", daemon=True)
        self._thread.start()
        if not ready.wait(timeout) or problem:
            raise RuntimeError(f"the test registry did not start: {problem[0] if problem else 'timeout'}")
        return self

    def _start_process(self, timeout: float) -> TestRegistry:
        command = [sys.executable, "-m", "kanal_registry_proxy.testing", "--host", self.host, "--port", str(self.port)]
        if self.users is not None:
            command += ["--auth", json.dumps({"users": self.users, "permissions": self.permissions or []})]
        env = dict(os.environ)
        paths = [p for p in sys.path if p]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        assert self._process.stdout is not None
        line = self._process.stdout.readline().strip()
        if not line.startswith("READY "):
            self._process.kill()
            raise RuntimeError(f"the test registry process did not start: {line!r}")
        self.url = line.split(" ", 1)[1]
        return self

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        if self._thread is not None and self._token is not None and self._scope is not None:
            scope = self._scope
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(scope.cancel, trio_token=self._token)
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> TestRegistry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
