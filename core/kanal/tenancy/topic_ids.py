"""A virtual cluster's own topic ids, and topic names as its clients (and its interceptors) see them.

With topic-id support on (``GATEWAY_FEATURE_FLAGS_TOPIC_IDS``), a virtual cluster's topics answer
with ids of their own, never the physical topic's: a tenant cannot learn, and so cannot name, an id
of the physical cluster. The virtual id is the physical one XORed with a key drawn from the virtual
cluster's prefix. XOR is its own inverse, so no table maps ids back, every gateway node computes
the same ids, and two virtual clusters sharing a physical topic (an alias) see different ids. The
zero id, Kafka's "no id", stays zero both ways.

Ids sit in fields named ``topic_id`` in every API that carries them (Metadata, Produce and Fetch
v13+, CreateTopics, DeleteTopics, OffsetCommit/OffsetFetch v10, DescribeTopicPartitions, the
KIP-848 assignments); :func:`map_topic_ids` finds them in any kio message, nested at any depth.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from dataclasses import fields, is_dataclass, replace
from functools import cache
from typing import Any, Final, get_args, get_origin

from kanal.api.services import TopicNames
from kanal.protocol.entities import hints
from kanal.tenancy.names import VirtualNames

__all__ = ["TenantTopicNames", "VirtualTopicIds", "carries_topic_ids", "map_topic_ids"]

_ZERO: Final = uuid.UUID(int=0)
_FIELD: Final = "topic_id"


class VirtualTopicIds:
    """The ids of one virtual cluster's topics: ``physical XOR key(prefix)``, and back."""

    __slots__ = ("_key",)

    def __init__(self, prefix: str) -> None:
        digest = hashlib.sha256(b"kanal virtual topic id\x00" + prefix.encode()).digest()
        self._key = int.from_bytes(digest[:16], "big")

    def virtual(self, physical: uuid.UUID) -> uuid.UUID:
        return physical if physical.int == 0 else uuid.UUID(int=physical.int ^ self._key)

    def physical(self, virtual: uuid.UUID) -> uuid.UUID:
        return virtual if virtual.int == 0 else uuid.UUID(int=virtual.int ^ self._key)


# -- where ids are, per message class --------------------------------------------------------------

_ID, _ONE, _MANY = 0, 1, 2
_Plan = tuple[tuple[str, int, type | None], ...]


def _entity(hint: Any) -> tuple[int, type] | None:
    """(one or many, entity class) of a field holding entities, or None."""
    for arg in (hint, *get_args(hint)):
        many = get_origin(arg) is tuple
        if many:
            arg = get_args(arg)[0]
        if isinstance(arg, type) and is_dataclass(arg):
            return (_MANY if many else _ONE), arg
    return None


@cache
def _plan(cls: type) -> _Plan:
    """The fields of ``cls`` that are topic ids or lead to some."""
    steps: list[tuple[str, int, type | None]] = []
    types = hints(cls)
    for f in fields(cls):
        if f.name == _FIELD:
            steps.append((f.name, _ID, None))
            continue
        nested = _entity(types[f.name])
        if nested is not None and _plan(nested[1]):
            steps.append((f.name, nested[0], nested[1]))
    return tuple(steps)


def carries_topic_ids(cls: type) -> bool:
    """Whether messages of this kio class can hold a topic id."""
    return bool(_plan(cls))


def map_topic_ids(message: Any, mapping: Callable[[uuid.UUID], uuid.UUID]) -> Any:
    """``message`` with every topic id mapped (the same object when none changed)."""
    plan = _plan(type(message))  # type: ignore[arg-type]
    if not plan:
        return message
    changes: dict[str, Any] = {}
    for name, kind, _ in plan:
        value: Any = getattr(message, name)
        mapped: Any
        if value is None:
            continue
        if kind == _ID:
            mapped = mapping(value)
        elif kind == _ONE:
            mapped = map_topic_ids(value, mapping)
        else:
            items = tuple(map_topic_ids(item, mapping) for item in value)
            mapped = value if all(a is b for a, b in zip(items, value, strict=True)) else items
        if mapped is not value and mapped != value:
            changes[name] = mapped
    return replace(message, **changes) if changes else message


# -- names as the tenant sees them -----------------------------------------------------------------


class TenantTopicNames:
    """The gateway's topic names as a virtual cluster's clients see them: logical names and, with
    ``ids``, virtual ids (without, the physical ids, as the tenant's clients get them).

    Interceptors of the virtual cluster get this as ``ctx.topic_names``, so a topic a request names
    by id is named as the tenant names it; a topic of someone else has no name here.
    """

    def __init__(self, base: TopicNames, names: VirtualNames, ids: VirtualTopicIds | None) -> None:
        self._base = base
        self._names = names
        self._ids = ids

    def _physical(self, topic_id: uuid.UUID) -> uuid.UUID:
        return topic_id if self._ids is None else self._ids.physical(topic_id)

    def name(self, topic_id: uuid.UUID) -> str | None:
        physical = self._base.name(self._physical(topic_id))
        return None if physical is None else self._names.logical_topic(physical)

    def id(self, name: str) -> uuid.UUID | None:
        physical = self._base.id(self._names.topic(name))
        if physical is None or self._ids is None:
            return physical
        return self._ids.virtual(physical)

    async def resolve(self, topic_id: uuid.UUID) -> str:
        physical = await self._base.resolve(self._physical(topic_id))
        logical = self._names.logical_topic(physical)
        return logical if logical is not None else str(topic_id)
