"""Topic id to name cache, shared by every connection of a gateway.

Produce and Fetch v13+ name topics by id only; record plugins need names. The cache is fed by
the Metadata responses that pass through the gateway (and the gateway's own Metadata calls).
"""

from __future__ import annotations

import uuid
from typing import Any

from kanal.protocol.api import ApiKey

_ZERO = uuid.UUID(int=0)


class TopicNames:
    """A plain dict both ways; entries are replaced when a topic is re-created under a new id."""

    __slots__ = ("_by_id", "_by_name")

    def __init__(self) -> None:
        self._by_id: dict[uuid.UUID, str] = {}
        self._by_name: dict[str, uuid.UUID] = {}

    def learn(self, api_key: int, body: Any) -> None:
        """Records the topic ids of a Metadata response (v10+ carries them)."""
        if api_key != ApiKey.METADATA:
            return
        for topic in body.topics:
            topic_id = getattr(topic, "topic_id", None)
            if topic.name and topic_id and topic_id != _ZERO:
                self.put(topic_id, str(topic.name))

    def put(self, topic_id: uuid.UUID, name: str) -> None:
        old = self._by_name.get(name)
        if old is not None and old != topic_id:
            self._by_id.pop(old, None)
        self._by_id[topic_id] = name
        self._by_name[name] = topic_id

    def name(self, topic_id: uuid.UUID) -> str | None:
        return self._by_id.get(topic_id)

    def id(self, name: str) -> uuid.UUID | None:
        return self._by_name.get(name)

    def forget(self, name: str) -> None:
        topic_id = self._by_name.pop(name, None)
        if topic_id is not None:
            self._by_id.pop(topic_id, None)

    def __len__(self) -> int:
        return len(self._by_id)
