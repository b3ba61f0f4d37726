"""Traffic limits: requests per window (offset commits, group joins, new connections; sliding
windows) and bytes per second (producers, consumers; token buckets)."""

from __future__ import annotations

from kanal.api import Interceptor
from kanal_safeguards.limits.rate_limits import ConsumerRateLimiting, ProducerRateLimiting
from kanal_safeguards.limits.requests import LimitCommitOffset, LimitConnection, LimitJoinGroup

__all__ = ["INTERCEPTORS"]

INTERCEPTORS: list[type[Interceptor]] = [
    LimitCommitOffset,
    LimitJoinGroup,
    LimitConnection,
    ProducerRateLimiting,
    ConsumerRateLimiting,
]
