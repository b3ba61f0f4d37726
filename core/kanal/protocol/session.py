"""The bookkeeping of a Kafka exchange, sans-I/O: what is owed to whom, in which order.

Two halves, because with pooled upstream connections they are not one-to-one:

- :class:`ClientSession`: the responses owed to one client, in its request order. Kafka promises a
  client its responses in the order of its requests; the gateway may get them from several
  upstream connections, or answer some itself, so each request gets a slot and the slots leave in
  order, as soon as the first ones are filled.
- :class:`UpstreamSession`: the requests one upstream connection owes answers to. A broker answers
  a connection's requests one at a time, in order, and never answers a Produce with acks=0 (some
  brokers do anyway), so a response must match the oldest request still owed, after skipping
  answers to acks=0 produces.

Both are bounded: a client session holds at most ``limit`` slots (the I/O layer stops reading from
a client whose session is full); an upstream session forgets acks=0 correlation ids once a later
request has been answered (the broker answers in order, it will not answer them any more) and
keeps at most ``unanswered_limit`` of them.

Deadlines: each request owed by an upstream connection may carry the time by which it must be
answered. As the broker answers in order, a request cannot be answered before the ones sent
earlier, so the deadline to watch is the oldest request's, and a later request's deadline is never
earlier than an earlier one's (:meth:`UpstreamSession.sent` takes the maximum).
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

W = TypeVar("W")

_CORR_MASK = 0x7FFFFFFF


class SessionError(Exception):
    """The peer broke the exchange: an answer to a request never sent, or out of order."""


class Slot:
    """One response owed to a client, and the response once it is there (anything the I/O layer
    hands over). The I/O layer subclasses it with what it keeps about the request."""

    __slots__ = ("filled", "response")

    def __init__(self) -> None:
        self.response: object = None
        self.filled = False


S = TypeVar("S", bound=Slot)


class ClientSession(Generic[S]):
    """The responses owed to one client, released in its request order."""

    __slots__ = ("_slots", "limit")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self._slots: deque[S] = deque()

    def owe(self, slot: S) -> S:
        """A new request that expects a response. The caller must wait while :attr:`full`."""
        if len(self._slots) >= self.limit:
            raise SessionError(f"more than {self.limit} responses owed")
        self._slots.append(slot)
        return slot

    def fill(self, slot: S, response: object) -> bool:
        """Records the response of ``slot``; whether it is now ready to go (the first owed)."""
        slot.response = response
        slot.filled = True
        return bool(self._slots) and self._slots[0] is slot

    def take_ready(self) -> list[S]:
        """The filled slots at the head, in order, removed from the session."""
        slots = self._slots
        ready: list[S] = []
        while slots and slots[0].filled:
            ready.append(slots.popleft())
        return ready

    def take_first(self) -> S:
        """Removes the first slot (answered out of turn: it was first, and is now gone)."""
        return self._slots.popleft()

    def first_filled(self) -> bool:
        """Whether the first slot owed is ready to go."""
        return bool(self._slots) and self._slots[0].filled

    def is_first(self, slot: S) -> bool:
        """Whether ``slot`` is the next to go (everything owed before it has gone)."""
        return bool(self._slots) and self._slots[0] is slot

    @property
    def owed(self) -> int:
        return len(self._slots)

    @property
    def full(self) -> bool:
        return len(self._slots) >= self.limit


class UpstreamSession(Generic[W]):
    """The requests one upstream connection owes answers to, oldest first."""

    __slots__ = ("_deadlines", "_expected", "_last_deadline", "_next", "_owners", "_unanswered", "unanswered_limit")

    def __init__(self, unanswered_limit: int = 4096) -> None:
        self._next = 0
        self._expected: deque[int] = deque()
        self._owners: deque[W] = deque()
        self._deadlines: deque[float] = deque()
        self._last_deadline = float("-inf")
        self._unanswered: deque[int] = deque()
        self.unanswered_limit = unanswered_limit

    def next_correlation_id(self) -> int:
        """The correlation id of the next request on this connection (wraps at 2**31)."""
        self._next = (self._next + 1) & _CORR_MASK
        return self._next

    def sent(self, correlation_id: int, owner: W, deadline: float = float("inf")) -> None:
        """A request that expects an answer went out; ``owner`` gets it."""
        self._last_deadline = max(deadline, self._last_deadline) if self._expected else deadline
        self._expected.append(correlation_id)
        self._owners.append(owner)
        self._deadlines.append(self._last_deadline)

    def sent_unanswered(self, correlation_id: int) -> None:
        """A request Kafka never answers (Produce with acks=0) went out."""
        unanswered = self._unanswered
        unanswered.append(correlation_id)
        if len(unanswered) > self.unanswered_limit:
            unanswered.popleft()

    def received(self, correlation_id: int) -> W | None:
        """The owner of the response with ``correlation_id``, or None for an answer to an acks=0
        produce (to be dropped). Raises SessionError for anything else."""
        unanswered = self._unanswered
        if self._expected and self._expected[0] == correlation_id:
            self._expected.popleft()
            self._deadlines.popleft()
            while unanswered and _sent_before(unanswered[0], correlation_id):
                unanswered.popleft()  # never answered, as Kafka specifies
            return self._owners.popleft()
        while unanswered:
            corr = unanswered.popleft()
            if corr == correlation_id:
                return None
            if not _sent_before(corr, correlation_id):
                unanswered.appendleft(corr)
                break
        expected = self._expected[0] if self._expected else None
        raise SessionError(f"upstream answered correlation id {correlation_id}, expected {expected}")

    @property
    def deadline(self) -> float:
        """When the oldest request owed must have been answered (infinity when none is owed)."""
        return self._deadlines[0] if self._deadlines else float("inf")

    @property
    def owed(self) -> int:
        return len(self._expected)

    def abandon(self) -> list[W]:
        """Every owner still waiting, oldest first; the session owes nothing afterwards (the
        connection is being closed)."""
        owners = list(self._owners)
        self._expected.clear()
        self._owners.clear()
        self._deadlines.clear()
        self._unanswered.clear()
        return owners


def _sent_before(a: int, b: int) -> bool:
    """Whether correlation id ``a`` was sent before ``b`` on one connection (ids wrap at 2**31)."""
    return a != b and ((b - a) & _CORR_MASK) < 0x40000000


def stream_response(size: int, stream_from: int, *, dedicated: bool, decoded: bool, first: bool) -> bool:
    """Whether a response of ``size`` bytes is forwarded while it arrives instead of buffered whole:
    only a large one that nothing needs decoded, at the head of its client's responses (nothing owed
    before it), on an upstream connection of that client's own (a shared one would stall every
    other client behind a slow reader)."""
    return size >= stream_from and dedicated and not decoded and first
