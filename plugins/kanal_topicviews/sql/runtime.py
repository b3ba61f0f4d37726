"""What the generated view functions run against: the record metadata object, the per-batch
context of CURRENT_* values, temporal values, and the general-case helpers of the SQL semantics
(the generated code inlines the common cases and calls these for the rest).

The semantics are described in the docstring of ``kanal_topicviews.sql``.
"""

from __future__ import annotations

import math
import time as _time
from collections.abc import Sequence
from datetime import UTC, datetime, time, timedelta
from typing import Any, Final, Literal

import orjson

__all__ = [
    "KEEP",
    "RecordMeta",
    "Temporal",
    "ViewContext",
    "instant_ms",
    "now_context",
    "time_ms",
]

INT_MIN: Final = -(2**63)
INT_END: Final = 2**64  # orjson writes integers in [-2**63, 2**64)
_NUM: Final = frozenset((int, float))
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)
_DAY_MS: Final = 86_400_000


class _Keep:
    """The type of ``KEEP``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "KEEP"

    def __reduce__(self) -> str:
        return "KEEP"


KEEP: Final = _Keep()
"""Returned by a view for a kept record whose output is its original value (``SELECT *``): the
caller forwards the original value bytes untouched."""


class RecordMeta:
    """The metadata of one record, as a view sees it. ``timestamp`` is in ms since the epoch;
    ``headers`` are Kafka's (ordered, repeatable, values may be None). Mutable and slotted, so a
    caller may fill one instance per record or reuse one for a whole batch."""

    __slots__ = ("headers", "key", "offset", "partition", "timestamp")

    def __init__(
        self,
        key: bytes | None = None,
        partition: int = 0,
        offset: int = 0,
        timestamp: int = 0,
        headers: Sequence[tuple[str, bytes | None]] = (),
    ) -> None:
        self.key = key
        self.partition = partition
        self.offset = offset
        self.timestamp = timestamp
        self.headers = headers

    def __repr__(self) -> str:
        return (
            f"RecordMeta(key={self.key!r}, partition={self.partition}, offset={self.offset}, "
            f"timestamp={self.timestamp}, headers={self.headers!r})"
        )


TemporalKind = Literal["timestamp", "date", "time"]


class Temporal:
    """The value of CURRENT_TIMESTAMP (``ms``: ms since the epoch), CURRENT_DATE (``ms``: its
    midnight UTC) or CURRENT_TIME (``ms``: ms since midnight UTC); ``iso`` is its ISO-8601 text,
    which is what a projection outputs."""

    __slots__ = ("iso", "kind", "ms")

    def __init__(self, kind: TemporalKind, ms: int, iso: str) -> None:
        self.kind = kind
        self.ms = ms
        self.iso = iso

    def __repr__(self) -> str:
        return f"Temporal({self.kind!r}, {self.ms}, {self.iso!r})"


class ViewContext:
    """The CURRENT_* values of one call batch (compute once with ``now_context()``)."""

    __slots__ = ("date", "time", "timestamp")

    def __init__(self, timestamp: Temporal, date: Temporal, time: Temporal) -> None:
        self.timestamp = timestamp
        self.date = date
        self.time = time


def now_context(now: datetime | None = None) -> ViewContext:
    """CURRENT_TIMESTAMP, CURRENT_DATE and CURRENT_TIME at ``now`` (default: the clock), in UTC,
    to millisecond precision."""
    if now is None:
        ts_ms = _time.time_ns() // 1_000_000
    else:
        if now.tzinfo is None:
            now = now.replace(tzinfo=UTC)
        ts_ms = (now - _EPOCH) // _MS
    day_ms = ts_ms % _DAY_MS
    t = _time.gmtime(ts_ms // 1000)
    date_iso = f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}"
    time_iso = f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{ts_ms % 1000:03d}"
    return ViewContext(
        Temporal("timestamp", ts_ms, f"{date_iso}T{time_iso}Z"),
        Temporal("date", ts_ms - day_ms, date_iso),
        Temporal("time", day_ms, time_iso),
    )


# -- ISO-8601 text compared with temporal values


def instant_ms(text: str) -> int | None:
    """ms since the epoch of an ISO-8601 date or date-time (no offset means UTC), or None."""
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    try:
        return (dt - _EPOCH) // _MS
    except OverflowError:
        return None


def time_ms(text: str) -> int | None:
    """ms since midnight UTC of an ISO-8601 time of day (an offset is applied), or None."""
    try:
        t = time.fromisoformat(text)
    except ValueError:
        return None
    ms = ((t.hour * 60 + t.minute) * 60 + t.second) * 1000 + t.microsecond // 1000
    off = t.utcoffset()
    if off is not None:
        ms = (ms - off // _MS) % _DAY_MS
    return ms


# -- record metadata


def key_text(key: Any) -> str | None:
    return None if key is None else str(key, "utf-8", "replace")


def key_json(key: Any) -> Any:
    if key is None:
        return None
    try:
        return orjson.loads(key)
    except orjson.JSONDecodeError:
        return None


def header_text(headers: Sequence[tuple[str, bytes | None]], name: str) -> str | None:
    """The last header called ``name``, as text; None when absent or null."""
    for k, v in reversed(headers):
        if k == name:
            return None if v is None else str(v, "utf-8", "replace")
    return None


def path(value: Any, parts: Sequence[str | int]) -> Any:
    """Follow ``parts`` into a JSON value; None when a step is missing or of the wrong kind."""
    for p in parts:
        if p.__class__ is str:
            if value.__class__ is not dict:
                return None
            value = value.get(p)
        else:
            if value.__class__ is not list or p >= len(value):  # type: ignore[operator]
                return None
            value = value[p]  # type: ignore[index]
    return value


def out(x: Any) -> Any:
    """A projected value as JSON: temporal values become ISO-8601 text."""
    return x.iso if x.__class__ is Temporal else x


# -- comparisons


def json_eq(a: Any, b: Any) -> bool:
    """JSON equality: numbers by value, booleans only equal booleans, containers member-wise."""
    ca, cb = a.__class__, b.__class__
    if ca in _NUM and cb in _NUM:
        return bool(a == b)
    if ca is not cb:
        return False
    if ca is list:
        return len(a) == len(b) and all(json_eq(x, y) for x, y in zip(a, b, strict=True))
    if ca is dict:
        return a.keys() == b.keys() and all(json_eq(v, b[k]) for k, v in a.items())
    return bool(a == b)


def _as_ms(kind: str, x: Any) -> int | float | None:
    c = x.__class__
    if c in _NUM:
        return x  # type: ignore[no-any-return]
    if c is str:
        return time_ms(x) if kind == "time" else instant_ms(x)
    return None


def _temporal_pair(a: Any, b: Any) -> tuple[Any, Any] | None:
    if a.__class__ is Temporal and b.__class__ is Temporal:
        if (a.kind == "time") != (b.kind == "time"):
            return None
        return a.ms, b.ms
    if a.__class__ is Temporal:
        y = _as_ms(a.kind, b)
        return None if y is None else (a.ms, y)
    x = _as_ms(b.kind, a)
    return None if x is None else (x, b.ms)


def eq(a: Any, b: Any) -> bool | None:
    """SQL ``=``: NULL if a side is NULL, FALSE across kinds."""
    if a is None or b is None:
        return None
    ca, cb = a.__class__, b.__class__
    if ca is Temporal or cb is Temporal:
        pair = _temporal_pair(a, b)
        return False if pair is None else bool(pair[0] == pair[1])
    return json_eq(a, b)


def ne(a: Any, b: Any) -> bool | None:
    r = eq(a, b)
    return None if r is None else not r


def _order_pair(a: Any, b: Any) -> tuple[Any, Any] | None:
    if a is None or b is None:
        return None
    ca, cb = a.__class__, b.__class__
    if ca in _NUM and cb in _NUM:
        return a, b
    if ca is cb and (ca is str or ca is bool):
        return a, b
    if ca is Temporal or cb is Temporal:
        return _temporal_pair(a, b)
    return None


def lt(a: Any, b: Any) -> bool | None:
    p = _order_pair(a, b)
    return None if p is None else bool(p[0] < p[1])


def le(a: Any, b: Any) -> bool | None:
    p = _order_pair(a, b)
    return None if p is None else bool(p[0] <= p[1])


def gt(a: Any, b: Any) -> bool | None:
    p = _order_pair(a, b)
    return None if p is None else bool(p[0] > p[1])


def ge(a: Any, b: Any) -> bool | None:
    p = _order_pair(a, b)
    return None if p is None else bool(p[0] >= p[1])


def in_(x: Any, items: Sequence[Any]) -> bool | None:
    """SQL ``x IN (items)``: TRUE if one item equals x, else NULL if x or an item is NULL, else FALSE."""
    if x is None:
        return None
    null = False
    for item in items:
        r = eq(x, item)
        if r:
            return True
        if r is None:
            null = True
    return None if null else False


def match(regex: Any, x: Any, full: bool) -> bool | None:
    if x.__class__ is not str:
        return None
    return (regex.fullmatch(x) if full else regex.search(x)) is not None


# -- arithmetic


def num(x: Any) -> int | float | None:
    """The number an arithmetic operand stands for: a number, a temporal value's ms, else None."""
    c = x.__class__
    if c in _NUM:
        return x  # type: ignore[no-any-return]
    if c is Temporal:
        return x.ms  # type: ignore[no-any-return]
    return None


def fit(r: int | float) -> int | float | None:
    """A result JSON can carry: integers out of the 64-bit range become floats, and a float that
    is not finite becomes NULL."""
    if r.__class__ is int:
        return r if INT_MIN <= r < INT_END else fit(float(r))
    return r if math.isfinite(r) else None


def add(a: Any, b: Any) -> int | float | None:
    x, y = num(a), num(b)
    return None if x is None or y is None else fit(x + y)


def sub(a: Any, b: Any) -> int | float | None:
    x, y = num(a), num(b)
    return None if x is None or y is None else fit(x - y)


def mul(a: Any, b: Any) -> int | float | None:
    x, y = num(a), num(b)
    return None if x is None or y is None else fit(x * y)


def div(a: Any, b: Any) -> int | float | None:
    x, y = num(a), num(b)
    if x is None or y is None or y == 0:
        return None
    return fit(x / y)


def mod(a: Any, b: Any) -> int | float | None:
    x, y = num(a), num(b)
    if x is None or y is None or y == 0:
        return None
    if x.__class__ is int and y.__class__ is int:
        r = abs(x) % abs(y)
        return -r if x < 0 else r
    return fit(math.fmod(x, y))


def neg(a: Any) -> int | float | None:
    x = num(a)
    return None if x is None else fit(-x)


def truth(x: Any) -> bool | None:
    """A value used as a condition: TRUE and FALSE are themselves, anything else is NULL."""
    return x if x is True or x is False else None
