"""A small HTTP/1.1 client on trio and h11, for the schema registry and alert webhooks.

One connection per call (registry lookups happen on cache misses only, webhooks when an alert fires),
a deadline over the whole call, ``http`` and ``https``. Raises :class:`HttpError` for anything that is
not an HTTP answer (refused, timed out, TLS failure, malformed response).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11
import trio

__all__ = ["HttpError", "Response", "request"]

_MAX_BODY = 16 * 1024 * 1024


class HttpError(Exception):
    """The server could not be reached, or did not answer with HTTP in time."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    headers: Mapping[str, str]


_ssl_context: ssl.SSLContext | None = None


def _context() -> ssl.SSLContext:
    global _ssl_context
    if _ssl_context is None:
        _ssl_context = ssl.create_default_context()
    return _ssl_context


async def request(
    method: str,
    url: str,
    *,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 5.0,
) -> Response:
    """One HTTP call; the whole exchange must finish within ``timeout`` seconds."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HttpError(f"not an http(s) URL: {url!r}")
    host = parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    out_headers = [("Host", parts.netloc.rsplit("@", 1)[-1]), ("Connection", "close"), ("User-Agent", "kanal")]
    for name, value in (headers or {}).items():
        out_headers.append((name, value))
    if body is not None:
        out_headers.append(("Content-Length", str(len(body))))
    try:
        with trio.fail_after(timeout):
            return await _exchange(parts.scheme, host, port, method, target, out_headers, body)
    except trio.TooSlowError:
        raise HttpError(f"{method} {url}: no answer within {timeout:g}s") from None
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError) as exc:
        raise HttpError(f"{method} {url}: {exc or type(exc).__name__}") from None
    except h11.ProtocolError as exc:
        raise HttpError(f"{method} {url}: malformed HTTP response: {exc}") from None


async def _exchange(
    scheme: str,
    host: str,
    port: int,
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    body: bytes | None,
) -> Response:
    stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
    try:
        if scheme == "https":
            tls = trio.SSLStream(stream, _context(), server_hostname=host)
            await tls.do_handshake()
            stream = tls
        connection = h11.Connection(h11.CLIENT)
        data = connection.send(h11.Request(method=method, target=target, headers=headers))
        if body is not None:
            data += connection.send(h11.Data(data=body))
        data += connection.send(h11.EndOfMessage())
        await stream.send_all(data)
        status = 0
        response_headers: dict[str, str] = {}
        chunks: list[bytes] = []
        size = 0
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                received = await stream.receive_some(65536)
                connection.receive_data(bytes(received))
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                response_headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > _MAX_BODY:
                    raise HttpError("response body too large")
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                if not status:
                    raise HttpError("connection closed before a response")
                return Response(status, b"".join(chunks), response_headers)
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()
