"""Audit events without I/O: their JSON form, the filters of ``GET /gateway/v2/audit``, and the index
that answers it.

An event is CloudEvents-like JSON (one Kafka record of the audit log topic)::

    {"id": "5f0c...", "source": "kanal://gw-1.example:6969", "type": "AUTHENTICATION",
     "authenticationPrincipal": "passthrough", "userName": "orders-app",
     "connection": {"localAddress": "10.0.0.5:6969", "remoteAddress": "10.0.0.9:53422"},
     "specVersion": "0.1.0", "time": "2026-11-24T19:09:21.123456Z", "eventData": "SUCCESS"}

``authenticationPrincipal`` is the client's virtual cluster, ``passthrough`` when it has none (as the
interceptor scopes name it). Addresses are ``host:port`` (``[v6]:port`` for IPv6).
"""

from __future__ import annotations

import datetime
import heapq
import os
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "ADMIN_API_CALL",
    "AUTHENTICATION",
    "AUTHORIZATION",
    "PASSTHROUGH",
    "SPEC_VERSION",
    "AuditIndex",
    "AuditQuery",
    "BadFilter",
    "Entry",
    "bracketed",
    "make_event",
    "parse_query",
]

SPEC_VERSION = "0.1.0"
PASSTHROUGH = "passthrough"
AUTHENTICATION = "AUTHENTICATION"
AUTHORIZATION = "AUTHORIZATION"
ADMIN_API_CALL = "ADMIN_API_CALL"

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MS = datetime.timedelta(milliseconds=1)
DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000
FILTERS = ("type", "principal", "from", "to", "limit")


def bracketed(address: str | None) -> str | None:
    """``host:port`` with an IPv6 host in brackets (``::1:9092`` -> ``[::1]:9092``); the gateway
    writes peer addresses as ``host:port`` without them."""
    if not address or address.startswith("[") or address.count(":") < 2:
        return address
    host, _, port = address.rpartition(":")
    return f"[{host}]:{port}" if port.isdigit() else f"[{address}]"


def stamp(epoch_seconds: float) -> tuple[str, int]:
    """ISO-8601 in UTC to the microsecond with a ``Z``, and the same moment in epoch milliseconds
    (exactly what :func:`parse_time` reads back from the text)."""
    moment = datetime.datetime.fromtimestamp(epoch_seconds, datetime.UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z"), (moment - _EPOCH) // _MS


def iso_time(epoch_seconds: float) -> str:
    """ISO-8601 in UTC, to the microsecond, with a ``Z``."""
    return stamp(epoch_seconds)[0]


def new_id() -> str:
    """A random (version 4) UUID as text; ``str(uuid.uuid4())`` at a third of the cost (one per login)."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40
    raw[8] = raw[8] & 0x3F | 0x80
    text = raw.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def make_event(
    event_type: str,
    *,
    source: str,
    user: str | None,
    vcluster: str | None,
    local_address: str | None,
    remote_address: str | None,
    event_data: Any,
    time: str,
) -> dict[str, Any]:
    """One event; ``time`` ISO-8601 (:func:`stamp`)."""
    return {
        "id": new_id(),
        "source": source,
        "type": event_type,
        "authenticationPrincipal": vcluster or PASSTHROUGH,
        "userName": user,
        "connection": {"localAddress": bracketed(local_address), "remoteAddress": bracketed(remote_address)},
        "specVersion": SPEC_VERSION,
        "time": time,
        "eventData": event_data,
    }


# -- the filters -----------------------------------------------------------------------------------


class BadFilter(ValueError):
    """A filter of ``GET /gateway/v2/audit`` that cannot be used; the message names it."""


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """Which events to answer: types (None: all), userName, a time range in epoch ms (both ends
    included), and how many of the newest."""

    types: frozenset[str] | None = None
    principal: str | None = None
    from_ms: int | None = None
    to_ms: int | None = None
    limit: int = DEFAULT_LIMIT


def parse_time(name: str, text: str) -> int:
    """Epoch milliseconds of ``text``: digits are epoch ms, anything else ISO-8601 (UTC when it
    names no offset). A ``+`` turned into a space by an unencoded query string is taken back."""
    text = text.strip()
    if text.isascii() and text.isdigit() and len(text) <= 16:
        return int(text)
    if " " in text and "T" in text:  # 2026-11-24T10:00:00 01:00: the "+" of an unencoded offset
        head, _, tail = text.rpartition(" ")
        text = f"{head}+{tail}"
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise BadFilter(
            f"{name}: {text!r} is neither epoch milliseconds nor an ISO-8601 time (2026-11-24T10:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return (moment - _EPOCH) // _MS  # exact, unlike timestamp() * 1000


def parse_query(args: Mapping[str, str]) -> AuditQuery:
    """The query of the route's parameters; :class:`BadFilter` names an unknown or bad one."""
    unknown = sorted(set(args) - set(FILTERS))
    if unknown:
        raise BadFilter(f"{unknown[0]}: unknown filter (known: {', '.join(FILTERS)})")
    types = None
    if args.get("type"):
        types = frozenset(t.strip().upper() for t in args["type"].split(",") if t.strip())
    from_ms = parse_time("from", args["from"]) if args.get("from") else None
    to_ms = parse_time("to", args["to"]) if args.get("to") else None
    if from_ms is not None and to_ms is not None and from_ms > to_ms:
        raise BadFilter(f"from: {args['from']} is after to ({args['to']})")
    limit = DEFAULT_LIMIT
    if args.get("limit") is not None:
        text = args["limit"].strip()
        if not (text.isascii() and text.isdigit() and len(text) <= 6) or not 1 <= int(text) <= MAX_LIMIT:
            raise BadFilter(f"limit: {text!r} is not a number from 1 to {MAX_LIMIT}")
        limit = int(text)
    return AuditQuery(types or None, args.get("principal") or None, from_ms, to_ms, limit)


# -- the index -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    """An indexed event: what the filters look at, and the event's JSON."""

    time_ms: int
    seq: int  # arrival order: among events of the same millisecond, the later is newer
    type: str
    user: str | None
    id: str
    raw: bytes

    def matches(self, query: AuditQuery) -> bool:
        return (
            (query.principal is None or self.user == query.principal)
            and (query.from_ms is None or self.time_ms >= query.from_ms)
            and (query.to_ms is None or self.time_ms <= query.to_ms)
        )


OTHER_TYPES = "\x00other"  # the bucket of the types beyond ``max_types``


class AuditIndex:
    """The most recent events of each type (a bounded deque per type, so a flood of logins does not
    push the admin changes out), without duplicates (by ``id``: this node's own events are indexed
    when emitted, and again when read back from the topic)."""

    def __init__(self, per_type: int = 5_000, max_types: int = 32) -> None:
        self.per_type = per_type
        self.max_types = max_types
        self._buckets: dict[str, deque[Entry]] = {}
        self._ids: set[str] = set()
        self._seq = 0

    def __len__(self) -> int:
        return len(self._ids)

    def add_event(self, event: Mapping[str, Any], raw: bytes, time_ms: int | None = None) -> bool:
        """Indexes an event this node made (its JSON is ``raw``; ``time_ms`` its time, read from the
        event when not given); False if it was indexed already."""
        time = event["time"] if time_ms is None else None
        return self._add(str(event["id"]), str(event["type"]), event.get("userName"), time, raw, time_ms or 0)

    def add_record(self, raw: bytes, timestamp_ms: int) -> bool:
        """Indexes an event read from the topic; False when it is indexed already or is not an
        event (a record another writer put there). ``timestamp_ms``: the record's, used when the
        event's own time does not parse."""
        try:
            event = orjson.loads(raw)
            event_id, event_type, user = event["id"], event["type"], event.get("userName")
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return False
        if not isinstance(event_id, str) or not isinstance(event_type, str):
            return False
        return self._add(
            event_id, event_type, user if isinstance(user, str) else None, event.get("time"), raw, timestamp_ms
        )

    def _add(
        self, event_id: str, event_type: str, user: str | None, time: Any, raw: bytes, fallback_ms: int = 0
    ) -> bool:
        if event_id in self._ids:
            return False
        try:
            time_ms = parse_time("time", time) if isinstance(time, str) else fallback_ms
        except BadFilter:
            time_ms = fallback_ms
        bucket_name = event_type if event_type in self._buckets or len(self._buckets) < self.max_types else OTHER_TYPES
        bucket = self._buckets.get(bucket_name)
        if bucket is None:
            bucket = self._buckets[bucket_name] = deque()
        if len(bucket) >= self.per_type:
            self._ids.discard(bucket.popleft().id)
        self._seq += 1
        bucket.append(Entry(time_ms, self._seq, event_type, user, event_id, raw))
        self._ids.add(event_id)
        return True

    def query(self, query: AuditQuery) -> list[dict[str, Any]]:
        """The newest ``query.limit`` events that match, newest first."""
        if query.types is None:
            buckets: Iterable[deque[Entry]] = self._buckets.values()
        else:
            wanted = [self._buckets.get(t) for t in query.types]
            if any(t not in self._buckets for t in query.types) and OTHER_TYPES in self._buckets:
                wanted.append(self._buckets[OTHER_TYPES])
            buckets = [b for b in wanted if b is not None]
        found = (
            e
            for bucket in buckets
            for e in bucket
            if e.matches(query) and (query.types is None or e.type in query.types)
        )
        newest = heapq.nlargest(query.limit, found, key=lambda e: (e.time_ms, e.seq))
        return [orjson.loads(e.raw) for e in newest]
