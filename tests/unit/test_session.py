"""The Kafka session bookkeeping, without sockets: order kept, answers matched, memory bounded."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kanal.protocol.session import ClientSession, SessionError, Slot, UpstreamSession, _sent_before, stream_response


class Owed(Slot):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n


def test_sent_before_survives_correlation_id_wrap() -> None:
    assert _sent_before(5, 6) and not _sent_before(6, 5) and not _sent_before(5, 5)
    assert _sent_before(0x7FFFFFFF, 1)  # 1 was allocated after the wrap
    assert not _sent_before(1, 0x7FFFFFFF)


def test_responses_leave_in_request_order_whatever_order_they_arrive_in() -> None:
    session: ClientSession[Owed] = ClientSession(10)
    a, b, c = session.owe(Owed(1)), session.owe(Owed(2)), session.owe(Owed(3))
    assert not session.fill(c, "c")  # not first: held back
    assert session.take_ready() == []
    assert not session.fill(b, "b")
    assert session.fill(a, "a")
    assert [s.response for s in session.take_ready()] == ["a", "b", "c"]
    assert session.owed == 0


def test_a_full_client_session_refuses_more() -> None:
    session: ClientSession[Owed] = ClientSession(2)
    session.owe(Owed(1))
    session.owe(Owed(2))
    assert session.full
    with pytest.raises(SessionError, match="more than 2"):
        session.owe(Owed(3))


def test_answers_to_acks0_produces_are_dropped_and_forgotten() -> None:
    upstream: UpstreamSession[str] = UpstreamSession()
    c1, c2, c3 = (upstream.next_correlation_id() for _ in range(3))
    upstream.sent_unanswered(c1)  # acks=0
    upstream.sent(c2, "metadata")
    upstream.sent_unanswered(c3)
    assert upstream.received(c1) is None  # a broker that answers acks=0 anyway
    assert upstream.received(c2) == "metadata"
    with pytest.raises(SessionError, match=f"correlation id {c2 + 7}"):
        upstream.received(c2 + 7)


def test_an_unanswered_acks0_is_forgotten_once_a_later_request_is_answered() -> None:
    upstream: UpstreamSession[str] = UpstreamSession()
    first = upstream.next_correlation_id()
    upstream.sent_unanswered(first)
    second = upstream.next_correlation_id()
    upstream.sent(second, "fetch")
    assert upstream.received(second) == "fetch"
    with pytest.raises(SessionError):  # the broker answers in order: it cannot answer `first` now
        upstream.received(first)


def test_the_deadline_is_the_oldest_requests_and_never_goes_back() -> None:
    upstream: UpstreamSession[str] = UpstreamSession()
    assert upstream.deadline == float("inf")
    upstream.sent(upstream.next_correlation_id(), "fetch", deadline=10.5)  # a long poll
    upstream.sent(upstream.next_correlation_id(), "metadata", deadline=3.0)  # waits behind it
    assert upstream.deadline == 10.5
    upstream.received(1)
    assert upstream.deadline == 10.5  # the metadata cannot be late before the fetch is answered
    upstream.received(2)
    assert upstream.deadline == float("inf")


def test_abandon_hands_back_every_waiter_once() -> None:
    upstream: UpstreamSession[str] = UpstreamSession()
    for name in ("a", "b"):
        upstream.sent(upstream.next_correlation_id(), name)
    assert upstream.abandon() == ["a", "b"]
    assert upstream.abandon() == [] and upstream.owed == 0


def test_streaming_needs_a_large_undecoded_first_response_on_an_own_connection() -> None:
    big = 1 << 20
    assert stream_response(big, 1 << 18, dedicated=True, decoded=False, first=True)
    assert not stream_response(1000, 1 << 18, dedicated=True, decoded=False, first=True)
    assert not stream_response(big, 1 << 18, dedicated=False, decoded=False, first=True)
    assert not stream_response(big, 1 << 18, dedicated=True, decoded=True, first=True)
    assert not stream_response(big, 1 << 18, dedicated=True, decoded=False, first=False)


# -- random interleavings ----------------------------------------------------------------------


@dataclass
class Request:
    n: int  # the client's request number (its correlation id)
    link: int  # which upstream connection it went on, or -1: answered by the gateway itself
    acks0: bool


requests_strategy = st.lists(
    st.tuples(st.integers(-1, 2), st.booleans()).map(lambda t: (t[0], t[1] and t[0] >= 0)), max_size=200
)


@settings(max_examples=300, deadline=None)
@given(requests_strategy, st.randoms(use_true_random=False), st.booleans())
def test_random_interleavings_keep_order_and_match_every_answer(
    plan: list[tuple[int, bool]], rng: object, brokers_answer_acks0: bool
) -> None:
    """A client's requests go on three upstream connections (or are answered locally), some are
    acks=0 produces; the brokers answer each connection in order at random moments, interleaved
    with new requests. Every response reaches the client in its request order, each one the answer
    to its own request, and nothing outlives what is owed."""
    import random

    assert isinstance(rng, random.Random)
    limit = 50
    client: ClientSession[Owed] = ClientSession(limit)
    # Kafka never answers acks=0 (then only a few of their ids are kept); a broker that does answers
    # each in turn, so the ids must be kept until then.
    keep = 1000 if brokers_answer_acks0 else 8
    links = [UpstreamSession[Owed](unanswered_limit=keep) for _ in range(3)]
    wire: list[deque[tuple[int, int | None]]] = [deque() for _ in links]  # (upstream corr, request n)
    delivered: list[int] = []
    plan_q = deque(Request(i, link, acks0) for i, (link, acks0) in enumerate(plan))

    def broker_step() -> None:
        busy = [i for i, w in enumerate(wire) if w]
        if not busy:
            return
        i = rng.choice(busy)
        corr, n = wire[i].popleft()
        owner = links[i].received(corr)
        if n is None:
            assert owner is None  # an answer to acks=0 is dropped
            return
        assert owner is not None and owner.n == n  # never a mismatch
        client.fill(owner, f"answer {n}")

    while plan_q or any(wire):
        if plan_q and (not client.full) and rng.random() < 0.6:
            req = plan_q.popleft()
            if req.link < 0:
                client.fill(client.owe(Owed(req.n)), f"answer {req.n}")
            else:
                upstream = links[req.link]
                corr = upstream.next_correlation_id()
                if req.acks0:
                    upstream.sent_unanswered(corr)
                    if brokers_answer_acks0:
                        wire[req.link].append((corr, None))
                else:
                    upstream.sent(corr, client.owe(Owed(req.n)))
                    wire[req.link].append((corr, req.n))
        else:
            broker_step()
        for slot in client.take_ready():
            assert slot.response == f"answer {slot.n}"
            delivered.append(slot.n)
        assert client.owed <= limit
        assert all(len(u._unanswered) <= u.unanswered_limit for u in links)

    expected = [r for r, (link, acks0) in enumerate(plan) if not acks0]
    assert delivered == expected
    assert client.owed == 0 and all(u.owed == 0 for u in links)
