"""The core's console pages: the gateway (health, version, plugins, fleet, key metrics as charts)
and the interceptors (the list, and the effective chain for a principal)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from quart import Response, request

from kanal import __version__
from kanal.admin.console.app import Console
from kanal.admin.console.metrics_history import MetricsHistory
from kanal.admin.fleet import fleet_view
from kanal.admin.host import GatewayHost
from kanal.admin.interceptors import plugin_catalogue, resolve
from kanal.api.resources import ResourceError
from kanal.protocol.records import record_walker

__all__ = ["add_gateway_pages"]


def _clock(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S")


def _size(value: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} GB"  # (not reached)


def _charts(history: MetricsHistory) -> list[dict[str, Any]]:
    rates = history.rates()
    labels = [_clock(r[0]) for r in rates]
    return [
        {"title": "Requests per second", "values": [r[1] for r in rates], "labels": labels},
        {"title": "Bytes in per second", "values": [r[2] for r in rates], "labels": labels},
        {"title": "Bytes out per second", "values": [r[3] for r in rates], "labels": labels},
        {"title": "Open client connections", "values": [r[4] for r in rates], "labels": labels},
    ]


def add_gateway_pages(console: Console, gateway: GatewayHost, history: MetricsHistory, started: float) -> None:
    store = console.store

    def health() -> dict[str, Any]:
        ready = store.loaded.is_set() and store.reachable()
        last = history.samples[-1] if history.samples else None
        return {
            "ready": ready,
            "version": __version__,
            "uptime": int(time.time() - started),
            "walker": record_walker(),
            "cluster": gateway.settings.cluster_id,
            "connections": int(last.connections) if last else 0,
            "sent": _size(last.bytes_out) if last else _size(0),
            "received": _size(last.bytes_in) if last else _size(0),
        }

    @console.page("gateway", "Gateway")
    async def gateway_page() -> Response:
        """Health, version, plugins, fleet members and the last hour of key metrics."""
        membership = gateway.fleet
        fleet = fleet_view(membership.status(), membership.balancer) if membership is not None else None
        plugins = plugin_catalogue(gateway.registry)
        return console.render(
            "console/gateway.html",
            title="Gateway",
            health=health(),
            plugins=plugins,
            fleet=fleet,
            charts=_charts(history),
        )

    @console.page("gateway/metrics")
    async def gateway_metrics() -> Response:
        """The charts alone: the gateway page's live region."""
        return console.render("console/gateway_metrics.html", title="Metrics", charts=_charts(history))

    @console.page("interceptors", "Interceptors")
    async def interceptors_page() -> Response:
        """Every interceptor (stored and from the config file), and the chain a principal gets."""
        kind = console.kinds.get("Interceptor")
        stored = [store.with_status(kind, m) for m in store.resources("Interceptor")] if kind else []
        static = list(kind.static()) if kind is not None and kind.static else []
        rows = [
            {
                "name": m["metadata"].get("name"),
                "scope": m["metadata"].get("scope") or {},
                "plugin": m["spec"].get("pluginClass"),
                "priority": m["spec"].get("priority"),
                "status": (m.get("status") or {}).get("status") or ("Ready" if m in static else None),
                "source": "config file" if m in static else "admin API",
                "config": m["spec"].get("config"),
            }
            for m in [*static, *stored]
        ]
        rows.sort(key=lambda r: (r["priority"] if isinstance(r["priority"], int) else 0, str(r["name"])))
        query = {k: request.args.get(k, "").strip() for k in ("username", "vCluster", "groups")}
        chain: list[Any] | None = None
        error: str | None = None
        if kind is not None and any(query.values()):
            body: dict[str, Any] = {}
            if query["username"]:
                body["username"] = query["username"]
            if query["vCluster"]:
                body["vCluster"] = query["vCluster"]
            if query["groups"]:
                body["groups"] = [g.strip() for g in query["groups"].split(",") if g.strip()]
            try:
                chain = resolve(gateway, kind, body)
            except ResourceError as exc:
                error = exc.msg
        return console.render(
            "console/interceptors.html", title="Interceptors", rows=rows, query=query, chain=chain, error=error
        )
