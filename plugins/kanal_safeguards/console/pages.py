"""The traffic-control pages (``/console/traffic``, ``/console/traffic/usage``) and their live
regions. Read-only: interceptors are changed through the admin API or the config file, and each
one links to its JSON there. The figures are this node's (see :mod:`.traffic` and :mod:`.usage`)."""

from __future__ import annotations

import heapq
import time
from typing import Any
from urllib.parse import urlencode

from quart import request

from kanal.api import ConsolePages, GatewayServices, Manifest
from kanal_safeguards.console.traffic import AREAS, SAMPLE_EVERY, Row, TrafficHistory, area_of, clock, rows_of, size
from kanal_safeguards.console.usage import GROUPINGS, PAGE_SIZE, SORTS, usage_rows
from kanal_safeguards.limits.fleet_usage import installed_limits
from kanal_safeguards.limits.rate_limits import counted_bytes
from kanal_safeguards.usage.chargeback import Chargeback, counted_usage

__all__ = ["add_traffic_pages"]

#: Seconds between two refreshes of the live regions.
LIVE_EVERY = 3
USAGE_EVERY = 5
#: What the charts call each byte-rate type's bytes.
_CHARTS = {
    "producer-rate-limiting": "Bytes produced per second",
    "consumer-rate-limiting": "Bytes fetched per second",
}
#: Bars of the chargeback chart (the rows with the most bytes).
_BARS = 10


def _int(text: str | None, default: int, low: int, high: int) -> int:
    try:
        return min(max(int(text or default), low), high)
    except ValueError:
        return default


def add_traffic_pages(console: ConsolePages, services: GatewayServices) -> None:
    """Registers the pages, and starts the sampling of the byte counters for the charts."""
    history = TrafficHistory(lambda: counted_bytes(services))
    services.start_soon(history.run, name="console: traffic samples")

    def manifests() -> list[tuple[Manifest, str]]:
        """The safeguards interceptors, from the config file and stored (with their status on this node)."""
        kind = console.kinds.get("Interceptor")
        if kind is None:
            return []

        def ours(manifest: Manifest) -> bool:
            return area_of(str((manifest.get("spec") or {}).get("pluginClass"))) is not None

        static = [(m, "config file") for m in (kind.static() if kind.static else []) if ours(m)]
        stored = [
            (console.store.with_status(kind, m), "admin API") for m in console.store.resources("Interceptor") if ours(m)
        ]
        return [*static, *stored]

    def rows() -> list[Row]:
        totals = counted_bytes(services)
        members = max(1, len(services.fleet.members))
        return rows_of(manifests(), installed_limits(services), members, totals, history.recent(totals))

    def live(all_rows: list[Row]) -> dict[str, Any]:
        """What the live region shows: the limits with their figures, and the charts."""
        limits = [(area, [r for r in all_rows if r.area is area]) for area in AREAS if area.limits]
        charts = []
        for plugin, title in _CHARTS.items():
            if any(r.plugin == plugin and r.applied for r in all_rows):
                values, labels = history.rates(plugin)
                charts.append({"plugin": plugin, "title": title, "values": values, "labels": labels})
        return {
            "areas": [(area, area_rows) for area, area_rows in limits if area_rows],
            "charts": charts,
            "at": clock(time.time()),
            "sample_every": SAMPLE_EVERY,
            "members": max(1, len(services.fleet.members)),
        }

    @console.page("traffic", "Traffic control")
    async def traffic_page() -> Any:
        """Every safeguards interceptor by what it does; the limits with this node's share and
        counts, and the charts of the last minutes, refreshed live."""
        all_rows = rows()
        others = [(area, [r for r in all_rows if r.area is area]) for area in AREAS if not area.limits]
        return console.render(
            "safeguards/traffic.html",
            title="Traffic control",
            count=len(all_rows),
            live=live(all_rows),
            others=[(area, area_rows) for area, area_rows in others if area_rows],
            empty=[area.title for area in AREAS if not any(r.area is area for r in all_rows)],
            chargeback=any(r.plugin == Chargeback.plugin_name for r in all_rows),
            every=LIVE_EVERY,
        )

    @console.page("traffic/live")
    async def traffic_live() -> Any:
        """The limits and charts alone: the traffic page's live region."""
        return console.render("safeguards/traffic_live.html", title="Traffic control", live=live(rows()))

    def usage_context() -> dict[str, Any]:
        by = request.args.get("by", "owner")
        by = by if by in GROUPINGS else "owner"
        sort = request.args.get("sort", "bytes")
        sort = sort if sort in SORTS else "bytes"
        query = request.args.get("q", "").strip()
        table = usage_rows(counted_usage(services), by, sort, query)
        pages = max(1, -(-len(table) // PAGE_SIZE))
        page = _int(request.args.get("page"), 1, 1, pages)
        shown = table[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
        bars = heapq.nsmallest(_BARS, table, key=lambda r: (-r.total, r.name))
        return {
            "by": by,
            "sort": sort,
            "query": query,
            "page": page,
            "pages": pages,
            "total": len(table),
            "rows": shown,
            "groupings": GROUPINGS,
            "sorts": SORTS,
            "size": size,
            "sums": {
                "bytes_in": sum(r.bytes_in for r in table),
                "bytes_out": sum(r.bytes_out for r in table),
                "requests_in": sum(r.requests_in for r in table),
                "requests_out": sum(r.requests_out for r in table),
            },
            "chart": {
                "values": [r.total for r in bars],
                "labels": [r.name or "(none)" for r in bars],
            },
            "query_string": urlencode({"by": by, "sort": sort, "q": query, "page": page}),
            "at": clock(time.time()),
        }

    @console.page("traffic/usage")
    async def usage_page() -> Any:
        """What the chargeback interceptors counted on this node, by principal, topic or client id,
        sortable, a page at a time, refreshed live."""
        installed = any(r.plugin == Chargeback.plugin_name for r in rows())
        return console.render(
            "safeguards/usage.html", title="Chargeback usage", installed=installed, every=USAGE_EVERY, **usage_context()
        )

    @console.page("traffic/usage/table")
    async def usage_table() -> Any:
        """The chargeback table alone: the usage page's live region."""
        return console.render("safeguards/usage_table.html", title="Chargeback usage", **usage_context())
