"""Counting events per key in a sliding window.

The limits (commits and joins per minute per group, new connections per second) use a *sliding*
window: an event is over the limit when ``limit`` events of the same key were counted in the
``seconds`` before it. Only the last ``limit`` times of a key are kept (the oldest of them says
whether the window is full), so memory is bounded by ``limit`` per active key, and keys idle for
a whole window are dropped. The clock is injectable so that tests count without sleeping.

In a fleet, the limit a key is held to is this node's share of the declared limit, which moves
with the fleet's usage (:mod:`kanal_safeguards.limits.fleet_usage`): :meth:`SlidingWindow.set_limits`
replaces the limits in place. A share is never above the declared limit, which stays the most
times kept per key.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping

__all__ = ["Clock", "SlidingWindow"]

Clock = Callable[[], float]


class SlidingWindow:
    """At most ``limit`` counted events per key in any ``seconds`` long span."""

    def __init__(self, limit: int, seconds: float, clock: Clock = time.monotonic) -> None:
        self.limit = limit  # the limit of any key but those of ``_limits``
        self.capacity = limit  # the most times kept per key: the declared limit
        self.seconds = seconds
        self.clock = clock
        self._limits: dict[Hashable, int] = {}  # keys whose limit is not ``limit`` (fleet shares)
        self._times: dict[Hashable, deque[float]] = {}
        self._next_sweep = clock() + seconds

    def set_limits(self, limit: int, by_key: Mapping[Hashable, int] | None = None) -> None:
        """Makes ``limit`` the limit of every key but those of ``by_key`` (which get theirs): a new
        share of a fleet-wide limit (at most the declared limit)."""
        self.limit = min(max(int(limit), 0), self.capacity)
        self._limits = {key: min(max(int(n), 0), self.capacity) for key, n in (by_key or {}).items()}

    def limit_of(self, key: Hashable) -> int:
        """The limit ``key`` is held to now."""
        return self._limits.get(key, self.limit)

    def recent(self) -> int:
        """The events counted in the last window, all keys together, at most the declared limit per
        key (what is kept): the console's figure, never asked on the hot path."""
        horizon = self.clock() - self.seconds
        return sum(sum(1 for at in times if at > horizon) for times in list(self._times.values()))

    def full(self, key: Hashable) -> bool:
        """Whether one more event of ``key`` now would be over the limit."""
        limit = self._limits.get(key, self.limit)
        if limit <= 0:
            return True
        times = self._times.get(key)
        return times is not None and len(times) >= limit and times[-limit] > self.clock() - self.seconds

    def count(self, key: Hashable) -> None:
        """Counts one event of ``key`` now."""
        now = self.clock()
        if now >= self._next_sweep:
            self._sweep(now)
        if self.capacity <= 0:
            return
        times = self._times.get(key)
        if times is None:
            times = self._times[key] = deque(maxlen=self.capacity)
        times.append(now)

    def take(self, key: Hashable, *, always: bool = False) -> bool:
        """True when an event of ``key`` now is within the limit. The event is counted when it is
        within the limit, or anyway with ``always`` (an event let through over the limit, INFO or
        THROTTLE, still happened)."""
        allowed = not self.full(key)
        if allowed or always:
            self.count(key)
        return allowed

    def _sweep(self, now: float) -> None:
        """Drops the keys with no event in the last window (why memory stays bounded)."""
        horizon = now - self.seconds
        for key in [k for k, times in self._times.items() if not times or times[-1] <= horizon]:
            del self._times[key]
        self._next_sweep = now + self.seconds

    def __len__(self) -> int:
        """How many keys are tracked (for tests of the sweep)."""
        return len(self._times)
