"""How a limit declared once is split between the gateway nodes of a fleet: pure data in, shares
out, no I/O (:mod:`kanal_safeguards.limits.fleet_usage` publishes, follows and applies).

Every node publishes, once a :data:`PERIOD`, a :class:`Report`: per limit and per key (the bucket:
the rule, a principal, a virtual cluster, a group id) what it used recently (:class:`Demand`: in the
limit's unit, and whether the limiter held, throttled or refused some of it). Each node then works
out the whole fleet's allocation from the same reports (:func:`allocate`) and applies its own part
(:func:`node_shares`):

- a member with no usable report (none yet, a stale one, or one saying it cannot follow the reports)
  is *reserved* its base share, ``limit / members``: what such a node takes by itself;
- the rest, the *pool*, is shared between the members that reported, max-min fairly: a member that
  was not limited wants what it used plus :data:`HEADROOM`, at least the *floor* (so that an idle
  member can start at once), and gets it; the members that were limited split what is left equally.
  When nobody was limited and there is room left, it is split equally on top of the wants.

The allocation always adds up to the limit exactly (integer limits are rounded by largest
remainders, so they too add up exactly): the nodes stay within the limit as long as they compute
from the same reports, which they do when the reports reach every node within half a period (the
nodes compute half a period after the reports are published). A node that sees a report late uses
the previous one for a period; the excess is that member's change of share between two periods.
The floor costs the opposite: an idle member holds at most ``FLOOR * limit / members`` that busy
members cannot use.

Convergence: after a change of load, the first report that shows it is published at the end of the
period, and applied half a period later, so a skewed load holds the limit (within the floor and
the headroom of the members that were not limited) from about 1.5 periods after it starts; a
member that was idle and starts has the floor at once and its fair part after the same 1.5 periods.
After a change of membership, the shares follow at once: the new member is reserved its base share
until its first report, a member gone no longer counts.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = [
    "FLOOR",
    "HEADROOM",
    "IDLE",
    "MAX_KEYS",
    "PERIOD",
    "STALE_AFTER",
    "Demand",
    "NodeShares",
    "Report",
    "allocate",
    "busiest",
    "floor_of",
    "key_of",
    "key_text",
    "members_of",
    "node_shares",
    "usable_reports",
]

#: Seconds between two reports of a node. One second: byte rates are per second and their buckets
#: hold one second's worth, so a share that lags by a period or two costs a second or two of a
#: skewed load; a shorter period costs the backing cluster a record per node per period for little
#: gain (a report must reach every node within half a period for the shares to add up exactly).
PERIOD = 1.0
#: A report not renewed for this long is stale (its node is treated as having none): three periods,
#: so that one late or lost record does not move shares, while a node that stopped publishing
#: (killed, cut off from the cluster) is reserved its base share within a few seconds.
STALE_AFTER = 3 * PERIOD
#: An idle member's want, as a fraction of its base share (``limit / members``): enough for a client
#: arriving there to start before the next report, little enough that busy members lose at most 5%.
FLOOR = 0.05
#: What a member that was not limited wants above what it used: it can grow by that much before it
#: is limited, at which point it takes part in the equal split of the rest.
HEADROOM = 0.1
#: The most keys (principals, virtual clusters, group ids) of one limit a report carries, the busiest
#: first: others count as idle (the floor) on the other nodes.
MAX_KEYS = 1000


class Demand(NamedTuple):
    """What a member used of one key of one limit, recently."""

    #: In the limit's unit: bytes per second for byte rates, events per window for counts.
    used: float
    #: Whether the limiter held, throttled or refused some of it (the member wants more).
    constrained: bool


#: What a member that has a report but no entry for a key used of it.
IDLE = Demand(0.0, False)


def key_text(key: Hashable) -> str:
    """A limiter's key as reports carry it (JSON: null, a string, or an array for a tuple)."""
    return json.dumps(key, separators=(",", ":"))


def key_of(text: str) -> Hashable:
    """The limiter's key of a report's key text (:func:`key_text` undone)."""
    value = json.loads(text)
    if isinstance(value, list):
        return tuple(value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise ValueError(f"not a limit key: {text!r}")


@dataclass(frozen=True)
class Report:
    """One node's usage of every limit it enforces, for one period."""

    node: str
    #: The period it was published in (wall clock / :data:`PERIOD`): for people reading the topic.
    epoch: int
    #: The node cannot follow the reports (it takes its base share, and is reserved it).
    fallback: bool = False
    #: Limit id -> key text -> demand.
    limits: Mapping[str, Mapping[str, Demand]] = field(default_factory=dict)

    def encode(self) -> bytes:
        """The report as the usage topic holds it (JSON)."""
        limits = {
            limit: {key: [round(d.used, 3), int(d.constrained)] for key, d in keys.items()}
            for limit, keys in self.limits.items()
        }
        value = {"node": self.node, "epoch": self.epoch, "fallback": self.fallback, "limits": limits}
        return json.dumps(value, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Report | None:
        """The report a record holds, or None when it is not one (another version's, or garbage)."""
        try:
            value: Any = json.loads(data)
            limits = {
                str(limit): {str(key): Demand(float(d[0]), bool(d[1])) for key, d in keys.items()}
                for limit, keys in value["limits"].items()
            }
            return cls(str(value["node"]), int(value["epoch"]), bool(value["fallback"]), limits)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return None


def floor_of(limit: float, members: int, integral: bool = False) -> float:
    """An idle member's want: :data:`FLOOR` of its base share; for counts at least one event per
    window when the limit allows one per member (a member can then always start). Never more than
    the base share, so that the floors of all members fit in the limit."""
    base = limit / members
    floor = FLOOR * base
    if integral:
        floor = max(floor, 1.0)
    return min(floor, base)


def _water_fill(pool: float, wants: Mapping[str, float]) -> dict[str, float]:
    """Max-min fair shares of ``pool``: a want at most the fair level is met, the others (infinite:
    limited members) get the level; room left when every want is met is split equally on top."""
    if not wants:
        return {}
    if all(math.isfinite(w) for w in wants.values()) and sum(wants.values()) <= pool:
        extra = (pool - sum(wants.values())) / len(wants)
        return {m: w + extra for m, w in wants.items()}
    shares: dict[str, float] = {}
    remaining, left = pool, len(wants)
    ordered = sorted(wants.items(), key=lambda item: (item[1], item[0]))
    for i, (member, want) in enumerate(ordered):
        level = remaining / left
        if want > level:
            for rest, _ in ordered[i:]:
                shares[rest] = level
            break
        shares[member] = want
        remaining -= want
        left -= 1
    return shares


def _tiebreak(order: str, member: str) -> int:
    """A stable order of members for one key (the same on every node, unlike ``hash``)."""
    return zlib.crc32(f"{order}\x00{member}".encode())


def _round(limit: float, shares: Mapping[str, float], order: str) -> dict[str, float]:
    """Whole shares adding up to ``floor(limit)``: each share rounded down, the units left given to
    the largest remainders (ties: a stable order per key, so different keys favour different nodes)."""
    total = math.floor(limit + 1e-9)
    whole = {m: math.floor(s + 1e-9) for m, s in shares.items()}
    left = total - sum(whole.values())
    ranked = sorted(shares, key=lambda m: (-(shares[m] - whole[m]), _tiebreak(order, m)))
    for member in ranked[: max(0, left)]:
        whole[member] += 1
    return {m: float(n) for m, n in whole.items()}


def allocate(
    limit: float,
    demands: Mapping[str, Demand | None],
    *,
    integral: bool = False,
    order: str = "",
) -> dict[str, float]:
    """Every member's share of ``limit`` for one key. ``demands`` has one entry per live member:
    its demand, or None when it has no usable report (it is reserved its base share). The shares add
    up to ``limit`` (``floor(limit)`` whole shares with ``integral``; ``order`` breaks ties)."""
    members = len(demands)
    if members == 0:
        return {}
    base = limit / members
    floor = floor_of(limit, members, integral)
    reserved = [m for m, d in demands.items() if d is None]
    pool = limit - base * len(reserved)
    wants = {
        m: math.inf if d.constrained else max(floor, d.used * (1 + HEADROOM))
        for m, d in demands.items()
        if d is not None
    }
    shares = _water_fill(pool, wants)
    shares.update((m, base) for m in reserved)
    return _round(limit, shares, order) if integral else shares


@dataclass(frozen=True)
class NodeShares:
    """One node's shares of one limit: for each key some member reported, and for any other key."""

    default: float
    by_key: Mapping[str, float]


def node_shares(
    limit_id: str,
    limit: float,
    members: Sequence[str],
    me: str,
    reports: Mapping[str, Report],
    *,
    integral: bool = False,
) -> NodeShares:
    """Node ``me``'s shares of limit ``limit_id`` given the live ``members`` (its own id included)
    and the usable reports (fresh ones, this node's own as it published it; a report saying
    ``fallback`` counts as none). Alone, a node has the whole limit."""
    if len(members) <= 1:
        return NodeShares(float(limit), {})
    usable = {m: reports[m] for m in members if m in reports and not reports[m].fallback}
    used = {m: r.limits.get(limit_id, {}) for m, r in usable.items()}
    keys = sorted(set().union(*(u.keys() for u in used.values())) if used else set())

    def demands(key: str | None) -> dict[str, Demand | None]:
        return {m: (used[m].get(key, IDLE) if key is not None else IDLE) if m in used else None for m in members}

    default = allocate(limit, demands(None), integral=integral)[me]
    by_key = {key: allocate(limit, demands(key), integral=integral, order=key)[me] for key in keys}
    return NodeShares(default, by_key)


def usable_reports(
    received: Mapping[str, tuple[Report, float]],
    own: tuple[Report, float] | None,
    members: Sequence[str],
    me: str,
    now: float,
    *,
    reading: bool = True,
) -> dict[str, Report]:
    """The reports shares are computed from: the live members' (a node gone is ignored) received
    within :data:`STALE_AFTER` of ``now`` (``received``: node id -> its last report, when it came),
    and this node's own as it published it (``own``), if that is fresh too: the others see it, and
    stop seeing it, at about the same times. None when this node cannot follow the reports
    (``reading`` false): every member then has its base share in its view, as this node has in theirs."""
    if not reading:
        return {}
    live = set(members)
    reports = {n: r for n, (r, at) in received.items() if n in live and n != me and now - at <= STALE_AFTER}
    if own is not None and now - own[1] <= STALE_AFTER:
        reports[me] = own[0]
    return reports


def busiest(demands: Mapping[str, Demand], most: int = MAX_KEYS) -> dict[str, Demand]:
    """The ``most`` keys that used the most (the limited ones first): what a report carries."""
    if len(demands) <= most:
        return dict(demands)
    ranked = sorted(demands.items(), key=lambda item: (not item[1].constrained, -item[1].used))
    return dict(ranked[:most])


def members_of(ids: Iterable[str], me: str) -> list[str]:
    """The live members' ids, this node's included (a view that misses it still counts it)."""
    members = sorted(set(ids))
    if me not in members:
        members.append(me)
    return members
