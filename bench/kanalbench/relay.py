"""The relay path: an L4 relay (socat) in front of a broker, the baseline a proxy that only moves
bytes sets for the gateway.

A client that bootstraps through a relay learns the broker's advertised address from Metadata and
would connect there directly, bypassing the relay. So the relay path has a broker of its own: a
second Tansu with the settings of the stack's (in-memory storage, same binary) that advertises the
relay's port, and socat forwards that port to the broker's real one. Every connection of the client
then goes through socat, and the broker CPU on this path is that second broker's.

``KANALBENCH_RELAY=trio`` puts :mod:`kanalbench.trio_relay` (trio with the gateway's socket path) in
socat's place: the floor of any proxy built on trio.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from kanal.embedded import TansuBroker
from kanal.embedded.tansu import ProcessOutput, free_port, probe_kafka, spawn, terminate

HOST = "127.0.0.1"


def socat_binary() -> str:
    found = shutil.which("socat")
    if found is None:
        raise RuntimeError("socat not found (the relay path needs it: apt-get install socat)")
    return found


class Relay:
    """A Tansu broker advertising ``HOST:port`` and socat forwarding that port to the broker.

    socat forks one process per connection (``fork``) and sets TCP_NODELAY on both sides, as the
    gateway does (trio sockets); its CPU is that of the whole process tree
    (:func:`kanalbench.cpu.tree_cpu_seconds`)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.kind = os.environ.get("KANALBENCH_RELAY", "socat")
        if self.kind not in ("socat", "trio"):
            raise ValueError(f"KANALBENCH_RELAY must be socat or trio, not {self.kind!r}")
        self.port = 0
        self.broker: TansuBroker | None = None
        self.socat: ProcessOutput | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self, timeout: float = 30.0) -> Self:
        self.port = free_port(HOST)
        self.broker = TansuBroker(advertised=self.bootstrap, log_path=self.log_dir / "tansu-relay.log")
        self.broker.start(timeout=timeout)
        if self.kind == "trio":
            argv = [sys.executable, "-m", "kanalbench.trio_relay", str(self.port), HOST, str(self.broker.port)]
        else:
            argv = [
                socat_binary(),
                f"TCP-LISTEN:{self.port},bind={HOST},reuseaddr,fork,nodelay,backlog=1024",
                f"TCP:{HOST}:{self.broker.port},nodelay",
            ]
        proc = spawn(argv, env=os.environ, cwd=Path(__file__).resolve().parents[1])  # (bench/: kanalbench)
        assert proc.stdout is not None
        self._proc = proc
        self.socat = ProcessOutput(proc.stdout, name="socat", log_path=self.log_dir / "socat.log")
        deadline = time.monotonic() + timeout
        while not probe_kafka(HOST, self.port, timeout=1.0):  # the broker answers through the relay
            if proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"socat relay on {self.bootstrap} did not answer:\n{self.socat.tail()}")
            time.sleep(0.05)
        return self

    def pids(self) -> dict[str, int]:
        assert self.broker is not None and self.broker.pid is not None and self._proc is not None
        return {"broker": self.broker.pid, "relay": self._proc.pid}

    def check_alive(self) -> None:
        if self.broker is None or not self.broker.running:
            tail = "\n".join(self.broker.output.splitlines()[-60:]) if self.broker else ""
            raise RuntimeError(f"relay broker is not running:\n{tail}")
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError(f"socat is not running:\n{self.socat.tail() if self.socat else ''}")

    def stop(self) -> None:
        if self._proc is not None:
            # socat leads its own process group (spawn): its per-connection children go with it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGTERM)
            terminate(self._proc, 5.0)
            if self.socat is not None:
                self.socat.close()
            self._proc = None
        if self.broker is not None:
            self.broker.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
