"""ApiVersions negotiation: the gateway offers only what both it and the upstream can speak."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kanal.protocol.api import supported_versions


def intersect(body: Any) -> Any | None:
    """The ApiVersions response limited to versions the gateway can decode; None if unchanged."""
    kept = []
    changed = False
    for entry in body.api_keys:
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
    return replace(body, api_keys=tuple(kept)) if changed else None
