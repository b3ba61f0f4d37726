"""A virtual cluster's own topic ids, and topic names as its clients (and its interceptors) see them.

With topic-id support on (``GATEWAY_FEATURE_FLAGS_TOPIC_IDS``), a virtual cluster's topics answer
with ids of their own, never the physical topic's: a tenant cannot learn, and so cannot name, an id
of the physical cluster. The virtual id is the physical one XORed with a key drawn from the virtual
cluster's prefix. XOR is its own inverse, so no table maps ids back, every gateway node computes
the same ids, and two virtual clusters sharing a physical topic (an alias) see different ids. An
alias topic has an id of its own too, its physical topic's XORed with a key of the alias. The zero
id, Kafka's "no id", stays zero both ways.

Ids sit in fields named ``topic_id`` in every API that carries them (Metadata, Produce and Fetch
v13+, CreateTopics, DeleteTopics, OffsetCommit/OffsetFetch v10, DescribeTopicPartitions, the
KIP-848 assignments); :func:`map_topic_ids` finds them in any kio message, nested at any depth.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass, replace
from functools import cache
from typing import Any, Final, get_args, get_origin

from kanal.api.services import TopicNames
from kanal.protocol.entities import hints
from kanal.tenancy.names import VirtualNames

__all__ = ["TenantTopicNames", "VirtualTopicIds", "carries_topic_ids", "map_topic_ids"]

_ZERO: Final = uuid.UUID(int=0)
_FIELD: Final = "topic_id"


def _key(label: str) -> int:
    digest = hashlib.sha256(b"kanal virtual topic id\x00" + label.encode()).digest()
    return int.from_bytes(digest[:16], "big")


class VirtualTopicIds:
    """The ids of one virtual cluster's topics: ``physical XOR key(prefix)``, and back; an alias
    topic's: ``physical XOR key(prefix, alias)``.

    An alias id is told from a topic's own by the physical topic it would stand for: ``known`` (the
    gateway's id-to-name cache) must name the alias's physical topic. The cache learns that id from
    the Metadata answer that gave the client the alias id; a client that kept an alias id across a
    gateway restart may first be told the topic is unknown, and refreshes its metadata.
    """

    __slots__ = ("_aliases", "_key", "_known")

    def __init__(
        self,
        prefix: str,
        aliases: Mapping[str, str] | None = None,
        known: Callable[[uuid.UUID], str | None] = lambda topic_id: None,
    ) -> None:
        self._key = _key(prefix)
        self._aliases = {alias: (_key(f"{prefix}\x00{alias}"), target) for alias, target in (aliases or {}).items()}
        self._known = known

    def virtual(self, physical: uuid.UUID, alias: str | None = None) -> uuid.UUID:
        """The id the virtual cluster shows for a physical topic, under ``alias`` if it is one."""
        if physical.int == 0:
            return physical
        entry = self._aliases.get(alias) if alias is not None else None
        return uuid.UUID(int=physical.int ^ (self._key if entry is None else entry[0]))

    def resolve(self, virtual: uuid.UUID) -> tuple[uuid.UUID, str | None]:
        """The physical id of one of the virtual cluster's ids, and the alias it is the id of
        (None: the topic's own id)."""
        if virtual.int == 0:
            return virtual, None
        for alias, (key, target) in self._aliases.items():
            candidate = uuid.UUID(int=virtual.int ^ key)
            if self._known(candidate) == target:
                return candidate, alias
        return uuid.UUID(int=virtual.int ^ self._key), None

    def physical(self, virtual: uuid.UUID) -> uuid.UUID:
        return self.resolve(virtual)[0]


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

    def _physical(self, topic_id: uuid.UUID) -> tuple[uuid.UUID, str | None]:
        return (topic_id, None) if self._ids is None else self._ids.resolve(topic_id)

    def name(self, topic_id: uuid.UUID) -> str | None:
        physical_id, alias = self._physical(topic_id)
        if alias is not None:
            return alias
        physical = self._base.name(physical_id)
        return None if physical is None else self._names.logical_topic(physical)

    def id(self, name: str) -> uuid.UUID | None:
        physical = self._base.id(self._names.topic(name))
        if physical is None or self._ids is None:
            return physical
        return self._ids.virtual(physical, name if name in self._names.aliases else None)

    def stored(self, name: str) -> str:
        return self._names.topic(name)

    async def resolve(self, topic_id: uuid.UUID) -> str:
        physical_id, alias = self._physical(topic_id)
        if alias is not None:
            return alias
        physical = await self._base.resolve(physical_id)
        logical = self._names.logical_topic(physical)
        return logical if logical is not None else str(topic_id)
