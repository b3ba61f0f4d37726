"""Resource kinds: what the admin API, the CLI and the state topic know about each kind of manifest.

A resource is a Kubernetes-style manifest, ``{apiVersion, kind, metadata, spec}``. A
:class:`ResourceKind` says how to validate one (returning its canonical form), which metadata fields
identify it, and how to apply the whole set of stored resources of that kind to the running gateway.
The core registers the ``Interceptor`` kind; plugins add theirs through the ``kanal_admin_resources``
hook (see :mod:`kanal.api.hookspecs`), and get the same HTTP routes, persistence, CLI support,
OpenAPI entries and metrics without writing any of it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import orjson

API_VERSION = "gateway/v2"

Manifest = dict[str, Any]
Key = tuple[str | None, ...]
State = Literal["Pending", "Ready", "Failed"]
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


class ResourceError(Exception):
    """An admin API error: HTTP ``status`` and the JSON body ``{title, msg, cause}``."""

    def __init__(self, status: int, title: str, msg: str, cause: str | None = None) -> None:
        super().__init__(msg)
        self.status = status
        self.title = title
        self.msg = msg
        self.cause = cause

    def body(self) -> dict[str, Any]:
        return {"title": self.title, "msg": self.msg, "cause": self.cause}


def invalid(msg: str, cause: str | None = None) -> ResourceError:
    """A 400 error for a resource that does not validate."""
    return ResourceError(400, "Invalid resource", msg, cause)


@dataclass(frozen=True, slots=True)
class Status:
    """What a node reports about one resource: Pending (stored, not applied yet), Ready or Failed."""

    state: State
    message: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.state}
        if self.message:
            out["message"] = self.message
        return out


READY = Status("Ready")
PENDING = Status("Pending")


class StateView(Protocol):
    """Read access to the stored resources of every kind (given to validate and apply)."""

    def resources(self, kind: str) -> list[Manifest]: ...


Validate = Callable[[Manifest, StateView], Manifest]
Apply = Callable[[Sequence[Manifest], StateView], Mapping[Key, Status] | None]


def _no_apply(resources: Sequence[Manifest], state: StateView) -> None:
    return None


@dataclass(frozen=True)
class ResourceKind:
    """One kind of resource.

    - ``kind``: the manifest's ``kind`` (``TopicView``); ``path``: the URL segment
      (``/gateway/v2/topic-view``).
    - ``validate(manifest, state)``: returns the canonical manifest (defaults filled in, unknown
      fields refused) or raises :class:`ResourceError` (use :func:`invalid`). It runs before anything
      is stored: a resource that fails here is never written.
    - ``apply(resources, state)``: called on every gateway node with ALL stored resources of the kind
      whenever one of them changed (and once at startup); returns a :class:`Status` per key
      (:meth:`key_of`) for the resources that report one, or None. It runs in the gateway's trio
      thread and must not block: configure in-memory structures, start work elsewhere if needed.
    - ``key_fields``: metadata fields that, with ``name``, identify a resource (dotted paths such as
      ``scope.vCluster``); DELETE takes them as its JSON body.
    - ``columns``: (header, dotted path) pairs for ``kanal get``'s table.
    - ``spec_schema``: a JSON schema of ``spec``, published in the OpenAPI document.
    - ``has_status``: whether resources of this kind report a status (Pending/Ready/Failed).
    - ``static``: resources of the kind that are not stored but configured otherwise (the config
      file); listed read-only next to the stored ones.
    - ``list_filters``: query parameter -> dotted path, for filtering list calls (``name`` and
      ``global`` always work).
    """

    kind: str
    path: str
    validate: Validate
    apply: Apply = _no_apply
    description: str = ""
    api_versions: tuple[str, ...] = (API_VERSION,)
    key_fields: tuple[str, ...] = ()
    columns: tuple[tuple[str, str], ...] = (("NAME", "metadata.name"),)
    aliases: tuple[str, ...] = ()
    spec_schema: Mapping[str, Any] | None = None
    has_status: bool = True
    plugin: str = "core"
    list_filters: Mapping[str, str] = field(default_factory=dict)
    static: Callable[[], Sequence[Manifest]] | None = None

    def key_of(self, metadata: Mapping[str, Any]) -> Key:
        """The identity of a resource from its metadata: name, then the key fields (None when absent)."""
        name = metadata.get("name")
        return (None if name is None else str(name), *(_opt_str(lookup(metadata, p)) for p in self.key_fields))

    def storage_key(self, key: Key) -> bytes:
        """The record key in the state topic."""
        return orjson.dumps([self.kind, *key])

    def delete_metadata(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """The metadata identifying a resource from a DELETE's path name and JSON body.

        The body may hold the key fields as they appear in metadata (``{"scope": {"vCluster": "a"}}``)
        or, for a key under one metadata object, flattened (``{"vCluster": "a"}``).
        """
        metadata: dict[str, Any] = {"name": name}
        for path in self.key_fields:
            value = lookup(body, path)
            if value is None and "." in path:
                value = body.get(path.rsplit(".", 1)[1])
            if value is not None:
                _assign(metadata, path, value)
        return metadata


def _opt_str(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def lookup(data: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path, or None."""
    current: Any = data
    for part in path.split("."):
        if not isinstance(current, Mapping):
            return None
        current = current.get(part)
    return current


def _assign(data: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    for part in parts[:-1]:
        data = data.setdefault(part, {})
    data[parts[-1]] = value


def check_envelope(manifest: Any, kind: ResourceKind) -> tuple[dict[str, Any], dict[str, Any]]:
    """Checks apiVersion, kind, metadata.name and returns (metadata, spec) as dicts."""
    if not isinstance(manifest, Mapping):
        raise invalid("the body must be a JSON object: {apiVersion, kind, metadata, spec}")
    unknown = set(manifest) - {"apiVersion", "kind", "metadata", "spec", "status"}
    if unknown:
        raise invalid(f"unknown top-level field {sorted(unknown)[0]!r} (expected apiVersion, kind, metadata, spec)")
    if manifest.get("kind", kind.kind) != kind.kind:
        raise invalid(f"kind must be {kind.kind}, got {manifest.get('kind')!r}")
    version = manifest.get("apiVersion", kind.api_versions[0])
    if version not in kind.api_versions:
        raise invalid(f"apiVersion must be {' or '.join(kind.api_versions)}, got {version!r}")
    metadata = manifest.get("metadata")
    if not isinstance(metadata, Mapping):
        raise invalid("metadata is required, an object with at least a name")
    name = metadata.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise invalid("metadata.name is required: 1 to 249 letters, digits, '.', '_' or '-'")
    spec = manifest.get("spec", {})
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise invalid("spec must be an object")
    return dict(metadata), dict(spec)


def envelope(kind: ResourceKind, metadata: Mapping[str, Any], spec: Mapping[str, Any]) -> Manifest:
    """A canonical manifest."""
    return {"apiVersion": kind.api_versions[0], "kind": kind.kind, "metadata": dict(metadata), "spec": dict(spec)}


class KindRegistry:
    """The resource kinds of one gateway, by kind name and by URL path."""

    def __init__(self) -> None:
        self._by_kind: dict[str, ResourceKind] = {}
        self._by_path: dict[str, ResourceKind] = {}

    def add(self, kind: ResourceKind) -> None:
        if not re.match(r"^[a-z][a-z0-9-]*$", kind.path):
            raise ValueError(f"resource kind {kind.kind}: path {kind.path!r} must be lower-case words joined by '-'")
        if kind.kind in self._by_kind or kind.path in self._by_path:
            raise ValueError(f"resource kind {kind.kind} ({kind.path}) is registered twice")
        self._by_kind[kind.kind] = kind
        self._by_path[kind.path] = kind

    def get(self, kind: str) -> ResourceKind | None:
        return self._by_kind.get(kind)

    def by_path(self, path: str) -> ResourceKind | None:
        return self._by_path.get(path)

    def __iter__(self) -> Any:
        return iter(list(self._by_kind.values()))

    def __len__(self) -> int:
        return len(self._by_kind)

    def describe(self) -> list[dict[str, Any]]:
        """What the CLI needs to know about each kind."""
        return [
            {
                "kind": k.kind,
                "path": k.path,
                "apiVersions": list(k.api_versions),
                "description": k.description,
                "keyFields": list(k.key_fields),
                "columns": [list(c) for c in k.columns],
                "aliases": list(k.aliases),
                "hasStatus": k.has_status,
                "plugin": k.plugin,
            }
            for k in self
        ]
