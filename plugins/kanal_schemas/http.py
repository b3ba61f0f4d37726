"""The HTTP client of the schema registry plugins: HTTP/1.1 with kept-alive connections over trio streams,
TLS optional.

A small client of its own rather than a general-purpose library: the registry proxy's hot path is one
request and one response per call, and a library's per-request machinery would cost more than the
proxying itself. It speaks what registries answer: Content-Length or chunked bodies, ``Connection:
close``, and bodies delimited by the end of the connection.

A call that fails on a reused connection before any response byte arrived (the server closed an
idle connection) is sent again once on a new connection. Idle connections opened in another trio run
(a client kept between two ``trio.run`` calls) are dropped, never reused.

The call timeout: while :meth:`HttpClient.watch` runs, a task checking the calls in progress a few
times per timeout closes the connection of a call past its deadline, which ends the call with a
timeout. A cancel scope with a deadline around each call would do the same for about 25 us of trio's
deadline bookkeeping per call, a fifth of the proxy's own work per request; without ``watch`` (a
client used on its own) each call gets one.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import trio

__all__ = [
    "Endpoint",
    "Headers",
    "HttpClient",
    "HttpError",
    "HttpResponse",
    "TlsSettings",
    "receive_some",
    "request_once",
    "send_all",
]

Headers = list[tuple[bytes, bytes]]
_MAX_HEAD = 64 * 1024
_READ = 256 * 1024


async def receive_some(stream: trio.abc.Stream, max_bytes: int) -> bytes | bytearray:
    """``stream.receive_some(max_bytes)``, but a plain socket is read by waiting for it first, then one
    ``read``. The proxy reads a socket only after writing to it (a request upstream, an answer to the
    client), so nothing is there yet: trio's receive tries a read first, which fails, and when it does
    not fail takes an extra pass of the scheduler; both cost CPU on every request. Otherwise, or for
    TLS, trio's."""
    if type(stream) is trio.SocketStream:
        sock = stream.socket
        while True:
            await trio.lowlevel.wait_readable(sock)
            try:
                # fileno() again after the wait: -1 (an error) if another task closed the socket meanwhile,
                # never a number the system may have given to a newer socket
                return os.read(sock.fileno(), max_bytes)
            except BlockingIOError:
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(str(exc)) from exc
    return await stream.receive_some(max_bytes)


async def send_all(stream: trio.abc.Stream, data: bytes) -> None:
    """``stream.send_all(data)``, but a plain socket whose kernel buffer takes all of ``data`` at once is
    written without a trip through trio's scheduler (the usual case for requests and answers of a few
    KiB; it saves a scheduler pass per write on the proxy's hot path). Otherwise, or for TLS, trio's."""
    if type(stream) is trio.SocketStream:
        try:
            written = os.write(stream.socket.fileno(), data)
        except BlockingIOError:
            written = 0
        except OSError as exc:
            raise trio.BrokenResourceError(str(exc)) from exc
        if written == len(data):
            return
        data = data[written:]
    await stream.send_all(data)


class HttpError(Exception):
    """The server could not be reached or answered something that is not HTTP (``timeout``: it did not
    answer in time)."""

    def __init__(self, message: str, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


@dataclass(slots=True)
class HttpResponse:
    status: int
    headers: Headers  # names in lower case
    body: bytes

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """How to check the server, and the client certificate to show (PEM files).

    ``check_hostname`` False accepts a certificate issued for another host; ``verify`` False (the
    registry proxy's choice when it checks no hostname and is given no CA) accepts any certificate."""

    ca_location: str | None = None
    certificate_location: str | None = None
    key_location: str | None = None
    key_password: str | None = None
    check_hostname: bool = True
    verify: bool = True

    def context(self) -> ssl.SSLContext:
        """The SSL context (raises OSError or ssl.SSLError for unreadable files)."""
        context = ssl.create_default_context(cafile=self.ca_location)
        context.check_hostname = self.check_hostname and self.verify
        if not self.verify:
            context.verify_mode = ssl.CERT_NONE
        if self.certificate_location:
            context.load_cert_chain(self.certificate_location, self.key_location, self.key_password)
        return context


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An ``http(s)://[user:password@]host[:port][/base-path]`` URL, split."""

    scheme: str
    host: str
    port: int
    path: str = ""
    query: str = ""
    user_info: str | None = None

    @property
    def base_path(self) -> str:
        """The path without a trailing ``/``: what prefixes the registry's routes."""
        return self.path.rstrip("/")

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """Raises ValueError (its text names the problem) for anything but an http(s) URL with a host."""
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)  # ValueError for a bad port
        user_info = None
        if parts.username is not None:
            user_info = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        return cls(parts.scheme, parts.hostname, port, parts.path, parts.query, user_info)


class _Closed(Exception):
    """The connection closed; ``fresh`` when nothing of a response had arrived."""

    def __init__(self, fresh: bool) -> None:
        self.fresh = fresh


class _Connection:
    __slots__ = ("buffer", "expired", "stream")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = bytearray()
        self.expired = False

    def expire(self) -> None:
        """Ends the call in progress: closing the socket wakes the task waiting on it with an error."""
        self.expired = True
        stream = self.stream
        transport = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
        if isinstance(transport, trio.SocketStream):
            transport.socket.close()

    async def _fill(self, fresh: bool) -> None:
        data = await receive_some(self.stream, _READ)
        if not data:
            raise _Closed(fresh)
        self.buffer += data

    async def exchange(self, request: bytes, head_only: bool) -> tuple[HttpResponse, bool]:
        """Sends a request, reads the response; returns it and whether the connection can be reused."""
        await send_all(self.stream, request)
        buffer = self.buffer
        end = buffer.find(b"\r\n\r\n")
        while end < 0:
            if len(buffer) > _MAX_HEAD:
                raise HttpError("the upstream sent a response head over 64 KiB")
            await self._fill(not buffer)
            end = buffer.find(b"\r\n\r\n")
        lines = bytes(buffer[:end]).split(b"\r\n")
        del buffer[: end + 4]
        status_line = lines[0].split(b" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1.") or not status_line[1].isdigit():
            raise HttpError(f"the upstream did not answer HTTP/1.x: {lines[0][:80]!r}")
        status = int(status_line[1])
        keep_alive = status_line[0] == b"HTTP/1.1"
        headers: Headers = []
        length: int | None = None
        chunked = False
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                continue
            name = name.strip().lower()
            value = value.strip()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                token = value.lower()
                if b"close" in token:
                    keep_alive = False
                elif b"keep-alive" in token:
                    keep_alive = True
            headers.append((name, value))
        if head_only or status in (204, 304) or 100 <= status < 200:
            return HttpResponse(status, headers, b""), keep_alive
        if chunked:
            body = await self._chunked()
        elif length is not None:
            while len(buffer) < length:
                await self._fill(False)
            body = bytes(buffer[:length])
            del buffer[:length]
        else:  # delimited by the end of the connection
            try:
                while True:
                    await self._fill(False)
            except _Closed:
                pass
            body = bytes(buffer)
            buffer.clear()
            keep_alive = False
        return HttpResponse(status, headers, body), keep_alive

    async def _chunked(self) -> bytes:
        buffer = self.buffer
        parts: list[bytes] = []
        while True:
            end = buffer.find(b"\r\n")
            while end < 0:
                await self._fill(False)
                end = buffer.find(b"\r\n")
            size = int(bytes(buffer[:end]).split(b";", 1)[0].strip() or b"0", 16)
            del buffer[: end + 2]
            if size == 0:  # trailers, then an empty line
                while True:
                    end = buffer.find(b"\r\n")
                    while end < 0:
                        await self._fill(False)
                        end = buffer.find(b"\r\n")
                    line = bytes(buffer[:end])
                    del buffer[: end + 2]
                    if not line:
                        return b"".join(parts)
            while len(buffer) < size + 2:
                await self._fill(False)
            parts.append(bytes(buffer[:size]))
            del buffer[: size + 2]

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True), contextlib.suppress(trio.BrokenResourceError, OSError):
            await self.stream.aclose()


class HttpClient:
    """Kept-alive HTTP/1.1 connections to one host.

    ``label`` names the server in error messages (``cannot connect to the <label> host:port``, ``the
    <label> did not answer within 5 s``)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None = None,
        timeout: float = 30.0,
        max_connections: int = 100,
        base_path: str = "",
        default_headers: Sequence[tuple[bytes, bytes]] = (),
        label: str = "upstream registry",
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.timeout = timeout
        self.label = label
        self.base_path = base_path.encode()
        default_port = 443 if tls is not None else 80
        host_header = host if port == default_port else f"{host}:{port}"
        if ":" in host and not host.startswith("["):
            host_header = f"[{host}]" if port == default_port else f"[{host}]:{port}"
        self._prefix_headers = (
            b"Host: "
            + host_header.encode()
            + b"\r\n"
            + b"".join(name + b": " + value + b"\r\n" for name, value in default_headers)
        )
        self._idle: list[_Connection] = []
        self._idle_run: object = None  # the trio run the idle connections belong to
        self._max_connections = max_connections
        self._in_use = 0
        self._waiting = trio.lowlevel.ParkingLot()  # calls waiting for a connection slot
        self._closed = False
        self._watched = False  # whether watch() enforces the timeout
        self._busy: dict[_Connection, float] = {}  # connections in use by a call, with its deadline

    @classmethod
    def for_url(
        cls,
        url: str | Endpoint,
        *,
        tls: TlsSettings | None = None,
        timeout: float = 30.0,
        max_connections: int = 100,
        default_headers: Sequence[tuple[bytes, bytes]] = (),
        label: str = "upstream registry",
    ) -> HttpClient:
        """A client of the host of ``url`` (its path prefixes every target; ValueError for a bad URL)."""
        endpoint = url if isinstance(url, Endpoint) else Endpoint.parse(url)
        context = (tls or TlsSettings()).context() if endpoint.scheme == "https" else None
        return cls(
            endpoint.host,
            endpoint.port,
            tls=context,
            timeout=timeout,
            max_connections=max_connections,
            base_path=endpoint.base_path,
            default_headers=default_headers,
            label=label,
        )

    async def _connect(self) -> _Connection:
        stream: trio.abc.Stream = await trio.open_tcp_stream(self.host, self.port)
        sock = stream.socket if isinstance(stream, trio.SocketStream) else None
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            tls = trio.SSLStream(stream, self.tls, server_hostname=self.host)
            await tls.do_handshake()
            stream = tls
        return _Connection(stream)

    def _encode(self, method: str, target: bytes, headers: Sequence[tuple[bytes, bytes]], body: bytes) -> bytes:
        parts = [method.encode(), b" ", self.base_path, target, b" HTTP/1.1\r\n", self._prefix_headers]
        for name, value in headers:
            parts += (name, b": ", value, b"\r\n")
        if body or method in ("POST", "PUT", "PATCH"):
            parts += (b"Content-Length: ", str(len(body)).encode(), b"\r\n")
        parts.append(b"\r\n")
        parts.append(body)
        return b"".join(parts)

    async def watch(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Enforces the call timeout while it runs (see the module's docstring); a call ends at most a
        tenth of the timeout (and at most a second) after its deadline."""
        tick = min(1.0, max(0.01, self.timeout / 10))
        self._watched = True
        task_status.started()
        try:
            while True:
                await trio.sleep(tick)
                now = trio.current_time()
                for connection, deadline in list(self._busy.items()):
                    if deadline <= now:
                        connection.expire()
        finally:
            self._watched = False

    async def request(
        self, method: str, target: bytes, headers: Sequence[tuple[bytes, bytes]] = (), body: bytes = b""
    ) -> HttpResponse:
        """One call; ``target`` is the path (already percent-encoded) and query string."""
        payload = self._encode(method, target, headers, body)
        deadline = trio.current_time() + self.timeout
        if self._watched:
            return await self._call(payload, method == "HEAD", deadline)
        with trio.CancelScope(deadline=deadline):
            return await self._call(payload, method == "HEAD", None)
        raise self._timed_out()  # only reached when the deadline cancelled the call

    def _timed_out(self) -> HttpError:
        return HttpError(f"the {self.label} did not answer within {self.timeout:g} s", timeout=True)

    async def _call(self, payload: bytes, head_only: bool, deadline: float | None) -> HttpResponse:
        """``deadline`` is enforced by watch(); None when a cancel scope of the caller's enforces it."""
        if self._in_use >= self._max_connections:  # rare: wait for a slot, under a scope of its own
            with trio.CancelScope(deadline=math.inf if deadline is None else deadline) as scope:
                while self._in_use >= self._max_connections:
                    await self._waiting.park()
            if scope.cancelled_caught:
                raise self._timed_out()
        self._in_use += 1
        try:
            return await self._send(payload, head_only, deadline)
        finally:
            self._in_use -= 1
            if self._waiting:  # unpark() costs a few us even with nobody parked
                self._waiting.unpark()

    async def _open(self, deadline: float | None) -> _Connection:
        try:
            if deadline is None:
                return await self._connect()
            with trio.CancelScope(deadline=deadline):  # a new connection is rare: a scope is fine here
                return await self._connect()
            raise self._timed_out()
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
            raise HttpError(f"cannot connect to the {self.label} {self.host}:{self.port}: {exc}") from exc

    def _drop_idle_of_other_runs(self) -> None:
        """Idle connections are registered with the trio run that opened them: another run closes them."""
        run = trio.lowlevel.current_root_task()
        if self._idle_run is not run:
            idle, self._idle = self._idle, []
            for connection in idle:
                connection.expire()
            self._idle_run = run

    async def _send(self, payload: bytes, head_only: bool, deadline: float | None) -> HttpResponse:
        if self._idle:
            self._drop_idle_of_other_runs()
        for attempt in (1, 2):
            reused = bool(self._idle)
            connection = self._idle.pop() if reused else await self._open(deadline)
            keep = False
            if deadline is not None:
                self._busy[connection] = deadline
            try:
                response, keep = await connection.exchange(payload, head_only)
                return response
            except _Closed as exc:
                if connection.expired:
                    raise self._timed_out() from None
                if reused and exc.fresh and attempt == 1:
                    continue  # an idle connection the server had closed: once more on a new one
                raise HttpError(f"the {self.label} closed the connection") from None
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, ValueError) as exc:
                if connection.expired:
                    raise self._timed_out() from None
                if reused and attempt == 1 and isinstance(exc, (trio.BrokenResourceError, OSError)):
                    continue
                raise HttpError(f"{self.label} call failed: {exc}") from exc
            finally:
                if deadline is not None:
                    del self._busy[connection]
                if keep and not self._closed:
                    if not self._idle:
                        self._idle_run = trio.lowlevel.current_root_task()
                    self._idle.append(connection)
                else:
                    await connection.aclose()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        if idle and self._idle_run is not trio.lowlevel.current_root_task():
            for connection in idle:
                connection.expire()
            return
        for connection in idle:
            await connection.aclose()


async def request_once(
    method: str,
    url: str,
    *,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    timeout: float = 5.0,
    tls: TlsSettings | None = None,
    label: str = "server",
) -> HttpResponse:
    """One call on a connection of its own, closed after it (webhooks and other rare calls); the whole
    exchange must finish within ``timeout`` seconds. Raises :class:`HttpError` (ValueError for a URL that
    is not http(s))."""
    endpoint = Endpoint.parse(url)
    client = HttpClient.for_url(endpoint, tls=tls, timeout=timeout, max_connections=1, label=label)
    target = (endpoint.path or "/") + (f"?{endpoint.query}" if endpoint.query else "")
    client.base_path = b""
    sent = [(b"Connection", b"close"), (b"User-Agent", b"kanal")]
    sent += [(name.encode("latin-1"), value.encode("latin-1")) for name, value in (headers or {}).items()]
    try:
        return await client.request(method, target.encode(), sent, body)
    finally:
        await client.aclose()
