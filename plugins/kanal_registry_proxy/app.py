"""The proxy's HTTP app: a Quart app (quart-trio) with the registry routes on a lean ASGI path.

Quart serves the proxy's own endpoints: ``GET /metrics`` (Prometheus), ``GET /health/live`` and
``GET /health/ready`` (503 until authorization is ready, e.g. reactive permissions loaded). Every
other request is a registry call: it goes straight from ASGI to :class:`RegistryProxy`, without
Quart's request objects and routing, because registry routes match on the raw, still-encoded path
(a subject may hold ``%2F``), and because the proxy's cost per call must stay well under the
registry's own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, cast

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from quart import Response
from quart_trio import QuartTrio

from kanal_registry_proxy.metrics import ProxyMetrics
from kanal_registry_proxy.proxy import ProxyRequest, RegistryProxy, error

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OWN_PATHS = frozenset({"/metrics", "/health/live", "/health/ready"})
MAX_BODY = 16 * 1024 * 1024


class RegistryAsgi:
    """ASGI middleware: registry calls to the proxy, the rest to the wrapped (Quart) app."""

    def __init__(self, proxy: RegistryProxy, app: ASGIApp) -> None:
        self.proxy = proxy
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OWN_PATHS:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        if size > MAX_BODY:
            response = error(413, 41301, f"request body over {MAX_BODY} bytes")
            response.headers.append((b"content-length", str(len(response.body)).encode()))
        else:
            client = scope.get("client")
            request = ProxyRequest(
                scope["method"],
                scope.get("raw_path") or scope["path"].encode(),
                scope.get("query_string", b""),
                list(scope["headers"]),
                b"".join(chunks) if len(chunks) != 1 else chunks[0],
                f"{client[0]}:{client[1]}" if client else None,
            )
            response = await self.proxy.handle(request)
        await send({"type": "http.response.start", "status": response.status, "headers": response.headers})
        await send({"type": "http.response.body", "body": response.body})


def create_app(proxy: RegistryProxy, metrics: ProxyMetrics, ready: Callable[[], bool]) -> QuartTrio:
    app = QuartTrio("kanal_registry_proxy")
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), 200, content_type=CONTENT_TYPE_LATEST)

    @app.get("/health/live")
    async def live() -> Response:
        return Response("LIVE", 200, content_type="text/plain")

    @app.get("/health/ready")
    async def health_ready() -> Response:
        if ready():
            return Response("READY", 200, content_type="text/plain")
        return Response("NOTREADY", 503, content_type="text/plain")

    quart_asgi: Any = app.asgi_app
    app.asgi_app = cast(Any, RegistryAsgi(proxy, quart_asgi))  # type: ignore[method-assign]
    return app
