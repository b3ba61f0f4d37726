"""Run the Kanal gateway (``python -m kanal run``) as a child process, for tests and tooling.

The gateway is configured through environment variables only. When it is ready it prints one line
matching :data:`READY_PATTERN`; group 1 is the host:port clients bootstrap from.
"""

from __future__ import annotations

import os
import re
import site
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from kanal.embedded.tansu import (
    EmbeddedProcessError,
    ProcessOutput,
    register_for_cleanup,
    spawn,
    terminate,
    unregister_for_cleanup,
)

__all__ = ["READY_PATTERN", "GatewayProcess", "gateway_env"]

READY_PATTERN = re.compile(r"ready: clients bootstrap at (\S+)")

#: The directory holding the ``kanal`` package this module belongs to (``<repo>/core`` in a checkout).
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]

#: Inherited variables with these prefixes configure a gateway; dropped unless asked otherwise so that a
#: developer's shell cannot change what a test runs against.
_CONFIG_PREFIXES = ("KAFKA_", "GATEWAY_")


def _site_dirs() -> set[Path]:
    dirs = {Path(p).resolve() for p in site.getsitepackages()}
    user = site.getusersitepackages()
    if user:
        dirs.add(Path(user).resolve())
    return dirs


def gateway_env(
    env: Mapping[str, str] | None = None,
    *,
    inherit: bool = True,
    drop_inherited_config: bool = True,
) -> dict[str, str]:
    """Build the environment of a gateway child.

    Starts from ``os.environ`` (if ``inherit``), drops inherited ``KAFKA_*``/``GATEWAY_*`` variables (if
    ``drop_inherited_config``), applies ``env``, makes Python unbuffered, and puts the checkout's
    ``core/`` directory on ``PYTHONPATH`` unless the package is installed in site-packages.
    """
    result: dict[str, str] = dict(os.environ) if inherit else {}
    if drop_inherited_config:
        result = {k: v for k, v in result.items() if not k.startswith(_CONFIG_PREFIXES)}
    result.update(env or {})
    result.setdefault("PYTHONUNBUFFERED", "1")
    if _PACKAGE_ROOT not in _site_dirs():
        entries = [p for p in result.get("PYTHONPATH", "").split(os.pathsep) if p]
        if not any(Path(p).resolve() == _PACKAGE_ROOT for p in entries):
            result["PYTHONPATH"] = os.pathsep.join([str(_PACKAGE_ROOT), *entries])
    return result


class GatewayProcess:
    """A ``python -m kanal run`` child process.

    >>> env = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092", "GATEWAY_PORT_START": "16000"}
    >>> with GatewayProcess(env) as gw:         # doctest: +SKIP
    ...     print(gw.bootstrap)
    127.0.0.1:16000

    Output (stdout and stderr merged) is drained by a thread into :attr:`output` and, if given,
    ``log_path``. :meth:`stop` sends SIGTERM and returns the exit code (a clean stop is 0).
    """

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        args: Sequence[str] = ("run",),
        python: str = sys.executable,
        inherit_env: bool = True,
        drop_inherited_config: bool = True,
        cwd: str | Path | None = None,
        log_path: str | Path | None = None,
        ready_pattern: re.Pattern[str] = READY_PATTERN,
    ) -> None:
        self.env = gateway_env(env, inherit=inherit_env, drop_inherited_config=drop_inherited_config)
        self.argv = [python, "-m", "kanal", *args]
        self.cwd = cwd
        self.log_path = Path(log_path) if log_path is not None else None
        self._ready_pattern = ready_pattern
        self._proc: subprocess.Popen[bytes] | None = None
        self._output: ProcessOutput | None = None
        self._ready = threading.Event()
        self._bootstrap: str | None = None

    # -- properties

    @property
    def bootstrap(self) -> str:
        """host:port announced in the ready line."""
        if self._bootstrap is None:
            raise RuntimeError("gateway is not ready (start() it first)")
        return self._bootstrap

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    @property
    def output(self) -> str:
        """Everything the gateway printed so far."""
        return self._output.text() if self._output is not None else ""

    def wait_for_output(self, text: str, timeout: float = 5.0) -> bool:
        """Whether ``text`` appears in the output within ``timeout`` (output is read by a thread,
        so a line the gateway just wrote may not be in :attr:`output` yet)."""
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def tail(self, n: int = 60) -> str:
        return self._output.tail(n) if self._output is not None else ""

    # -- lifecycle

    def _see_line(self, line: str) -> None:
        if self._ready.is_set():
            return
        match = self._ready_pattern.search(line)
        if match:
            self._bootstrap = match.group(1)
            self._ready.set()

    def start(self, timeout: float = 30.0) -> Self:
        """Start the gateway and wait for its ready line; raise EmbeddedProcessError with its output if
        it exits first or takes longer than ``timeout`` seconds."""
        if self._proc is not None:
            raise RuntimeError("GatewayProcess already started")
        proc = spawn(self.argv, env=self.env, cwd=self.cwd)
        assert proc.stdout is not None
        self._proc = proc
        self._output = ProcessOutput(proc.stdout, name="kanal", log_path=self.log_path, on_line=self._see_line)
        register_for_cleanup(self)
        deadline = time.monotonic() + timeout
        try:
            while not self._ready.wait(0.05):
                code = proc.poll()
                if code is not None:
                    self._output.join(2.0)
                    if self._ready.is_set():  # printed the line, then exited at once
                        break
                    raise EmbeddedProcessError(
                        f"gateway exited before it was ready: {' '.join(self.argv)}",
                        output=self._output.tail(),
                        returncode=code,
                    )
                if time.monotonic() >= deadline:
                    raise EmbeddedProcessError(
                        f"gateway printed no ready line within {timeout:g}s: {' '.join(self.argv)}",
                        output=self._output.tail(),
                    )
        except BaseException:
            self.stop(timeout=5.0)
            raise
        return self

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM the gateway, SIGKILL it after ``timeout`` seconds; return its exit code (None if never
        started). Safe to call twice."""
        if self._proc is None:
            return None
        code = terminate(self._proc, timeout)
        if self._output is not None:
            self._output.close()
        unregister_for_cleanup(self)
        return code

    def __enter__(self) -> Self:
        if self._proc is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else ("stopped" if self._proc is not None else "new")
        return f"<GatewayProcess {self._bootstrap or '?'} {state}>"
