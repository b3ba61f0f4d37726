"""The chargeback page's table: what the chargeback interceptors counted since the gateway started
(:func:`~kanal_safeguards.usage.chargeback.counted_usage`, the counters behind
``gateway_chargeback_bytes_total``), summed by principal, topic or client id, sorted and cut into
pages. Plain data, no web framework."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["GROUPINGS", "PAGE_SIZE", "SORTS", "UsageRow", "usage_rows"]

#: Rows a page shows.
PAGE_SIZE: Final = 50
#: What the rows sum over (the query's ``by``), as the page names it; the first is the default.
GROUPINGS: Final[Mapping[str, str]] = {
    "owner": "principal, topic and client id",
    "principal": "principal",
    "topic": "topic",
    "client": "client id",
}
#: What the rows are sorted by (the query's ``sort``), as the page names it; the first is the default.
SORTS: Final[Mapping[str, str]] = {
    "bytes": "bytes in and out",
    "in": "bytes in",
    "out": "bytes out",
    "requests": "requests",
    "name": "name",
}

_Key = tuple[str, str, str, str, str]  # direction, principal, virtual cluster, topic, client id


@dataclass(slots=True)
class UsageRow:
    """One principal (in its virtual cluster), topic or client id, or all four, with its counts.
    A field summed over is None."""

    principal: str | None
    vcluster: str | None
    topic: str | None
    client_id: str | None
    bytes_in: int = 0
    bytes_out: int = 0
    requests_in: int = 0
    requests_out: int = 0

    @property
    def total(self) -> int:
        return self.bytes_in + self.bytes_out

    @property
    def name(self) -> str:
        return " ".join(str(v) for v in (self.principal, self.vcluster, self.topic, self.client_id) if v is not None)


def _group(key: _Key, by: str) -> tuple[str | None, str | None, str | None, str | None]:
    _, principal, vcluster, topic, client_id = key
    if by == "principal":
        return principal, vcluster, None, None
    if by == "topic":
        return None, None, topic, None
    if by == "client":
        return None, None, None, client_id
    return principal, vcluster, topic, client_id


def usage_rows(
    counts: Mapping[_Key, tuple[int, int]], by: str = "owner", sort: str = "bytes", query: str = ""
) -> list[UsageRow]:
    """The rows of the table: ``counts`` summed by ``by``, those whose principal, virtual cluster,
    topic or client id contains ``query`` (any case), sorted by ``sort`` (counts: largest first)."""
    needle = query.strip().lower()
    rows: dict[tuple[str | None, ...], UsageRow] = {}
    for key, (size, requests) in counts.items():
        if needle and not any(needle in part.lower() for part in key[1:]):
            continue
        group = _group(key, by)
        row = rows.get(group)
        if row is None:
            row = rows[group] = UsageRow(*group)
        if key[0] == "in":
            row.bytes_in += size
            row.requests_in += requests
        else:
            row.bytes_out += size
            row.requests_out += requests
    out = list(rows.values())
    if sort == "name":
        out.sort(key=lambda r: r.name)
    elif sort == "in":
        out.sort(key=lambda r: (-r.bytes_in, r.name))
    elif sort == "out":
        out.sort(key=lambda r: (-r.bytes_out, r.name))
    elif sort == "requests":
        out.sort(key=lambda r: (-(r.requests_in + r.requests_out), r.name))
    else:
        out.sort(key=lambda r: (-r.total, r.name))
    return out
