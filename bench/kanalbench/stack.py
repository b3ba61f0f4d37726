"""The processes under test: one Tansu broker and one Kanal gateway in front of it."""

from __future__ import annotations

import os
import resource
import shlex
import sys
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Self

from kanal.embedded import GatewayProcess, TansuBroker

GATEWAY_PORT_COUNT = 3
#: Room for 1,000+ client connections plus as many upstream ones (inherited by the children).
NOFILE = 20_000


def raise_nofile(wanted: int = NOFILE) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


def proc_status(pid: int, field: str = "VmRSS") -> int:
    """A ``/proc/<pid>/status`` field in bytes (VmRSS, VmHWM, ...)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def open_fds(pid: int) -> int:
    """Open file descriptors of a process (sockets included)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


class Stack:
    """A broker and a gateway (configured by ``config``, a YAML file, and ``env``)."""

    def __init__(
        self, log_dir: Path, config: Path | None = None, env: dict[str, str] | None = None, cprofile: Path | None = None
    ) -> None:
        self.log_dir = log_dir
        self.config = config
        self.env = dict(env or {})
        self.cprofile = cprofile
        self.broker: TansuBroker | None = None
        self.gateway: GatewayProcess | None = None

    def start(self) -> Self:
        raise_nofile()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.broker = TansuBroker(log_path=self.log_dir / "tansu.log").start(timeout=30)
        self.start_gateway()
        return self

    def start_gateway(self) -> GatewayProcess:
        assert self.broker is not None
        args = ["run"] + (["--config", str(self.config)] if self.config else [])
        log = self.log_dir / f"gateway-{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:6]}.log"
        python = self._cprofile_python() if self.cprofile else sys.executable
        self.gateway = GatewayProcess(
            {**self.broker.gateway_settings(GATEWAY_PORT_COUNT), **self.env}, args=args, log_path=log, python=python
        ).start(timeout=60)
        return self.gateway

    def _cprofile_python(self) -> str:
        """A stand-in interpreter that runs the gateway under cProfile (written when it stops)."""
        assert self.cprofile is not None
        wrapper = self.log_dir / "python-cprofile"
        wrapper.write_text(
            f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m cProfile -o "
            f'{shlex.quote(str(self.cprofile.resolve()))} "$@"\n'
        )
        wrapper.chmod(0o755)
        return str(wrapper)

    def restart_gateway(self) -> GatewayProcess:
        if self.gateway is not None:
            self.gateway.stop()
        return self.start_gateway()

    def bootstrap(self, path: str) -> str:
        """The address a client bootstraps from on ``path`` (``direct`` or ``gateway``)."""
        assert self.broker is not None and self.gateway is not None
        return self.broker.bootstrap if path == "direct" else self.gateway.bootstrap

    def pids(self) -> dict[str, int]:
        assert self.broker is not None and self.gateway is not None
        assert self.broker.pid is not None and self.gateway.pid is not None
        return {"broker": self.broker.pid, "gateway": self.gateway.pid}

    def check_alive(self) -> None:
        for name, proc in (("broker", self.broker), ("gateway", self.gateway)):
            if proc is None or not proc.running:
                tail = "\n".join(proc.output.splitlines()[-60:]) if proc is not None else ""
                raise RuntimeError(f"{name} is not running:\n{tail}")

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        if self.broker is not None:
            self.broker.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
