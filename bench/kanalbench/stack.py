"""The processes under test: one Tansu broker and one Kanal gateway in front of it."""

from __future__ import annotations

import contextlib
import os
import resource
import shlex
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from types import TracebackType
from typing import Self

from kanal.embedded import GatewayProcess, TansuBroker

GATEWAY_PORT_COUNT = 3
#: Room for 10,000 client connections plus as many upstream ones (inherited by the children; capped
#: at the hard limit, which an unprivileged process cannot raise).
NOFILE = 1 << 20
#: ``/proc/net/tcp`` state of an established connection.
TCP_ESTABLISHED = "01"


def raise_nofile(wanted: int = NOFILE) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < limit:
        with contextlib.suppress(ValueError, OSError):  # above the kernel's nr_open: keep what we have
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))


def proc_status(pid: int, field: str = "VmRSS") -> int:
    """A ``/proc/<pid>/status`` field in bytes (VmRSS, VmHWM, ...)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def open_fds(pid: int) -> int:
    """Open file descriptors of a process (sockets included)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def nofile_limit(pid: int) -> int:
    """A process's soft limit on open files (``/proc/<pid>/limits``)."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise KeyError("Max open files")


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def tcp_connections(pid: int, *, remote_port: int | None = None, local_port: int | None = None) -> int:
    """Established TCP connections a process holds, to ``remote_port`` (a gateway's upstream
    connections to the broker) or on ``local_port`` (a broker's connections from clients).

    Counted from the process's socket descriptors matched against ``/proc/<pid>/net/tcp`` and
    ``tcp6``, so only the sockets of that process are counted, not the whole machine's."""
    inodes = _socket_inodes(pid)
    count = 0
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            if state != TCP_ESTABLISHED or inode not in inodes:
                continue
            if remote_port is not None and int(remote.rsplit(":", 1)[1], 16) != remote_port:
                continue
            if local_port is not None and int(local.rsplit(":", 1)[1], 16) != local_port:
                continue
            count += 1
    return count


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

    def restart_gateway(self, env: dict[str, str] | None = None) -> GatewayProcess:
        """A fresh gateway process; ``env``, if given, replaces the gateway's extra settings."""
        if self.gateway is not None:
            self.gateway.stop()
        if env is not None:
            self.env = dict(env)
        return self.start_gateway()

    def broker_port(self) -> int:
        assert self.broker is not None
        return self.broker.port

    def upstream_connections(self) -> int:
        """The gateway's established connections to the broker (shared, own, its metadata client's and
        its membership group's)."""
        return tcp_connections(self.pids()["gateway"], remote_port=self.broker_port())

    def broker_connections(self) -> int:
        """Connections the broker holds on its Kafka port (from clients, a gateway, or both)."""
        return tcp_connections(self.pids()["broker"], local_port=self.broker_port())

    def gateway_metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """The gateway's Prometheus samples, keyed by (name, sorted labels)."""
        from prometheus_client.parser import text_string_to_metric_families

        assert self.gateway is not None
        url = f"http://127.0.0.1:{self.gateway.env['GATEWAY_HTTP_PORT']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

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
