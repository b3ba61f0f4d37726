"""The proxy's HTTP/1.1 listener: a lean server on trio streams, with kept-alive connections.

Why not Hypercorn, which serves the admin API: measured here, Hypercorn's per-request machinery
(h11 events, a task and ASGI messages per request, head and body written separately) costs about
0.5-0.6 ms of CPU per request, as much as the whole test registry; a proxy that spends that much
before doing its own work cannot stay within 0.8 of the registry's throughput on a small machine.
This server reads a request head with one search, answers with one write, and hands registry calls
straight to :class:`~kanal_registry_proxy.proxy.RegistryProxy`. The proxy's own endpoints
(``/metrics``, ``/health/*``) are the Quart app of :mod:`kanal_registry_proxy.app`, called through a
minimal ASGI bridge.

What it accepts: HTTP/1.0 and 1.1, ``Content-Length`` or chunked request bodies (both together is
refused, as request smuggling), ``Expect: 100-continue``, pipelined requests (answered in order),
heads up to 64 KiB with at most 100 headers, bodies up to 16 MiB. Malformed requests get 400 and the
connection is closed. Idle kept-alive connections close after 75 s, and a request must arrive whole
within 30 s of its first bytes (both checked once a second). Optional TLS.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, MutableMapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

import trio

from kanal_registry_proxy.proxy import ProxyRequest, ProxyResponse, RegistryProxy, error
from kanal_registry_proxy.upstream import receive_some, send_all

log = logging.getLogger(__name__)

MAX_HEAD = 64 * 1024
MAX_HEADERS = 100
MAX_BODY = 16 * 1024 * 1024
KEEP_ALIVE_TIMEOUT = 75.0
HEAD_TIMEOUT = 30.0
WATCH_INTERVAL = 1.0
_NO_DEADLINE = float("inf")
OWN_PATHS = frozenset({b"/metrics", b"/health/live", b"/health/ready"})
_READ = 65536
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
ASGIApp = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Disconnected(Exception):
    pass


class _Date:
    """The Date header value, formatted once per second."""

    def __init__(self) -> None:
        self.second = 0
        self.value = b""

    def get(self) -> bytes:
        now = int(time.time())
        if now != self.second:
            self.second = now
            self.value = formatdate(now, usegmt=True).encode()
        return self.value


class HttpServer:
    def __init__(self, proxy: RegistryProxy, own_app: ASGIApp, tls: ssl.SSLContext | None = None) -> None:
        self.proxy = proxy
        self.own_app = own_app
        self.tls = tls
        self.draining = False
        self.connections = 0
        self._date = _Date()
        self._idle: set[trio.CancelScope] = set()
        # per connection, when it has waited too long: the keep-alive or head deadline while waiting
        # for a client, none while the proxy works on a request
        self._deadlines: dict[trio.CancelScope, float] = {}

    async def serve(
        self, host: str, port: int, *, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        listeners: list[Any] = list(await trio.open_tcp_listeners(port, host=None if host in ("", "*") else host))
        if self.tls is not None:
            listeners = [trio.SSLListener(listener, self.tls, https_compatible=True) for listener in listeners]
        scheme = "https" if self.tls is not None else "http"
        binds = []
        for listener in listeners:
            sock = (listener.transport_listener if self.tls is not None else listener).socket
            address = sock.getsockname()
            shown = f"[{address[0]}]" if ":" in address[0] else address[0]
            binds.append(f"{scheme}://{shown}:{address[1]}")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch)
            await nursery.start(trio.serve_listeners, self._connection, listeners)
            task_status.started(binds)

    async def _watch(self) -> None:
        """Closes connections past their deadline. One task checking once a second instead of a cancel
        scope deadline moved three times per request: each move costs about 5 us of trio's deadline
        bookkeeping, on the proxy's hot path; these timeouts need no better than a second."""
        while True:
            await trio.sleep(WATCH_INTERVAL)
            now = trio.current_time()
            for scope, deadline in list(self._deadlines.items()):
                if deadline <= now:
                    scope.cancel()

    def drain(self) -> None:
        """Stops reading new requests: idle connections close now, busy ones after their answer."""
        self.draining = True
        for scope in list(self._idle):
            scope.cancel()

    async def _connection(self, stream: trio.abc.Stream) -> None:
        self.connections += 1
        client = None
        inner = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
        if isinstance(inner, trio.SocketStream):
            try:
                peer = inner.socket.getpeername()
                client = f"{peer[0]}:{peer[1]}"
            except OSError:
                pass
        buffer = bytearray()
        deadlines = self._deadlines
        # one cancel scope per connection, cancelled by _watch past its deadline
        scope = trio.CancelScope()
        try:
            with scope:
                while not self.draining:
                    if not buffer:
                        deadlines[scope] = trio.current_time() + KEEP_ALIVE_TIMEOUT
                        self._idle.add(scope)
                        try:
                            data = await receive_some(stream, _READ)
                        finally:
                            self._idle.discard(scope)
                        if not data:
                            return
                        buffer += data
                    deadlines[scope] = trio.current_time() + HEAD_TIMEOUT
                    try:
                        request, keep_alive, expects_continue = await self._read_head(stream, buffer, client)
                        if expects_continue:
                            await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                        request.body = await self._read_body(stream, buffer, request)
                    except _BadRequest as exc:
                        response = error(exc.status, exc.status * 100 + 1, str(exc))
                        response.headers.append((b"content-length", str(len(response.body)).encode()))
                        await self._send(stream, response, False)
                        return
                    deadlines[scope] = _NO_DEADLINE
                    if request.raw_path in OWN_PATHS:
                        response = await self._own(request)
                    else:
                        response = await self.proxy.handle(request)
                    keep_alive = keep_alive and not self.draining
                    await self._send(stream, response, keep_alive)
                    if not keep_alive:
                        return
        except (_Disconnected, trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
            return
        finally:
            self.connections -= 1
            deadlines.pop(scope, None)
            with trio.CancelScope(shield=True), contextlib.suppress(trio.BrokenResourceError, OSError):
                await stream.aclose()

    async def _fill(self, stream: trio.abc.Stream, buffer: bytearray) -> None:
        data = await receive_some(stream, _READ)
        if not data:
            raise _Disconnected()
        buffer += data

    async def _read_head(
        self, stream: trio.abc.Stream, buffer: bytearray, client: str | None
    ) -> tuple[ProxyRequest, bool, bool]:
        end = buffer.find(b"\r\n\r\n")
        while end < 0:
            if len(buffer) > MAX_HEAD:
                raise _BadRequest(431, "request head over 64 KiB")
            await self._fill(stream, buffer)
            end = buffer.find(b"\r\n\r\n")
        head = bytes(buffer[:end])
        del buffer[: end + 4]
        lines = head.split(b"\r\n")
        request_line = lines[0].split(b" ")
        if len(request_line) != 3 or not request_line[2].startswith(b"HTTP/1."):
            raise _BadRequest(400, "malformed request line")
        method, target, version = request_line
        if not method.isalpha() or not target.startswith(b"/"):
            raise _BadRequest(400, "malformed request line")
        if len(lines) > MAX_HEADERS + 1:
            raise _BadRequest(431, "too many headers")
        headers: list[tuple[bytes, bytes]] = []
        connection = b""
        expects_continue = False
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip() or b" " in name:
                raise _BadRequest(400, "malformed header")
            name = name.lower()
            value = value.strip()
            if name == b"connection":
                connection = value.lower()
            elif name == b"expect" and value.lower() == b"100-continue":
                expects_continue = True
            headers.append((name, value))
        if version == b"HTTP/1.1":
            keep_alive = b"close" not in connection
        else:
            keep_alive = b"keep-alive" in connection
            expects_continue = False
        path, _, query = target.partition(b"?")
        request = ProxyRequest(method.decode("ascii"), path, query, headers, b"", client)
        return request, keep_alive, expects_continue

    async def _read_body(self, stream: trio.abc.Stream, buffer: bytearray, request: ProxyRequest) -> bytes:
        length_header = request.header(b"content-length")
        encoding = request.header(b"transfer-encoding")
        if encoding is not None:
            if length_header is not None:
                raise _BadRequest(400, "both Content-Length and Transfer-Encoding")
            if encoding.lower() != b"chunked":
                raise _BadRequest(501, "only the chunked transfer encoding is supported")
            return await self._chunked(stream, buffer)
        if length_header is None:
            return b""
        if not length_header.isdigit():
            raise _BadRequest(400, "invalid Content-Length")
        length = int(length_header)
        if length > MAX_BODY:
            raise _BadRequest(413, f"request body over {MAX_BODY} bytes")
        while len(buffer) < length:
            await self._fill(stream, buffer)
        body = bytes(buffer[:length])
        del buffer[:length]
        return body

    async def _chunked(self, stream: trio.abc.Stream, buffer: bytearray) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            end = buffer.find(b"\r\n")
            while end < 0:
                if len(buffer) > MAX_HEAD:
                    raise _BadRequest(400, "malformed chunk")
                await self._fill(stream, buffer)
                end = buffer.find(b"\r\n")
            try:
                size = int(bytes(buffer[:end]).split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _BadRequest(400, "malformed chunk size") from None
            del buffer[: end + 2]
            if size == 0:
                while True:  # trailers up to the empty line
                    end = buffer.find(b"\r\n")
                    while end < 0:
                        await self._fill(stream, buffer)
                        end = buffer.find(b"\r\n")
                    line = bytes(buffer[:end])
                    del buffer[: end + 2]
                    if not line:
                        return b"".join(parts)
            total += size
            if total > MAX_BODY:
                raise _BadRequest(413, f"request body over {MAX_BODY} bytes")
            while len(buffer) < size + 2:
                await self._fill(stream, buffer)
            parts.append(bytes(buffer[:size]))
            del buffer[: size + 2]

    async def _send(self, stream: trio.abc.Stream, response: ProxyResponse, keep_alive: bool) -> None:
        status = response.status
        parts = [
            b"HTTP/1.1 ",
            str(status).encode(),
            b" ",
            _REASONS.get(status, b"Unknown"),
            b"\r\ndate: ",
            self._date.get(),
            b"\r\nserver: kanal-registry-proxy\r\n",
        ]
        for name, value in response.headers:
            parts += (name, b": ", value, b"\r\n")
        if not keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        parts.append(response.body)
        await send_all(stream, b"".join(parts))

    async def _own(self, request: ProxyRequest) -> ProxyResponse:
        """Calls the Quart app (metrics, health) through a minimal ASGI exchange."""
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": "http",
            "path": request.raw_path.decode("latin-1"),
            "raw_path": request.raw_path,
            "query_string": request.query,
            "root_path": "",
            "headers": request.headers,
            "client": None,
            "server": None,
            "extensions": {},
            "state": {},
        }
        sent = False
        result: dict[str, Any] = {"status": 500, "headers": [], "body": []}

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": request.body, "more_body": False}
            await trio.sleep_forever()
            raise AssertionError("unreachable")

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                result["status"] = message["status"]
                result["headers"] = [(bytes(k).lower(), bytes(v)) for k, v in message.get("headers", [])]
            elif message["type"] == "http.response.body":
                result["body"].append(bytes(message.get("body", b"")))

        await self.own_app(scope, receive, send)
        body = b"".join(result["body"])
        headers = [(k, v) for k, v in result["headers"] if k not in (b"content-length", b"transfer-encoding")]
        headers.append((b"content-length", str(len(body)).encode()))
        return ProxyResponse(int(result["status"]), headers, body)
