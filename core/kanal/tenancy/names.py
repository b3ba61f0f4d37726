"""How a virtual cluster's logical names map to physical names, and back.

A virtual cluster stores its topics, consumer group ids and transactional ids on the physical
cluster as ``<prefix><logical name>``; the prefix is the virtual cluster's name, used verbatim (it
carries its own separator, e.g. ``team-a.``). A physical name without the prefix belongs to someone
else (another virtual cluster, ``__consumer_offsets``, the gateway's own ``_kanal_*`` topics) and
has no logical name: the mapping back answers None, and the caller hides it.

Two virtual clusters' prefixes must not be prefixes of one another (``team-a.`` and ``team-a.b.``),
or the shorter one would see the longer one's names.

Topics may also have aliases (:mod:`kanal.tenancy.aliases`): a logical name that stands for any
physical topic. :meth:`VirtualNames.topic` follows them; the way back depends on the name the
request used (:mod:`kanal.tenancy.rewrite` remembers it), else :meth:`VirtualNames.logical_topic`
gives the topic's own name or its first alias.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from kio.schema.errors import ErrorCode

#: Kafka's longest topic name: the physical name, prefix included, must fit.
MAX_TOPIC_LENGTH: Final = 249
#: The error Kafka answers for a topic name it refuses (``INVALID_TOPIC_EXCEPTION``, 17).
INVALID_TOPIC: Final = ErrorCode.invalid_topic_exception

# A prefix is part of every physical topic name, so it may use only the characters Kafka allows there.
_LEGAL_TOPIC_CHARS = re.compile(r"[a-zA-Z0-9._-]+")
# Names Kafka refuses whatever their length; the prefix would make them legal physical names.
_RESERVED_TOPICS = frozenset({"", ".", ".."})
# How much of a refused name a message quotes: enough to recognise it, short enough to read.
_QUOTED = 40


def _quoted(name: str) -> str:
    return name if len(name) <= _QUOTED else name[:_QUOTED] + "..."


@dataclass(frozen=True, slots=True)
class VirtualNames:
    """The names of one virtual cluster: ``prefix + logical`` on the physical cluster, or the
    physical topic an alias stands for."""

    prefix: str
    #: The virtual cluster's alias topics: logical name -> physical name.
    aliases: Mapping[str, str] = field(default_factory=dict, compare=False)

    @classmethod
    def passthrough(cls, aliases: Mapping[str, str]) -> VirtualNames:
        """The passthrough cluster's names: its own, but for its aliases (no prefix)."""
        names = object.__new__(cls)
        object.__setattr__(names, "prefix", "")
        object.__setattr__(names, "aliases", aliases)
        return names

    def __post_init__(self) -> None:
        if not _LEGAL_TOPIC_CHARS.fullmatch(self.prefix):
            raise ValueError(
                f"virtual cluster prefix {self.prefix!r} must be non-empty and use only "
                "ASCII letters, digits, '.', '_' and '-' (it is part of every topic name)"
            )
        if len(self.prefix) >= MAX_TOPIC_LENGTH:
            raise ValueError(
                f"virtual cluster prefix {_quoted(self.prefix)!r} is {len(self.prefix)} characters; "
                f"it must leave room for a topic name within Kafka's {MAX_TOPIC_LENGTH}"
            )

    # -- topics --------------------------------------------------------------------------------

    def topic(self, logical: str) -> str:
        aliased = self.aliases.get(logical)
        return self.prefix + logical if aliased is None else aliased

    def logical_topic(self, physical: str) -> str | None:
        """The logical name of a physical topic: its own (``prefix + name``) unless an alias of that
        name shadows it, else the first alias that stands for it; None when the topic is none of
        this virtual cluster's. (A response names the topic as its request did: see
        :mod:`kanal.tenancy.rewrite`.)"""
        own = physical[len(self.prefix) :] if physical.startswith(self.prefix) else None
        if not self.aliases or (own is not None and own not in self.aliases):
            return own
        return next((alias for alias, target in self.aliases.items() if target == physical), None)

    def invalid_topic(self, logical: str) -> str | None:
        """Why Kafka would refuse to create this logical topic, or None when it may be created.

        Kafka checks the physical name, which is longer than the client's: without this check a
        client would get an error about a name it never sent, or, for the names Kafka reserves
        (empty, ``.``, ``..``), a topic Kafka itself would have refused.
        """
        if logical in _RESERVED_TOPICS:
            return f"topic name {logical!r} is not allowed"
        length = len(self.prefix) + len(logical)
        if length > MAX_TOPIC_LENGTH:
            return (
                f"topic name {_quoted(logical)!r} is {length} characters with the virtual cluster's prefix "
                f"{self.prefix!r}; Kafka allows at most {MAX_TOPIC_LENGTH}"
            )
        return None

    # -- consumer groups -----------------------------------------------------------------------

    def group(self, logical: str) -> str:
        return self.prefix + logical

    def logical_group(self, physical: str) -> str | None:
        """The logical group id, or None when the group is not this virtual cluster's."""
        return physical[len(self.prefix) :] if physical.startswith(self.prefix) else None

    # -- transactional ids ---------------------------------------------------------------------

    def transactional_id(self, logical: str) -> str:
        return self.prefix + logical

    def logical_transactional_id(self, physical: str) -> str | None:
        """The logical transactional id, or None when it is not this virtual cluster's."""
        return physical[len(self.prefix) :] if physical.startswith(self.prefix) else None
