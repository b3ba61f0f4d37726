"""ApiVersions negotiation: the gateway offers only what both it and the upstream can speak."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any

from kanal.protocol.api import supported_versions
from kanal.protocol.entities import build, nested


def intersect(body: Any, answered_here: Collection[int] = ()) -> Any | None:
    """The ApiVersions response limited to versions the gateway can decode; None if unchanged. The
    APIs in ``answered_here`` (the gateway answers them itself, such as the ACL APIs when it enforces
    ACLs) are offered in every version the gateway speaks, whatever the broker says of them."""
    kept = []
    changed = False
    missing = set(answered_here)
    for entry in body.api_keys:
        if int(entry.api_key) in missing:
            missing.discard(int(entry.api_key))
            low, high = supported_versions(int(entry.api_key)) or (0, -1)
            if (low, high) != (entry.min_version, entry.max_version):
                entry = replace(entry, min_version=low, max_version=high)
                changed = True
            kept.append(entry)
            continue
        ours = supported_versions(int(entry.api_key))
        if ours is None:
            changed = True
            continue
        low = max(int(entry.min_version), ours[0])
        high = min(int(entry.max_version), ours[1])
        if low > high:
            changed = True
            continue
        if low != entry.min_version or high != entry.max_version:
            entry = replace(entry, min_version=low, max_version=high)
            changed = True
        kept.append(entry)
    if missing:
        entry_cls = nested(type(body), "api_keys")
        for api_key in sorted(missing):
            versions = supported_versions(api_key)
            if versions is not None:
                kept.append(build(entry_cls, api_key=api_key, min_version=versions[0], max_version=versions[1]))
                changed = True
    return replace(body, api_keys=tuple(kept)) if changed else None


class RecentAnswers:
    """The last ApiVersions answer the gateway gave per (broker, version), for a while.

    A client of a listener that authenticates asks ApiVersions before it logs in. Answering it from
    here spares the upstream connection such a client would otherwise open (an anonymous client
    makes the gateway connect to nothing), and most of the cost of a new connection. The answer is
    the one a client got shortly before, frame and all, so it is exactly what the broker would have
    said then; after ``ttl`` seconds the next client's request goes upstream again and refreshes it.
    Only successful answers are kept (error code 0: an unsupported version is always the broker's).
    """

    def __init__(self, ttl: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._clock = clock
        self._answers: dict[tuple[int, int], tuple[float, bytes]] = {}

    def get(self, node_id: int, version: int, correlation_id: int) -> bytearray | None:
        """The answer to a request for ``version`` to broker ``node_id``, or None (ask upstream)."""
        found = self._answers.get((node_id, version))
        if found is None or self._clock() - found[0] > self._ttl:
            return None
        frame = bytearray(found[1])
        frame[:4] = correlation_id.to_bytes(4, "big", signed=True)
        return frame

    def learn(self, node_id: int, version: int, frame: bytes | bytearray) -> None:
        """Keeps a response frame (header included) the client was sent."""
        if len(frame) >= 6 and frame[4:6] == b"\x00\x00":
            self._answers[(node_id, version)] = (self._clock(), bytes(frame))
