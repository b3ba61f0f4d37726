"""What a hook may answer, beside ``None`` (carry on, forward).

Explicit result objects, not side effects: the core decides what reaches the wire, so ordering,
acks=0 and error encoding stay correct whatever a plugin does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Respond:
    """Answer the client with this response body (a kio response of the request's version);
    the request does not go upstream."""

    response: Any


@dataclass(frozen=True, slots=True)
class Reject:
    """Answer the client with ``error_code`` on every entity of the request (per partition for
    Produce and Fetch, per topic for topic admin calls, top level elsewhere)."""

    error_code: int
    message: str | None = None


@dataclass(frozen=True, slots=True)
class Close:
    """Close the client connection (for protocol abuse; a policy decision should Reject)."""

    reason: str


@dataclass(frozen=True, slots=True)
class PartitionError:
    """From a record hook: fail this topic-partition with ``error_code``; other partitions of the
    same request go on."""

    error_code: int
    message: str | None = None


RequestResult = Respond | Reject | Close | None
ResponseResult = Respond | Close | None
RecordsResult = PartitionError | None
