"""The upstream client: HTTP/1.1 with kept-alive connections over trio streams, TLS optional.

A small client of its own rather than a general-purpose library: the proxy's hot path is one
request and one response per call, and a library's per-request machinery would cost more than the
proxying itself. It speaks what registries answer: Content-Length or chunked bodies, ``Connection:
close``, and bodies delimited by the end of the connection.

A call that fails on a reused connection before any response byte arrived (the server closed an
idle connection) is sent again once on a new connection.

The call timeout: while :meth:`HttpClient.watch` runs, a task checking the calls in progress a few
times per timeout closes the connection of a call past its deadline, which ends the call with a
timeout. A cancel scope with a deadline around each call would do the same for about 25 us of trio's
deadline bookkeeping per call, a fifth of the proxy's own work per request; without ``watch`` (a
client used on its own) each call gets one.
"""

from __future__ import annotations

import base64
import contextlib
import math
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

import trio

from kanal_registry_proxy.settings import UpstreamRegistry

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


class UpstreamError(Exception):
    """The upstream could not be reached or answered something that is not HTTP."""

    def __init__(self, message: str, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


@dataclass(slots=True)
class UpstreamResponse:
    status: int
    headers: Headers  # names in lower case
    body: bytes

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


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

    async def exchange(self, request: bytes, head_only: bool) -> tuple[UpstreamResponse, bool]:
        """Sends a request, reads the response; returns it and whether the connection can be reused."""
        await send_all(self.stream, request)
        buffer = self.buffer
        end = buffer.find(b"\r\n\r\n")
        while end < 0:
            if len(buffer) > _MAX_HEAD:
                raise UpstreamError("the upstream sent a response head over 64 KiB")
            await self._fill(not buffer)
            end = buffer.find(b"\r\n\r\n")
        lines = bytes(buffer[:end]).split(b"\r\n")
        del buffer[: end + 4]
        status_line = lines[0].split(b" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1.") or not status_line[1].isdigit():
            raise UpstreamError(f"the upstream did not answer HTTP/1.x: {lines[0][:80]!r}")
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
            return UpstreamResponse(status, headers, b""), keep_alive
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
        return UpstreamResponse(status, headers, body), keep_alive

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


def tls_context(upstream: UpstreamRegistry) -> ssl.SSLContext | None:
    if upstream.scheme != "https":
        return None
    context = ssl.create_default_context(cafile=upstream.ssl_ca_location)
    context.check_hostname = upstream.ssl_check_hostname
    if not upstream.ssl_check_hostname:
        context.verify_mode = ssl.CERT_REQUIRED if upstream.ssl_ca_location else ssl.CERT_NONE
    if upstream.ssl_certificate_location:
        context.load_cert_chain(upstream.ssl_certificate_location, upstream.ssl_key_location, upstream.ssl_key_password)
    return context


class HttpClient:
    """Kept-alive HTTP/1.1 connections to one host."""

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
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.timeout = timeout
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
        self._max_connections = max_connections
        self._in_use = 0
        self._waiting = trio.lowlevel.ParkingLot()  # calls waiting for a connection slot
        self._closed = False
        self._watched = False  # whether watch() enforces the timeout
        self._busy: dict[_Connection, float] = {}  # connections in use by a call, with its deadline

    @classmethod
    def for_registry(cls, upstream: UpstreamRegistry) -> HttpClient:
        headers: list[tuple[bytes, bytes]] = []
        if upstream.basic_auth_user_info is not None:
            headers.append((b"Authorization", b"Basic " + base64.b64encode(upstream.basic_auth_user_info.encode())))
        elif upstream.bearer_token is not None:
            headers.append((b"Authorization", b"Bearer " + upstream.bearer_token.encode()))
        return cls(
            upstream.host,
            upstream.port,
            tls=tls_context(upstream),
            timeout=upstream.timeout,
            max_connections=upstream.max_connections,
            base_path=upstream.base_path,
            default_headers=headers,
        )

    async def _connect(self) -> _Connection:
        stream: trio.abc.Stream = await trio.open_tcp_stream(self.host, self.port)
        sock = stream.socket if isinstance(stream, trio.SocketStream) else None
        if sock is not None:
            import socket

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
    ) -> UpstreamResponse:
        """One call; ``target`` is the path (already percent-encoded) and query string."""
        payload = self._encode(method, target, headers, body)
        deadline = trio.current_time() + self.timeout
        if self._watched:
            return await self._call(payload, method == "HEAD", deadline)
        with trio.CancelScope(deadline=deadline):
            return await self._call(payload, method == "HEAD", None)
        raise self._timed_out()  # only reached when the deadline cancelled the call

    def _timed_out(self) -> UpstreamError:
        return UpstreamError(f"the upstream registry did not answer within {self.timeout:g} s", timeout=True)

    async def _call(self, payload: bytes, head_only: bool, deadline: float | None) -> UpstreamResponse:
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
            raise UpstreamError(f"cannot connect to the upstream registry {self.host}:{self.port}: {exc}") from exc

    async def _send(self, payload: bytes, head_only: bool, deadline: float | None) -> UpstreamResponse:
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
                raise UpstreamError("the upstream registry closed the connection") from None
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, ValueError) as exc:
                if connection.expired:
                    raise self._timed_out() from None
                if reused and attempt == 1 and isinstance(exc, (trio.BrokenResourceError, OSError)):
                    continue
                raise UpstreamError(f"upstream registry call failed: {exc}") from exc
            finally:
                if deadline is not None:
                    del self._busy[connection]
                if keep and not self._closed:
                    self._idle.append(connection)
                else:
                    await connection.aclose()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            await connection.aclose()
