"""What the traffic-control page shows, worked out without the web framework (so that it is tested
as plain data): the safeguards interceptors grouped by what they do, and for each rate or request
limit the figures of this node, read from the installed interceptors themselves.

- The interceptors are the Interceptor resources (stored and from the config file) whose
  ``pluginClass`` is one of this plugin's types, with their status on this node.
- A limit's share is its :class:`~kanal_safeguards.limits.fleet_usage.SharedLimit` (what
  ``kanal_limit_share`` reports): the whole limit on a node alone, this node's part in a fleet.
- Bytes are the byte-rate limiters' counter (``kanal_rate_limit_bytes_total``), which counts by
  interceptor type; events are what a request limit's sliding window holds.
- :class:`TrafficHistory` samples the byte counter every :data:`SAMPLE_EVERY` seconds for the
  charts of the last minutes (kept in memory, this node only).
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import quote, urlencode

import trio

from kanal.api import Interceptor, Manifest
from kanal_safeguards import caching, chaos, claim_check, policies, usage
from kanal_safeguards.limits.fleet_usage import SharedLimit
from kanal_safeguards.limits.rate_limits import INTERCEPTORS as BYTE_RATE_TYPES
from kanal_safeguards.limits.requests import LimitCommitOffset, LimitConnection, LimitJoinGroup

__all__ = [
    "AREAS",
    "SAMPLES",
    "SAMPLE_EVERY",
    "Area",
    "LimitFigures",
    "Row",
    "TrafficHistory",
    "area_of",
    "clock",
    "config_summary",
    "json_url",
    "limit_figures",
    "rows_of",
    "size",
]

#: Seconds between two samples of the byte counters, and how many are kept (five minutes).
SAMPLE_EVERY: Final = 2.0
SAMPLES: Final = 150
#: The span of the "counted recently" rate (at least two samples).
RECENT: Final = 10.0
#: The longest config value the summary shows; the JSON has the rest.
_LONGEST: Final = 160
#: Config keys whose values are never shown (claim checks' S3 credentials).
_SECRET: Final = re.compile(r"secret|password|token|credential", re.IGNORECASE)
#: How a manifest's scope names the clients in no virtual cluster (absent) and every one (``*``),
#: and how the core's spec does (``passthrough``, None): to find a manifest's live instance.
_PASSTHROUGH: Final = "passthrough"
_EVERY: Final = "*"


@dataclass(frozen=True, slots=True)
class Area:
    """What a group of interceptor types does."""

    key: str
    title: str
    about: str
    types: tuple[type[Interceptor], ...]

    @property
    def limits(self) -> bool:
        """Whether its interceptors have figures (rate and request limits)."""
        return self.key in ("rate-limits", "request-limits")


AREAS: Final[tuple[Area, ...]] = (
    Area(
        "policies",
        "Policies",
        "Rules on what clients may do: topics, configs, produce and fetch settings, groups, client ids.",
        tuple(policies.INTERCEPTORS),
    ),
    Area(
        "rate-limits",
        "Byte-rate limits",
        "Bytes per second produced or fetched: a broker-style quota that throttles and holds, never fails.",
        tuple(BYTE_RATE_TYPES),
    ),
    Area(
        "request-limits",
        "Request limits",
        "Offset commits and group joins per minute per group, new connections per second.",
        (LimitCommitOffset, LimitJoinGroup, LimitConnection),
    ),
    Area("cache", "Cache", "Fetch answers served from the gateway's cache.", tuple(caching.INTERCEPTORS)),
    Area("chaos", "Chaos", "Injected failures and delays (test environments).", tuple(chaos.INTERCEPTORS)),
    Area(
        "claim-checks",
        "Claim checks",
        "Large messages and batches stored in an object store, a reference produced instead.",
        tuple(claim_check.INTERCEPTORS),
    ),
    Area("usage", "Usage and headers", "Chargeback counts and injected headers.", tuple(usage.INTERCEPTORS)),
)


def _names_of(cls: type[Interceptor]) -> tuple[str, ...]:
    """The names a ``pluginClass`` may give a type by (as the core resolves them)."""
    return (cls.plugin_name, f"{cls.__module__}:{cls.__qualname__}", f"{cls.__module__}.{cls.__qualname__}")


_AREA_OF: Final[dict[str, tuple[Area, str]]] = {
    name: (area, cls.plugin_name) for area in AREAS for cls in area.types for name in _names_of(cls)
}


_BYTE_RATES: Final = frozenset(cls.plugin_name for cls in BYTE_RATE_TYPES)


def area_of(plugin: str) -> tuple[Area, str] | None:
    """The area of a ``pluginClass`` and its type name, or None for another plugin's type."""
    return _AREA_OF.get(plugin)


def size(value: float) -> str:
    """A byte count as people read it (KB are 1024 bytes, as the gateway page has them)."""
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} GB"  # (not reached)


def clock(at: float) -> str:
    """A chart's label: the time of day (UTC)."""
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S")


def _shown(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, int | float):
        text = f"{value:,}"
    else:
        text = json.dumps(_hidden(value), separators=(", ", ": "), ensure_ascii=False, default=str)
    return text if len(text) <= _LONGEST else text[: _LONGEST - 1] + "…"


def _hidden(value: Any) -> Any:
    """``value`` with its secrets' values replaced (nested objects too)."""
    if isinstance(value, Mapping):
        return {k: "(hidden)" if _SECRET.search(str(k)) else _hidden(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_hidden(v) for v in value]
    return value


def config_summary(config: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """An interceptor's config as (key, text) pairs: strings as they are, objects as compact JSON,
    long values cut, secrets hidden. Plain text: the page escapes it."""
    return [(str(k), "(hidden)" if _SECRET.search(str(k)) else _shown(v)) for k, v in (config or {}).items()]


@dataclass(frozen=True, slots=True)
class LimitFigures:
    """A rate or request limit as this node enforces it now."""

    limit: str  # "200,000 bytes per second per principal"
    share: str  # this node's share, in the limit's unit
    whole: bool  # the share is the whole limit (a node alone, or the others idle)
    sharing: bool  # the node shares the limit with other members (counts usage for them)
    keys: int  # principals, virtual clusters or groups with a share of their own
    counted: str  # bytes since the gateway started, or events in the last window
    recent: str | None  # bytes per second over the last seconds (byte rates)
    by_type: bool  # the bytes are those of every interceptor of the type on this node


@dataclass(slots=True)
class Row:
    """One safeguards interceptor as the page lists it."""

    name: str
    plugin: str
    area: Area
    priority: Any
    scope: dict[str, str]
    status: str | None
    message: str | None
    source: str  # "admin API" or "config file"
    config: list[tuple[str, str]]
    json_url: str
    limit: LimitFigures | None = None
    applied: bool = False  # a live instance of it was found on this node (limits only)


def _key_of_manifest(manifest: Manifest) -> tuple[Any, ...]:
    metadata = manifest["metadata"]
    scope = metadata.get("scope") or {}
    vcluster = scope.get("vCluster")
    core_vcluster = _PASSTHROUGH if vcluster in (None, "") else None if vcluster == _EVERY else vcluster
    return (metadata.get("name"), core_vcluster, scope.get("group"), scope.get("username"))


def _key_of_instance(interceptor: Interceptor) -> tuple[Any, ...] | None:
    spec = interceptor.spec
    if spec is None:
        return None
    return (spec.name, spec.scope.vcluster, spec.scope.group, spec.scope.username)


def json_url(manifest: Manifest) -> str:
    """The admin API's address of the interceptor (its scope as query parameters)."""
    metadata = manifest["metadata"]
    scope = {k: v for k, v in (metadata.get("scope") or {}).items() if v}
    query = f"?{urlencode(scope)}" if scope else ""
    return f"/gateway/v2/interceptor/{quote(str(metadata.get('name')), safe='')}{query}"


def _per(limit_by: Any) -> str:
    by = getattr(limit_by, "value", limit_by)
    return {"PRINCIPAL": " per principal", "VCLUSTER": " per virtual cluster"}.get(str(by), "")


def _limit_text(plugin: str, config: Any, shared: SharedLimit) -> tuple[str, str]:
    """The limit as a sentence, and the unit of the share."""
    limit = shared.limit
    if plugin in ("producer-rate-limiting", "consumer-rate-limiting"):
        return f"{limit:,.0f} bytes per second{_per(getattr(config, 'limit_by', None))}", "bytes per second"
    if plugin == "limit-commit-offset":
        return f"{limit:,.0f} offset commits per minute per group", "per minute"
    if plugin == "limit-join-group":
        return f"{limit:,.0f} group joins per minute per group", "per minute"
    if plugin == "limit-connection":
        return f"{limit:,.0f} new connections per second", "per second"
    unit = "per second" if shared.seconds == 1 else f"per {shared.seconds:g} s"
    return f"{limit:,.0f} {unit}", unit


def limit_figures(
    shared: SharedLimit,
    members: int,
    totals: Mapping[str, float],
    recent: Mapping[str, float | None],
    same_type: int,
) -> LimitFigures:
    """The figures of one installed limiter: ``totals`` and ``recent`` are the byte counts and
    rates by type (:class:`TrafficHistory`), ``same_type`` how many installed limiters share them."""
    owner = shared.owner
    plugin = owner.plugin_name
    limit, unit = _limit_text(plugin, owner.config, shared)
    share = shared.share
    whole = share >= shared.limit - 1e-9
    if whole:
        share_text = f"{share:,.0f} {unit} (the whole limit" + (": this node is alone)" if members <= 1 else ")")
    else:
        share_text = f"{share:,.0f} {unit} ({share / shared.limit:.0%} of the limit, a fleet of {members})"
    window = getattr(owner, "window", None)
    if plugin in _BYTE_RATES or window is None:
        counted = f"{totals.get(plugin, 0.0):,.0f} bytes"
        rate = recent.get(plugin)
        recent_text = None if rate is None else f"{size(rate)}/s"
        by_type = same_type > 1
    else:
        events = window.recent()
        counted = f"{events:,} in the last {window.seconds:g} s"
        recent_text, by_type = None, False
    return LimitFigures(
        limit=limit,
        share=share_text,
        whole=whole,
        sharing=shared.active,
        keys=shared.keys,
        counted=counted,
        recent=recent_text,
        by_type=by_type,
    )


def rows_of(
    manifests: Iterable[tuple[Manifest, str]],
    limits: Sequence[SharedLimit],
    members: int,
    totals: Mapping[str, float],
    recent: Mapping[str, float | None],
) -> list[Row]:
    """Every safeguards interceptor of ``manifests`` (each with its source, its status on this node
    in ``status``), in the order of the areas then of priority and name, with the figures of its
    live limiter among ``limits`` for the rate and request limits."""
    live: dict[tuple[Any, ...], SharedLimit] = {}
    per_type: dict[str, int] = {}
    for shared in limits:  # (a replaced instance may linger while it closes: the newer one wins)
        key = _key_of_instance(shared.owner)
        if key is not None:
            live[key] = shared
    for shared in live.values():
        per_type[shared.owner.plugin_name] = per_type.get(shared.owner.plugin_name, 0) + 1
    rows: list[Row] = []
    for manifest, source in manifests:
        spec = manifest.get("spec") or {}
        found = area_of(str(spec.get("pluginClass")))
        if found is None:
            continue
        area, plugin = found
        status = manifest.get("status") or {}
        row = Row(
            name=str(manifest["metadata"].get("name")),
            plugin=plugin,
            area=area,
            priority=spec.get("priority", 100),
            scope={k: str(v) for k, v in (manifest["metadata"].get("scope") or {}).items() if v},
            status=status.get("status") or ("Ready" if source == "config file" else None),
            message=status.get("message"),
            source=source,
            config=config_summary(spec.get("config")),
            json_url=json_url(manifest),
        )
        installed = live.get(_key_of_manifest(manifest)) if area.limits else None
        if installed is not None:
            row.applied = True
            row.limit = limit_figures(installed, members, totals, recent, per_type.get(plugin, 1))
        rows.append(row)
    order = {area.key: i for i, area in enumerate(AREAS)}
    rows.sort(key=lambda r: (order[r.area.key], r.priority if isinstance(r.priority, int) else 0, r.name, str(r.scope)))
    return rows


class TrafficHistory:
    """The byte-rate limiters' counters, sampled every :data:`SAMPLE_EVERY` seconds for the last
    :data:`SAMPLES` samples: the page's charts and its "recently" rates. ``read`` returns the bytes
    counted so far by interceptor type; the clock is injectable for tests."""

    def __init__(
        self,
        read: Callable[[], Mapping[str, float]],
        *,
        clock: Callable[[], float] = time.time,
        samples: int = SAMPLES,
    ) -> None:
        self.read = read
        self.clock = clock
        self.samples: deque[tuple[float, dict[str, float]]] = deque(maxlen=samples)

    def sample(self) -> None:
        """Takes one sample of the counters."""
        self.samples.append((self.clock(), dict(self.read())))

    async def run(self) -> None:
        """Samples until cancelled (with the gateway)."""
        while True:
            self.sample()
            await trio.sleep(SAMPLE_EVERY)

    def rates(self, plugin: str) -> tuple[list[float], list[str]]:
        """The bytes per second of ``plugin`` between consecutive samples, and their times."""
        values: list[float] = []
        labels: list[str] = []
        previous: tuple[float, dict[str, float]] | None = None
        for at, counts in self.samples:
            if previous is not None and at > previous[0] and plugin in counts:
                before = previous[1].get(plugin, 0.0)
                values.append(max(0.0, counts[plugin] - before) / (at - previous[0]))
                labels.append(clock(at))
            previous = (at, counts)
        return values, labels

    def recent(self, now_counts: Mapping[str, float], span: float = RECENT) -> dict[str, float | None]:
        """Bytes per second of each type over about the last ``span`` seconds: from the newest
        sample at least ``span`` old (or the oldest) to ``now_counts``, read now. None for a type
        that has no sample old enough to say."""
        now = self.clock()
        base: tuple[float, dict[str, float]] | None = None
        for at, counts in self.samples:
            if base is None or now - at >= span:
                base = (at, counts)
            else:
                break
        out: dict[str, float | None] = {}
        for plugin, total in now_counts.items():
            if base is None or now - base[0] < SAMPLE_EVERY / 2:
                out[plugin] = None
                continue
            out[plugin] = max(0.0, total - base[1].get(plugin, 0.0)) / (now - base[0])
        return out
