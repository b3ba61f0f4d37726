"""The routes the proxy serves, each with the check it needs, matched on the raw (still encoded) path.

Matching works on the raw path split at ``/`` and each segment percent-decoded on its own, so a
subject holding ``/`` (sent as ``%2F``) or ``%`` (``%25``) is one segment and is authorized under its
decoded name, while the original encoding is what goes upstream. One trailing ``/`` is ignored (as
Karapace does). A segment that decodes to ``.`` or ``..`` matches nothing.

Checks:

- ``write`` / ``read``: Write or Read on the subject in the path;
- ``global``: any authenticated principal (no subject involved: types, config, mode, contexts, root);
- ``id`` / ``guid``: Read on at least one subject that holds the schema (resolved upstream);
- ``filter``: forwarded, then the listed subjects (or items naming one) the caller cannot read are
  removed from the answer;
- ``blocked``: administrative operations, answered 404 without reaching the registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote_to_bytes

Check = Literal["write", "read", "global", "id", "guid", "filter", "associations", "blocked"]


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    template: str
    check: Check
    filter_kind: str | None = None  # for check "filter": subjects, schemas, versions
    segments: tuple[str, ...] = ()

    def match(self, parts: list[str]) -> dict[str, str] | None:
        params: dict[str, str] = {}
        for pattern, value in zip(self.segments, parts, strict=True):
            if pattern.startswith("{"):
                params[pattern[1:-1]] = value
            elif pattern == "*":
                continue
            elif pattern != value:
                return None
        return params


def _route(method: str, template: str, check: Check, filter_kind: str | None = None) -> Route:
    segments = tuple(part for part in template.split("/") if part)
    return Route(method, template, check, filter_kind, segments)


# The spec's table, the reads every client needs (deserializers fetch by id, serializers look up
# versions), and the administrative operations that are refused.
ROUTES: tuple[Route, ...] = (
    _route("GET", "/", "global"),
    _route("POST", "/subjects/{subject}/versions", "write"),
    _route("GET", "/subjects", "filter", "subjects"),
    _route("POST", "/subjects/{subject}", "read"),
    _route("GET", "/subjects/{subject}/versions", "read"),
    _route("GET", "/subjects/{subject}/versions/{version}", "read"),
    _route("GET", "/subjects/{subject}/versions/{version}/schema", "read"),
    _route("GET", "/subjects/{subject}/versions/{version}/referencedby", "read"),
    _route("GET", "/subjects/{subject}/metadata", "read"),
    _route("POST", "/compatibility/subjects/{subject}/versions", "read"),
    _route("POST", "/compatibility/subjects/{subject}/versions/{version}", "read"),
    _route("GET", "/schemas", "filter", "schemas"),
    _route("GET", "/schemas/types", "global"),
    _route("GET", "/schemas/ids/{id}", "id"),
    _route("GET", "/schemas/ids/{id}/schema", "id"),
    _route("GET", "/schemas/ids/{id}/versions", "filter", "versions"),
    _route("GET", "/schemas/ids/{id}/subjects", "filter", "subjects"),
    _route("GET", "/schemas/guids/{guid}", "guid"),
    _route("GET", "/schemas/guids/{guid}/ids", "guid"),
    _route("GET", "/config", "global"),
    _route("GET", "/config/{subject}", "read"),
    _route("GET", "/mode", "global"),
    _route("GET", "/mode/{subject}", "read"),
    _route("GET", "/contexts", "global"),
    _route("GET", "/associations/resources/{namespace}/{name}", "associations"),
    # not routed: deletion, config and mode changes, schema linking
    _route("DELETE", "/subjects/{subject}", "blocked"),
    _route("DELETE", "/subjects/{subject}/versions/{version}", "blocked"),
    _route("PUT", "/config", "blocked"),
    _route("DELETE", "/config", "blocked"),
    _route("PUT", "/config/{subject}", "blocked"),
    _route("DELETE", "/config/{subject}", "blocked"),
    _route("PUT", "/mode", "blocked"),
    _route("DELETE", "/mode", "blocked"),
    _route("PUT", "/mode/{subject}", "blocked"),
    _route("DELETE", "/mode/{subject}", "blocked"),
)

BLOCKED_PREFIXES = ("exporters",)

_TABLE: dict[tuple[str, int], list[Route]] = {}
for _r in ROUTES:
    _TABLE.setdefault((_r.method, len(_r.segments)), []).append(_r)


@dataclass(frozen=True, slots=True)
class Match:
    route: Route
    params: dict[str, str]


EXPORTERS = Route("*", "/exporters", "blocked")


def split_path(raw_path: bytes) -> list[str] | None:
    """The decoded segments of a raw path, or None when it cannot name a route."""
    if not raw_path.startswith(b"/"):
        return None
    path = raw_path[1:]
    if path.endswith(b"/"):
        path = path[:-1]
    if not path:
        return []
    parts: list[str] = []
    for raw in path.split(b"/"):
        if b"%" in raw:
            try:
                segment = unquote_to_bytes(raw).decode("utf-8")
            except UnicodeDecodeError:
                return None
        else:
            try:
                segment = raw.decode("utf-8")
            except UnicodeDecodeError:
                return None
        if segment in ("", ".", ".."):
            return None
        parts.append(segment)
    return parts


_MATCHED: dict[tuple[str, bytes], Match | None] = {}
_MATCHED_MAX = 4096  # entries; emptied when full
_MATCHED_PATH_MAX = 256  # bytes: longer paths are matched each time (so the memory stays at a few MiB)


def match(method: str, raw_path: bytes) -> Match | None:
    """The route of a request and its parameters, remembered per (method, raw path): clients ask for
    the same few paths again and again (a deserializer fetches one id per schema), and matching costs
    several microseconds per request. A match is shared: its params are read, never changed."""
    key = (method, raw_path)
    try:
        return _MATCHED[key]
    except KeyError:
        pass
    found = _match(method, raw_path)
    if len(raw_path) <= _MATCHED_PATH_MAX:
        if len(_MATCHED) >= _MATCHED_MAX:
            _MATCHED.clear()
        _MATCHED[key] = found
    return found


def _match(method: str, raw_path: bytes) -> Match | None:
    parts = split_path(raw_path)
    if parts is None:
        return None
    if parts and parts[0] in BLOCKED_PREFIXES:
        return Match(EXPORTERS, {})
    for route in _TABLE.get((method, len(parts)), ()):
        params = route.match(parts)
        if params is not None:
            return Match(route, params)
    return None


def upstream_path(raw_path: bytes) -> bytes:
    """The path sent upstream: the client's encoding, with a literal ``+`` sent as ``%2B`` so that a
    registry decoding ``+`` as a space (Karapace) sees the subject the proxy authorized."""
    return raw_path.replace(b"+", b"%2B") if b"+" in raw_path else raw_path
