"""Fleet-wide limits: the I/O that makes a limit declared once hold for the whole fleet.

The limiters (byte rates, commits and joins per minute, connections per second) count on their hot
path what they let through, per key, into a :class:`SharedLimit`: a dict increment, no I/O, no
lock. One background task per gateway (:class:`FleetLimits`, started with the first limiter) does
the rest, and only while the fleet has more than one member (a node alone keeps the whole limit and
never touches the cluster):

- once a :data:`~kanal_safeguards.limits.shares.PERIOD`, on the wall clock's period boundary, it
  publishes this node's usage of every limit (:class:`~kanal_safeguards.limits.shares.Report`) to a
  compacted topic of the backing cluster, keyed by the node's fleet id;
- it follows that topic (from its end: older reports are of no use) and keeps each node's last one;
- half a period after the boundary, when every node's report of the period has arrived, and at once
  when the membership changes, it works out this node's shares
  (:func:`~kanal_safeguards.limits.shares.node_shares`) from the live members' fresh reports, its
  own as it published it, and sets them in the limiters in place (a bucket's rate, a window's limit);
- it deletes its report when it stops; the fleet's leader deletes the reports of nodes that left
  without doing so (killed) a minute after they left.

When the topic cannot be written or read, it logs it once and the node takes its base share (limit
/ members); a node that cannot read says so in its reports (and one that cannot write has none), so
the others reserve it that share: the fleet still adds up to the limit.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

import trio
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kanal.api import GatewayServices, Interceptor, LogError, LogRecord, StateLog
from kanal_safeguards.limits.shares import (
    PERIOD,
    STALE_AFTER,
    Demand,
    NodeShares,
    Report,
    busiest,
    key_of,
    key_text,
    members_of,
    node_shares,
    usable_reports,
)

__all__ = ["TOPIC_SETTING", "FleetLimits", "SharedLimit", "fleet_limits", "installed_limits", "usage_topic"]

log = logging.getLogger(__name__)

#: The variable naming the usage topic (default ``_kanal_<GATEWAY_CLUSTER_ID>_limit_usage``).
TOPIC_SETTING = "GATEWAY_LIMIT_USAGE_TOPIC"
#: Seconds a node that left the fleet keeps its report before the leader deletes it.
CLEANUP_AFTER = 60.0
_SHARED = "limits.fleet"  # the gateway's FleetLimits, in the plugin's shared state
_WRITE_TIMEOUT = 2.0  # the last report's deletion at shutdown
_RETRY = 5.0  # seconds before sharing again after an unexpected failure


def usage_topic(services: GatewayServices) -> str:
    """The compacted topic the nodes publish their usage to."""
    configured = services.settings(TOPIC_SETTING).get(TOPIC_SETTING, "").strip()
    return configured or f"_kanal_{services.cluster_id}_limit_usage"


ApplyShares = Callable[[float, Mapping[Hashable, float]], None]


class SharedLimit:
    """One limiter's side of the sharing: the usage its hot path counts (:meth:`add`, only while the
    node shares its limits), and the shares it is given (``apply(default, by_key)``: the limit of any
    key, and of the keys some node used)."""

    __slots__ = (
        "_apply",
        "active",
        "history",
        "integral",
        "key",
        "keys",
        "last_roll",
        "limit",
        "over",
        "owner",
        "seconds",
        "share",
        "single",
        "used",
    )

    def __init__(
        self,
        owner: Interceptor,
        limit: float,
        *,
        seconds: float,
        integral: bool,
        apply: ApplyShares,
        single: bool = False,
        key: Hashable = None,
    ) -> None:
        self.owner = owner
        self.single = single  # one bucket for everyone, under ``key`` (limitBy RULE, limit-connection)
        self.key = key
        self.limit = float(limit)
        self.seconds = seconds  # what the limit counts over: 1 (per second) or 60 (per minute)
        self.integral = integral
        self._apply = apply
        self.active = False  # counting usage (the node shares its limits)
        self.used: dict[Hashable, float] = {}
        self.over: set[Hashable] = set()
        # (used, over, seconds) of the last periods, covering the limit's window
        self.history: deque[tuple[dict[Hashable, float], set[Hashable], float]] = deque(
            maxlen=max(1, math.ceil(seconds / PERIOD))
        )
        self.last_roll = 0.0
        self.share = self.limit  # this node's share of the one key, or of a key no node used (the metric)
        self.keys = 0  # the keys with a share of their own (the metric)

    @property
    def limit_id(self) -> str | None:
        """The limit across the fleet: its interceptor's plugin, name and scope (None before the core
        has told the interceptor its spec)."""
        spec = self.owner.spec
        if spec is None:
            return None
        scope = spec.scope
        return key_text((spec.plugin, spec.name, scope.vcluster, scope.group, scope.username))

    def add(self, key: Hashable, amount: float, over: bool) -> None:
        """Counts ``amount`` used by ``key`` (``over``: some of it was held, throttled or refused)."""
        used = self.used
        used[key] = used.get(key, 0.0) + amount
        if over:
            self.over.add(key)

    def start(self, now: float) -> None:
        """Starts counting (the node now shares its limits)."""
        if not self.active:
            self.used, self.over = {}, set()
            self.history.clear()
            self.last_roll = now
            self.active = True

    def stop(self) -> None:
        """Stops counting and takes the whole limit again (the node is alone)."""
        self.active = False
        self.used, self.over = {}, set()
        self.history.clear()
        self.apply(None)

    def roll(self, now: float) -> dict[str, Demand]:
        """Ends a period: its counts join the history; returns the demand of every key used over the
        limit's window, in the limit's unit (the busiest :data:`~shares.MAX_KEYS`)."""
        used, over, self.used, self.over = self.used, self.over, {}, set()
        self.history.append((used, over, max(now - self.last_roll, 1e-3)))
        self.last_roll = now
        totals: dict[Hashable, float] = {}
        limited: set[Hashable] = set()
        seconds = 0.0
        for period_used, period_over, period_seconds in self.history:
            for key, amount in period_used.items():
                totals[key] = totals.get(key, 0.0) + amount
            limited |= period_over
            seconds += period_seconds
        # per second: the rate of the last period; per window: the count over the last window (not
        # extrapolated from a shorter span)
        scale = self.seconds / (seconds if self.history.maxlen == 1 else max(seconds, self.seconds))
        demands = {key_text(k): Demand(amount * scale, k in limited) for k, amount in totals.items()}
        for key in limited - totals.keys():
            demands[key_text(key)] = Demand(0.0, True)
        return busiest(demands)

    def apply(self, shares: NodeShares | None) -> None:
        """Gives the limiter its shares (None: the whole limit, for a node alone)."""
        if shares is None:
            self.share, self.keys = self.limit, 0
            self._apply(self.limit, {})
            return
        by_key: dict[Hashable, float] = {}
        for text, share in shares.by_key.items():
            try:
                by_key[key_of(text)] = share
            except ValueError:
                continue
        self.share = by_key.get(self.key, shares.default) if self.single else shares.default
        self.keys = len(by_key)
        self._apply(shares.default, by_key)


class FleetLimits:
    """The gateway's fleet-wide limits: the limiters registered, the reports of the fleet, the task
    that publishes, follows and applies (:meth:`run`). ``wall`` is the clock periods are aligned on
    (every node publishes on the same boundaries); tests give trio's."""

    def __init__(self, services: GatewayServices, *, wall: Callable[[], float] = time.time) -> None:
        self.services = services
        self.fleet = services.fleet
        self.topic = usage_topic(services)
        self.wall = wall
        self.limits: list[SharedLimit] = []
        self.reports: dict[str, tuple[Report, float]] = {}  # node id -> its last report, when it came
        self.own: tuple[Report, float] | None = None  # this node's last report published, when
        self.read_at: float | None = None  # when the topic was last read (None: not followed)
        self.sharing = False
        self._changed = trio.Event()
        self._failing: set[str] = set()  # what fails now ("read", "write"): logged once per outage

    # -- the limiters

    def add(self, limit: SharedLimit) -> None:
        """Registers a limiter; while the node shares, it gets its shares at once."""
        self.limits.append(limit)
        if self.sharing:
            limit.start(trio.current_time())
            self._apply(limit, *self._view())
        self._signal()

    def remove(self, limit: SharedLimit) -> None:
        """Unregisters a limiter (its interceptor is closed)."""
        if limit in self.limits:
            self.limits.remove(limit)
            self._signal()

    def _signal(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    # -- the shares

    def _reading(self, now: float) -> bool:
        return self.read_at is not None and now - self.read_at <= STALE_AFTER

    def _view(self) -> tuple[list[str], dict[str, Report]]:
        """The live members and their usable reports: fresh ones, this node's as it published it;
        none when this node cannot follow the topic (every node then has its base share)."""
        now = trio.current_time()
        me = self.fleet.node_id
        members = members_of((m.node_id for m in self.fleet.members), me)
        return members, usable_reports(self.reports, self.own, members, me, now, reading=self._reading(now))

    def _apply(self, limit: SharedLimit, members: list[str], reports: dict[str, Report]) -> None:
        limit_id = limit.limit_id
        if limit_id is None:  # not configured by the core (a test's own instance): per node
            return
        shares = node_shares(limit_id, limit.limit, members, self.fleet.node_id, reports, integral=limit.integral)
        limit.apply(shares)

    def recompute(self) -> None:
        """Applies this node's shares of every limit, from the reports as they stand."""
        members, reports = self._view()
        for limit in self.limits:
            self._apply(limit, members, reports)

    # -- the task

    def _should_share(self) -> bool:
        return bool(self.limits) and len(members_of((m.node_id for m in self.fleet.members), self.fleet.node_id)) > 1

    async def _wait_change(self) -> None:
        """Returns once the membership or the limiters changed."""
        changed = self._changed
        async with trio.open_nursery() as nursery:

            async def fleet_changed() -> None:
                await self.fleet.changed()
                nursery.cancel_scope.cancel()

            async def limits_changed() -> None:
                await changed.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(fleet_changed)
            nursery.start_soon(limits_changed)

    async def run(self) -> None:
        """Shares the limits while the fleet has several members and limiters are registered; alone,
        every limiter has its whole limit. Runs until cancelled (with the gateway)."""
        while True:
            if not self._should_share():
                for limit in self.limits:
                    if limit.active or limit.share != limit.limit:
                        limit.stop()
                await self._wait_change()
                continue
            try:
                await self._share()
            except Exception:  # a bug: the limits must not stay at stale shares, nor the task die
                log.exception("fleet-wide limits: sharing failed; this node takes limit / members, retrying")
                self.recompute()  # base shares (no reports any more)
                await trio.sleep(_RETRY)

    async def _share(self) -> None:
        # two logs: the follower's long polls never delay a report
        reader = self.services.state_log(self.topic)
        writer = self.services.state_log(self.topic)
        self.sharing = True
        now = trio.current_time()
        for limit in self.limits:
            limit.start(now)
        self.recompute()  # base shares at once (no report yet)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._follow, reader)
                nursery.start_soon(self._publish, writer)
                nursery.start_soon(self._compute)
                while True:
                    await self._wait_change()
                    if not self._should_share():
                        nursery.cancel_scope.cancel()
                        break
                    now = trio.current_time()
                    for limit in self.limits:
                        limit.start(now)
                    self.recompute()
        finally:
            self.sharing = False
            self.read_at = None
            self.reports.clear()
            with trio.CancelScope(shield=True):
                if self.own is not None:
                    self.own = None
                    with trio.move_on_after(_WRITE_TIMEOUT):
                        with contextlib.suppress(LogError):
                            await writer.append(self.fleet.node_id.encode(), None)
                await reader.aclose()
                await writer.aclose()

    async def _sleep_to(self, offset: float) -> None:
        """Sleeps until ``offset`` seconds after the next period boundary of the wall clock."""
        wall = self.wall()
        boundary = (math.floor(wall / PERIOD) + 1) * PERIOD
        target = boundary + offset
        if target - wall > PERIOD:
            target -= PERIOD
        await trio.sleep(max(0.0, target - wall))

    async def _compute(self) -> None:
        """Half a period after each boundary (the reports of the period are in), the shares."""
        while True:
            await self._sleep_to(PERIOD / 2)
            self.recompute()

    async def _publish(self, writer: StateLog) -> None:
        """On each boundary, this node's report; on the leader, deletes the reports of nodes gone."""
        me = self.fleet.node_id
        ensured = False
        last_cleanup = trio.current_time()
        while True:
            await self._sleep_to(0.0)
            now = trio.current_time()
            limits: dict[str, Mapping[str, Demand]] = {}
            for limit in self.limits:
                limit_id = limit.limit_id
                if limit.active and limit_id is not None:
                    limits[limit_id] = limit.roll(now)
            report = Report(me, round(self.wall() / PERIOD), not self._reading(now), limits)
            try:
                if not ensured:
                    await writer.ensure_topic()
                    ensured = True
                await writer.append(me.encode(), report.encode())
            except LogError as exc:
                self._trouble("write", exc)
                continue
            self.own = (report, now)
            self._fine("write")
            if self.fleet.is_leader and now - last_cleanup >= CLEANUP_AFTER:
                last_cleanup = now
                await self._cleanup(writer, now)

    async def _cleanup(self, writer: StateLog, now: float) -> None:
        live = {m.node_id for m in self.fleet.members}
        gone = [n for n, (_, at) in self.reports.items() if n not in live and now - at > CLEANUP_AFTER]
        if not gone:
            return
        try:
            await writer.append_many([(n.encode(), None) for n in gone])
        except LogError as exc:
            self._trouble("write", exc)
            return
        for node in gone:
            self.reports.pop(node, None)

    async def _follow(self, reader: StateLog) -> None:
        """Follows the topic from its end (older reports are stale), keeping each node's last one."""
        delay = 0.2
        while True:
            try:
                await reader.ensure_topic()
                offset = await reader.end_offset()
                break
            except LogError as exc:
                self._trouble("read", exc)
                await trio.sleep(delay)
                delay = min(delay * 2, 5.0)
        delay = 0.2
        while True:
            try:
                records, offset = await reader.read(offset, PERIOD / 2)
            except LogError as exc:
                self._trouble("read", exc)
                await trio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.2
            self.read_at = trio.current_time()
            self._fine("read")
            self._ingest(records, self.read_at)

    def _ingest(self, records: Iterable[LogRecord], now: float) -> None:
        for record in records:
            node = record.key.decode(errors="replace")
            if record.value is None:
                self.reports.pop(node, None)
                continue
            report = Report.decode(record.value)
            if report is not None and report.node == node:
                self.reports[node] = (report, now)

    def _trouble(self, what: str, exc: Exception) -> None:
        """Logs the first failure of an outage (not one per period)."""
        if not self._failing:
            log.warning(
                "fleet-wide limits: cannot %s the usage topic %s (%s); this node takes limit / members until it can",
                what,
                self.topic,
                exc,
            )
        self._failing.add(what)

    def _fine(self, what: str) -> None:
        if what in self._failing:
            self._failing.discard(what)
            if not self._failing:
                log.info("fleet-wide limits: the usage topic %s works again; shares follow usage", self.topic)


class _ShareMetrics(Collector):
    """``kanal_limit_share``: this node's share of each limit (of its one bucket, or, for a limit per
    principal, virtual cluster or group, of a key no node used recently); and how many keys have
    shares of their own (``kanal_limit_share_keys``)."""

    def __init__(self, limits: FleetLimits) -> None:
        self.limits = limits

    def describe(self) -> Iterable[Any]:
        return self.collect()

    def collect(self) -> Iterable[Any]:
        labels = ["plugin", "interceptor", "scope"]
        share = GaugeMetricFamily(
            "kanal_limit_share",
            "This node's share of a fleet-wide limit, in the limit's unit (per key: of a key no node used recently)",
            labels=labels,
        )
        keys = GaugeMetricFamily(
            "kanal_limit_share_keys", "Keys of a limit with a share of their own (used recently)", labels=labels
        )
        for limit in list(self.limits.limits):
            spec = limit.owner.spec
            if spec is None:
                continue
            scope = ",".join(
                f"{name}={value}"
                for name, value in (
                    ("vCluster", spec.scope.vcluster),
                    ("group", spec.scope.group),
                    ("username", spec.scope.username),
                )
                if value is not None
            )
            share.add_metric([spec.plugin, spec.name, scope], limit.share)
            keys.add_metric([spec.plugin, spec.name, scope], limit.keys)
        yield share
        yield keys


def fleet_limits(services: GatewayServices) -> FleetLimits:
    """The gateway's :class:`FleetLimits`, made (its metrics registered, its task started) on first use."""
    limits = services.shared.get(_SHARED)
    if isinstance(limits, FleetLimits):
        return limits
    limits = services.shared[_SHARED] = FleetLimits(services)
    services.metrics.register(_ShareMetrics(limits))
    services.start_soon(limits.run, name="fleet-wide limits")
    return limits


def installed_limits(services: GatewayServices) -> list[SharedLimit]:
    """The limiters of this gateway's installed interceptors (none before the first): the console
    reads their shares here, without making the :class:`FleetLimits` nor starting its task."""
    limits = services.shared.get(_SHARED)
    return list(limits.limits) if isinstance(limits, FleetLimits) else []
