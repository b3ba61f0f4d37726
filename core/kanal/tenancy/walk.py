"""Where names sit in a kio message, described as data, and the walk that maps them.

A :data:`Spec` maps field names of a kio entity to a :data:`Rule` saying what the field holds: a
name of some :class:`Kind`, a tuple of names, a regex over names, or nested entities with their own
spec. One spec describes every version of a message: fields a version lacks are skipped, so version
differences (a field added, a field moved into a nested array) are just more entries in the spec.

The walk touches only the fields the spec names, and copies an entity (``dataclasses.replace``, which
shares every other field, record bytes included) only when one of its names changed, so its cost
follows the number of names in a message, not its size.

Mapping back, a name that has no logical name drops the entity that holds it (the entry of its
array): a response shows nothing of what is not the tenant's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Final, Protocol, TypeAlias

from kanal.protocol.entities import has_field
from kanal.tenancy import regex as regexes
from kanal.tenancy.names import VirtualNames


class Kind(Enum):
    """The kinds of names a virtual cluster scopes."""

    TOPIC = "topic"
    GROUP = "group"
    TRANSACTIONAL_ID = "transactional id"


@dataclass(frozen=True, slots=True)
class Many:
    """A tuple of names (or null)."""

    kind: Kind


@dataclass(frozen=True, slots=True)
class ByField:
    """A name, or tuple of names, whose kind another field of the same entity gives (a config
    resource's type, a coordinator key's type); values of that field not in ``kinds`` mean the
    value is no name and stays as it is. ``missing`` is the kind when a version lacks the field."""

    field: str
    kinds: Mapping[int, Kind]
    missing: Kind | None = None


class Regex:
    """A regular expression over topic or transactional id names (see :mod:`kanal.tenancy.regex`)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Each:
    """A tuple of entities (or null), each described by ``fields``."""

    fields: Spec


@dataclass(frozen=True, slots=True)
class One:
    """One nested entity (or null), described by ``fields``. When its own name has no mapping it
    becomes null, so only optional entities may hold names of their own."""

    fields: Spec


Rule: TypeAlias = "Kind | Many | ByField | Regex | Each | One"
Spec: TypeAlias = Mapping[str, Rule]

REGEX: Final = Regex()


def each(**fields: Rule) -> Each:
    return Each(fields)


def one(**fields: Rule) -> One:
    return One(fields)


class Namer(Protocol):
    """One direction of the mapping: a name to its counterpart, or None when it has none."""

    def name(self, kind: Kind, value: str) -> str | None: ...

    def regex(self, value: str) -> str | None: ...


class ToPhysical:
    """Logical to physical: every name has a physical name.

    ``regex`` raises :class:`kanal.tenancy.regex.InvalidRegex` for a regex that does not parse.
    """

    __slots__ = ("aliased", "names")

    def __init__(self, names: VirtualNames) -> None:
        self.names = names
        #: The aliases the request named: physical -> the alias (its response names them so).
        self.aliased: dict[str, str] = {}

    def name(self, kind: Kind, value: str) -> str | None:
        if kind is Kind.TOPIC:
            physical = self.names.topic(value)
            if value in self.names.aliases:
                self.aliased[physical] = value
            return physical
        if kind is Kind.GROUP:
            return self.names.group(value)
        return self.names.transactional_id(value)

    def regex(self, value: str) -> str | None:
        if not self.names.prefix:  # the passthrough cluster's names: only aliases change
            return value
        return regexes.to_physical(value, self.names.prefix)


class ToLogical:
    """Physical to logical: names of others have none."""

    __slots__ = ("aliased", "names")

    def __init__(self, names: VirtualNames, aliased: Mapping[str, str] | None = None) -> None:
        self.names = names
        self.aliased = aliased or {}

    def name(self, kind: Kind, value: str) -> str | None:
        if kind is Kind.TOPIC:
            alias = self.aliased.get(value)
            return alias if alias is not None else self.names.logical_topic(value)
        if kind is Kind.GROUP:
            return self.names.logical_group(value)
        return self.names.logical_transactional_id(value)

    def regex(self, value: str) -> str | None:
        if not self.names.prefix:
            return value
        return regexes.to_logical(value, self.names.prefix)


class _Drop:
    __slots__ = ()


#: What :func:`walk` answers for an entity whose own name has no mapping.
DROP: Final = _Drop()


def walk(entity: Any, spec: Spec, namer: Namer) -> Any:
    """``entity`` with the names ``spec`` locates mapped by ``namer`` (the same object when none
    changed), or :data:`DROP` when one of its own names has no mapping."""
    cls = type(entity)
    changes: dict[str, Any] | None = None
    for field, rule in spec.items():
        if not has_field(cls, field):
            continue
        value = getattr(entity, field)
        if value is None:
            continue
        new = _apply(rule, value, entity, namer)
        if new is DROP:
            return DROP
        if new is not value:
            if changes is None:
                changes = {}
            changes[field] = new
    return entity if changes is None else replace(entity, **changes)


def _apply(rule: Rule, value: Any, entity: Any, namer: Namer) -> Any:
    if isinstance(rule, Each):
        return _each(value, rule.fields, namer)
    if isinstance(rule, Kind):
        return _name(rule, value, namer)
    if isinstance(rule, Many):
        return _many(rule.kind, value, namer)
    if isinstance(rule, ByField):
        kind = _kind_of(rule, entity)
        if kind is None:
            return value
        return _many(kind, value, namer) if isinstance(value, tuple) else _name(kind, value, namer)
    if isinstance(rule, One):
        new = walk(value, rule.fields, namer)
        return None if new is DROP else new
    return namer.regex(value)  # None when it cannot be mapped back: the field is cleared


def _kind_of(rule: ByField, entity: Any) -> Kind | None:
    if not has_field(type(entity), rule.field):
        return rule.missing
    return rule.kinds.get(int(getattr(entity, rule.field)))


def _name(kind: Kind, value: str, namer: Namer) -> Any:
    mapped = namer.name(kind, value)
    return DROP if mapped is None else mapped


def _many(kind: Kind, values: tuple[str, ...], namer: Namer) -> tuple[str, ...]:
    mapped = [namer.name(kind, v) for v in values]
    return tuple(m for m in mapped if m is not None)


def _each(items: tuple[Any, ...], spec: Spec, namer: Namer) -> tuple[Any, ...]:
    out: list[Any] = []
    changed = False
    for item in items:
        new = walk(item, spec, namer)
        if new is not item:
            changed = True
            if new is DROP:
                continue
        out.append(new)
    return tuple(out) if changed else items
