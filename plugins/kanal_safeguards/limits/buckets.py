"""Token buckets of bytes per key, for the byte-rate limits.

A bucket fills at ``rate`` bytes per second up to ``burst`` bytes (one second's worth by default)
and every request or response takes its bytes from it, even when that leaves it below zero: the
bytes have already been sent, so what they cost is *debt*, and the client is told to wait (and is
held) until its bucket is back at zero. This is how Kafka brokers account quotas (KIP-219): the
request is never refused, the client is slowed.

One float per key says it all: the time at which the bucket is (or was) at exactly zero. Its level
at ``now`` is ``rate * (now - zero_at)``, capped at ``burst``. Keys whose bucket has refilled are
dropped in a periodic sweep, so memory follows the active clients. The clock is injectable so that
tests count without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Hashable

from kanal_safeguards.limits.windows import Clock

__all__ = ["TokenBuckets"]


class TokenBuckets:
    """A token bucket per key, all with the same ``rate`` (bytes per second) and ``burst``."""

    __slots__ = ("_fill_time", "_next_sweep", "_zero_at", "burst", "clock", "rate")

    def __init__(self, rate: float, burst: float | None = None, clock: Clock = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError("rate must be > 0")
        self.rate = float(rate)
        self.burst = float(rate if burst is None else burst)
        self.clock = clock
        self._fill_time = self.burst / self.rate  # seconds an empty bucket takes to fill
        self._zero_at: dict[Hashable, float] = {}
        self._next_sweep = clock() + max(self._fill_time, 1.0)

    def level(self, key: Hashable) -> float:
        """The bytes ``key`` may still send now without debt (negative: its debt)."""
        now = self.clock()
        zero_at = self._zero_at.get(key)
        if zero_at is None:
            return self.burst
        return min(self.burst, self.rate * (now - zero_at))

    def debt(self, key: Hashable) -> float:
        """Seconds until the bucket of ``key`` is back at zero (0.0 when it is not in debt)."""
        zero_at = self._zero_at.get(key)
        if zero_at is None:
            return 0.0
        return max(0.0, zero_at - self.clock())

    def take(self, key: Hashable, amount: int) -> float:
        """Takes ``amount`` bytes from the bucket of ``key`` (always: they were sent); returns the
        debt left, in seconds, as :meth:`debt` would."""
        now = self.clock()
        if now >= self._next_sweep:
            self._sweep(now)
        zero_at = self._zero_at.get(key)
        if zero_at is None or now - zero_at > self._fill_time:
            zero_at = now - self._fill_time  # full (a new key, or one that was idle long enough)
        zero_at += amount / self.rate
        self._zero_at[key] = zero_at
        return max(0.0, zero_at - now)

    def _sweep(self, now: float) -> None:
        """Drops the full buckets: a missing key is a full bucket, so nothing changes but memory."""
        horizon = now - self._fill_time
        for key in [k for k, zero_at in self._zero_at.items() if zero_at <= horizon]:
            del self._zero_at[key]
        self._next_sweep = now + max(self._fill_time, 1.0)

    def __len__(self) -> int:
        """How many buckets are tracked (for tests of the sweep)."""
        return len(self._zero_at)
