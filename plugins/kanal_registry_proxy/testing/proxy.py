"""A registry proxy in a thread of its own, for tests: ``with ProxyThread(env) as proxy: proxy.url``.

Its topic-acl and reactive modes reach Kafka through a :class:`~kanal.api.CliContext`, as
``kanal registry-proxy`` does: ``ProxyThread(env, cli=...)``.

Also: :func:`license_pair` (a key pair and a token signed with it) and :func:`credentials_file`.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import trio

from kanal.api import CliContext
from kanal_registry_proxy.auth_basic import hash_password
from kanal_registry_proxy.license import generate_keypair, issue
from kanal_registry_proxy.service import ProxyService, standalone
from kanal_registry_proxy.settings import load_settings


def license_pair(expires_at: int | None = None, plan: str = "gateway") -> tuple[str, str, str]:
    """(token, public key PEM, private key PEM) of a fresh license."""
    private_pem, public_pem = generate_keypair()
    return issue(private_pem, "kanal tests", expires_at, plan), public_pem.decode(), private_pem.decode()


def credentials_file(path: Path, users: Mapping[str, str], rounds: int = 4) -> Path:
    """Writes a basic credentials file with bcrypt hashes of the given passwords."""
    entries = [{"username": name, "password_hash": hash_password(password, rounds)} for name, password in users.items()]
    path.write_text(json.dumps({"users": entries}))
    return path


class ProxyThread:
    """Builds a :class:`ProxyService` from ``env`` (startup checks raise here) and serves it; with
    ``cli``, Kafka as that command line reaches it (needed by the topic-acl and reactive modes)."""

    def __init__(self, env: Mapping[str, str], cli: CliContext | None = None) -> None:
        settings = load_settings({"SRP_HTTP_PORT": "0", "SRP_BIND_HOST": "127.0.0.1", **env})
        self.service = ProxyService(settings) if cli is None else standalone(settings, cli)
        self.url = ""
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self.error: BaseException | None = None

    def start(self, timeout: float = 20.0) -> ProxyThread:
        ready = threading.Event()

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as scope:
                self._scope = scope
                async with trio.open_nursery() as nursery:
                    binds = await nursery.start(lambda task_status: self.service.serve(task_status=task_status))
                    self.url = binds[0]
                    ready.set()

        def run() -> None:
            try:
                trio.run(main)
            except BaseException as exc:
                self.error = exc
                ready.set()

        self._thread = threading.Thread(target=run, name="registry-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError("the registry proxy did not start in time")
        if self.error is not None:
            raise RuntimeError(f"the registry proxy did not start: {self.error!r}") from self.error
        return self

    def call(self, fn: object) -> None:
        """Runs a synchronous function in the proxy's trio thread."""
        assert self._token is not None
        trio.from_thread.run_sync(fn, trio_token=self._token)  # type: ignore[arg-type]

    def stop(self) -> None:
        if self._thread is None or self._token is None or self._scope is None:
            return
        with contextlib.suppress(trio.RunFinishedError):
            trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        self._thread.join(10)
        self._thread = None

    def __enter__(self) -> ProxyThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_until(predicate: object, timeout: float = 10.0, interval: float = 0.05) -> bool:
    """Polls ``predicate()`` until it is true or the timeout passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return bool(predicate())  # type: ignore[operator]
