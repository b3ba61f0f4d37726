"""The active topic views of a gateway: compiled statements, ids, and lookups by name, id and input topic.

A :class:`View` is one ``TopicView`` resource made ready for the data path: its SQL compiled once,
its own topic id, and the record transformer the fetch path runs. :class:`Views` is the immutable set
the interceptor serves; a change of resources builds a new set (no locks on the data path).

Topic ids. A view has a topic id of its own, distinct from its input topic's: ``uuid5`` of a fixed
namespace, the gateway cluster id (``GATEWAY_CLUSTER_ID``) and the view name. Every node of a fleet
(same cluster id) and every restart gives a view the same id; a view deleted and created again under
the same name keeps it. Like Kafka's own ids it is never the zero id, never the metadata topic's id
(``AAAAAAAAAAAAAAAAAAAAAQ``) and its base64 text never starts with ``-``.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from .sql import CompiledView, ViewSqlError, compile_view
from .transform import Transformer

__all__ = ["ON_ERROR", "OnError", "View", "ViewConfigError", "Views", "compiled", "view_topic_id"]

OnError = Literal["DROP", "FAIL_FETCH"]
ON_ERROR: Final[tuple[OnError, ...]] = ("DROP", "FAIL_FETCH")

#: The namespace of view topic ids (a fixed, random uuid: changing it would change every view's id).
_NAMESPACE: Final = uuid.UUID("5f0c8a52-6a61-4c2e-9d3b-0b1f6f1d7a11")
_RESERVED: Final = frozenset({uuid.UUID(int=0), uuid.UUID(int=1)})


class ViewConfigError(ValueError):
    """A view definition that cannot be served (bad SQL, unknown connection...); the message says why."""


def view_topic_id(cluster_id: str, name: str) -> uuid.UUID:
    """The topic id of view ``name`` in gateway cluster ``cluster_id`` (stable, see the module doc)."""
    salt = 0
    while True:
        candidate = uuid.uuid5(_NAMESPACE, f"{cluster_id}\x00{name}" + (f"\x00{salt}" if salt else ""))
        text = base64.urlsafe_b64encode(candidate.bytes).decode()
        if candidate not in _RESERVED and not text.startswith("-"):
            return candidate
        salt += 1


_COMPILED: dict[str, CompiledView] = {}
_COMPILED_MAX = 1024


def compiled(statement: str) -> CompiledView:
    """``compile_view`` with a cache: every node compiles each statement once, however often the set of
    views is rebuilt. Raises ``ViewSqlError``."""
    view = _COMPILED.get(statement)
    if view is None:
        view = compile_view(statement)
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.clear()
        _COMPILED[statement] = view
    return view


@dataclass(frozen=True, eq=False)
class View:
    """One served view."""

    name: str
    topic_id: uuid.UUID
    statement: str
    on_error: OnError
    sql: CompiledView
    transformer: Transformer
    schema_registry: str | None = None

    @property
    def physical(self) -> str:
        """The input topic (the ``FROM`` of the statement)."""
        return self.sql.topic

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any], cluster_id: str, decoders: Any = None) -> View:
        """A view from a canonical ``TopicView`` manifest (see :mod:`kanal_topicviews.resource`).

        ``decoders`` (a :class:`~kanal_topicviews.connections.ValueDecoders`) resolves
        ``schemaRegistryConnectionName``; without it such a view is refused."""
        name = str(manifest["metadata"]["name"])
        spec = manifest["spec"]
        statement = str(spec["transformation"]["statement"])
        on_error: OnError = spec["onError"]["type"]
        try:
            sql = compiled(statement)
        except ViewSqlError as exc:
            raise ViewConfigError(f"spec.transformation.statement: {exc}") from exc
        connection = spec.get("schemaRegistryConnectionName")
        decode = None
        if connection is not None:
            if decoders is None:
                raise ViewConfigError(f"spec.schemaRegistryConnectionName: no external connection {connection!r}")
            try:
                decode = decoders.decoder(str(connection))
            except ValueError as exc:
                raise ViewConfigError(f"spec.schemaRegistryConnectionName: {exc}") from exc
        transformer = Transformer(sql, on_error == "DROP", decode)
        return cls(name, view_topic_id(cluster_id, name), statement, on_error, sql, transformer, connection)


@dataclass(frozen=True)
class Views:
    """The views a gateway serves, indexed for the data path."""

    by_name: Mapping[str, View] = field(default_factory=dict)
    by_id: Mapping[uuid.UUID, View] = field(default_factory=dict)
    #: input topic -> the views reading it
    by_physical: Mapping[str, tuple[View, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, views: Iterable[View]) -> Views:
        by_name = {v.name: v for v in views}
        by_physical: dict[str, list[View]] = {}
        for v in by_name.values():
            by_physical.setdefault(v.physical, []).append(v)
        return cls(
            by_name,
            {v.topic_id: v for v in by_name.values()},
            {k: tuple(vs) for k, vs in by_physical.items()},
        )

    def __bool__(self) -> bool:
        return bool(self.by_name)

    def __len__(self) -> int:
        return len(self.by_name)

    def get(self, key: object) -> View | None:
        """The view a topic name or topic id refers to, if any."""
        if isinstance(key, str):
            return self.by_name.get(key)
        if isinstance(key, uuid.UUID):
            return self.by_id.get(key)
        return None

    def group_view(self, group_id: str | None) -> View | None:
        """The view a consumer group belongs to by its name (``<view_name>::<suffix>``), if any."""
        if not group_id or "::" not in group_id:
            return None
        return self.by_name.get(group_id.split("::", 1)[0])
