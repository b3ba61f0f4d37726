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

In a fleet, the rate is this node's share of the limit, which moves with the fleet's usage
(:mod:`kanal_safeguards.limits.fleet_usage`): :meth:`TokenBuckets.set_rates` replaces the rates in
place (one rate for any key, and one per key some node used), and every bucket keeps holding
``burst / rate`` seconds' worth. A bucket's debt, in seconds, is unchanged by a new rate.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping

from kanal_safeguards.limits.windows import Clock

__all__ = ["TokenBuckets"]

_MIN_RATE = 1.0  # bytes per second: a share is never 0 (a key would wait forever)


class TokenBuckets:
    """A token bucket per key, all with the same ``rate`` (bytes per second) and ``burst``."""

    __slots__ = ("_fill_time", "_next_sweep", "_rates", "_zero_at", "burst", "clock", "rate")

    def __init__(self, rate: float, burst: float | None = None, clock: Clock = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError("rate must be > 0")
        self.rate = float(rate)
        self.burst = float(rate if burst is None else burst)
        self.clock = clock
        self._fill_time = self.burst / self.rate  # seconds an empty bucket takes to fill
        self._rates: dict[Hashable, float] = {}  # keys whose rate is not ``rate`` (fleet shares)
        self._zero_at: dict[Hashable, float] = {}
        self._next_sweep = clock() + max(self._fill_time, 1.0)

    def set_rates(self, rate: float, by_key: Mapping[Hashable, float] | None = None) -> None:
        """Makes ``rate`` the rate of every key but those of ``by_key`` (which get theirs): a new
        share of a fleet-wide limit. Each bucket still holds ``burst / rate`` seconds' worth."""
        self.rate = max(float(rate), _MIN_RATE)
        self.burst = self.rate * self._fill_time
        self._rates = {key: max(float(r), _MIN_RATE) for key, r in (by_key or {}).items()}

    def rate_of(self, key: Hashable) -> float:
        """The rate of the bucket of ``key``, in bytes per second."""
        return self._rates.get(key, self.rate)

    def level(self, key: Hashable) -> float:
        """The bytes ``key`` may still send now without debt (negative: its debt)."""
        now = self.clock()
        rate = self._rates.get(key, self.rate)
        burst = rate * self._fill_time
        zero_at = self._zero_at.get(key)
        if zero_at is None:
            return burst
        return min(burst, rate * (now - zero_at))

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
        zero_at += amount / self._rates.get(key, self.rate)
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
