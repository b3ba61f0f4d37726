"""KIP-227 fetch sessions as the broker holds them, per client connection, so that a policy knows
what a Fetch of a session really fetches.

A Fetch of a session (Fetch v7+, the Java client and kafka-python; librdkafka never opens one)
lists only the partitions that changed since the session's previous Fetch: the others are fetched
all the same. By the request's ``session_id`` and ``session_epoch``, as the broker reads them:

- epoch -1: a full fetch of the listed partitions outside any session (``session_id`` X != 0
  closes session X first);
- epoch 0: a full fetch that asks for a new session (X != 0 closes X first). The broker's response
  names the new session in its ``session_id`` (0: none was opened, as Tansu always answers, or as
  the cache makes it when it sends the Fetch sessionless): it is recorded from the response;
- epoch > 0: an incremental fetch of session X: the listed partitions join (or stay in) the
  session, ``forgotten_topics_data`` leave it, and every partition of the session is fetched.

The changes of an incremental Fetch are applied when the request passes, so its response need
not be decoded (Fetch responses stay bytes). When the broker or a policy refuses it, the client's
next Fetch of that broker is a full one (on a top-level error the Java client and kafka-python
close or forget the session), which replaces the session here too. Sessions a client leaves
behind are bounded by :data:`MAX_SESSIONS` (least recently used dropped first), a session by
:data:`MAX_PARTITIONS`, and all of them go with the connection.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from kanal.api import ApiKey, ErrorCode, RequestContext, build, response_class

__all__ = [
    "MAX_PARTITIONS",
    "MAX_SESSIONS",
    "FetchSessions",
    "Session",
    "SessionTopic",
    "TopicKey",
    "forgotten_topics",
    "listed_topics",
    "session_not_found",
]

#: Sessions kept per connection. A client has one per broker connection; more are sessions it gave
#: up (after an error it opens a new one): the least recently used are dropped first.
MAX_SESSIONS = 8
#: Partitions kept per session. A bigger session is dropped (its incremental Fetch is asked to start
#: over), so that a client cannot grow the gateway's memory without bound.
MAX_PARTITIONS = 100_000

#: How a session names a topic: by name (Fetch v7-12) or by id (v13+), as the broker keys it.
TopicKey = str | uuid.UUID


@dataclass(slots=True)
class SessionTopic:
    """A topic of a session: its name for the rules (None when the request named it by an id
    nobody knows) and its partitions in the session."""

    name: str | None
    partitions: set[int] = field(default_factory=set)


Session = dict[TopicKey, SessionTopic]


def _key(topic: Any) -> TopicKey:
    """The key of a request's topic entry: its id when the version names topics by id."""
    topic_id = getattr(topic, "topic_id", None)
    return topic_id if topic_id is not None else str(topic.topic)


async def listed_topics(ctx: RequestContext) -> Session:
    """The topics and partitions a Fetch request lists, with their names (ids resolved)."""
    listed: Session = {}
    for topic in ctx.request.topics:
        key = _key(topic)
        entry = listed.get(key)
        if entry is None:
            name = getattr(topic, "topic", None)
            if isinstance(key, uuid.UUID):
                name = ctx.topic_names.name(key) or await ctx.topic_names.resolve(key)
            entry = listed[key] = SessionTopic(name)
        entry.partitions.update(int(part.partition) for part in topic.partitions)
    return listed


def forgotten_topics(request: Any) -> dict[TopicKey, set[int]]:
    """The partitions an incremental Fetch takes out of its session (``forgotten_topics_data``)."""
    forgotten: dict[TopicKey, set[int]] = {}
    for topic in getattr(request, "forgotten_topics_data", None) or ():
        forgotten.setdefault(_key(topic), set()).update(int(p) for p in topic.partitions)
    return forgotten


def session_not_found(version: int) -> Any:
    """The Fetch response of the broker to an incremental Fetch of a session it does not hold
    (``FETCH_SESSION_ID_NOT_FOUND``, no partitions): the client then opens a new session with a full
    Fetch, whose topics are learnt from."""
    cls = response_class(ApiKey.FETCH, version)
    if cls is None:  # pragma: no cover - every Fetch version with sessions (v7+) has a schema
        raise ValueError(f"no Fetch response schema for version {version}")
    return build(cls, error_code=ErrorCode.fetch_session_id_not_found, session_id=0, responses=())


class FetchSessions:
    """The fetch sessions of one client connection: the topics and partitions of each session id."""

    __slots__ = ("_sessions",)

    def __init__(self) -> None:
        self._sessions: dict[int, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def topics(self, session_id: int) -> Session | None:
        """The topics of a session, or None when it is not known here."""
        return self._sessions.get(session_id)

    def open(self, session_id: int, topics: Session) -> None:
        """The broker opened ``session_id`` for a full Fetch of ``topics``."""
        self._sessions.pop(session_id, None)
        if _size(topics) > MAX_PARTITIONS:
            return
        self._sessions[session_id] = {key: SessionTopic(t.name, set(t.partitions)) for key, t in topics.items()}
        while len(self._sessions) > MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]

    def close(self, session_id: int) -> None:
        """A full Fetch with ``session_id`` closes that session (it does nothing for 0)."""
        self._sessions.pop(session_id, None)

    def incremental(self, session_id: int, listed: Session, forgotten: dict[TopicKey, set[int]]) -> Session | None:
        """Applies an incremental Fetch to its session (listed partitions added, then forgotten
        ones removed, as the broker does) and returns the session's topics after it; None for a
        session not known here."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return None
        for key, topic in listed.items():
            held = session.get(key)
            if held is None:
                session[key] = SessionTopic(topic.name, set(topic.partitions))
            else:
                held.name = topic.name if topic.name is not None else held.name
                held.partitions |= topic.partitions
        for key, partitions in forgotten.items():
            held = session.get(key)
            if held is not None:
                held.partitions -= partitions
                if not held.partitions:
                    del session[key]
        if _size(session) > MAX_PARTITIONS:
            return None
        self._sessions[session_id] = session  # the most recently used last
        return session


def _size(topics: Session) -> int:
    return sum(len(t.partitions) for t in topics.values())
