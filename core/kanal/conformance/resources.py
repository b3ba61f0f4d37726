"""The gateway resources a case declares (``resources:``), applied to the replay's gateway as the
admin API applies them.

A replay's gateway has no admin API and no state topic: the scripted broker answers the captured
connections only. Yet what a case shows can depend on resources a gateway normally gets from the
admin API: the service account a token login needs, the virtual cluster a client is in. A case lists
them as admin-API manifests, exactly as ``kanal apply -f`` takes them::

    resources:
      - apiVersion: gateway/v2
        kind: VirtualCluster
        metadata: {name: team-a.}
      - apiVersion: gateway/v2
        kind: GatewayServiceAccount
        metadata: {name: orders-app, vCluster: team-a.}
        spec: {type: LOCAL}

Before the replay, each is stored in order in a :class:`~kanal.admin.store.ResourceStore` over an
in-process log (:class:`~kanal.admin.store.MemoryLog`), with the gateway's own resource kinds
(:func:`~kanal.admin.service.collect_kinds`, the core's and the plugins'). That is the admin API's
``PUT`` without HTTP: the same validation (a manifest is checked against those stored before it, as a
second ``kanal apply`` would be) and the same ``apply`` of each kind to the gateway. A manifest that
does not validate, or that its kind reports as Failed once applied, is a :class:`ManifestError`
naming it (``resources[1] (GatewayServiceAccount 'orders-app', vCluster 'team-a.')``) and the admin
API's message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import trio

from kanal.admin.host import GatewayHost
from kanal.admin.service import collect_kinds
from kanal.admin.store import MemoryLog, ResourceStore
from kanal.api.resources import Key, KindRegistry, Manifest, ResourceError, ResourceKind

__all__ = ["ManifestError", "apply_resources", "check_manifests", "describe_manifest"]


class ManifestError(ValueError):
    """A manifest of ``resources:`` that the gateway refuses (or its kind does not know)."""


def describe_manifest(at: int, manifest: Mapping[str, Any]) -> str:
    """``resources[AT] (KIND 'NAME', vCluster 'V')``: which manifest a message is about."""
    kind = manifest.get("kind")
    metadata = manifest.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    parts = ["no kind" if kind is None or kind == "" else str(kind)]
    if metadata.get("name") is not None:
        parts.append(repr(metadata["name"]))
    scope = metadata.get("vCluster") or (metadata.get("scope") or {}).get("vCluster")
    where = f", vCluster {scope!r}" if isinstance(scope, str) and scope else ""
    return f"resources[{at}] ({' '.join(parts)}{where})"


def check_manifests(value: Any) -> list[Manifest]:
    """The ``resources:`` of a case file: a list of manifests, each naming its ``kind`` (what the kind
    itself checks waits for the replay, which knows the gateway's kinds and settings)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ManifestError("resources must be a list of admin-API manifests ({apiVersion, kind, metadata, spec})")
    manifests: list[Manifest] = []
    for at, manifest in enumerate(value):
        if not isinstance(manifest, dict):
            raise ManifestError(f"resources[{at}] must be a manifest (a mapping), got {type(manifest).__name__}")
        kind = manifest.get("kind")
        if kind is None or kind == "":
            raise ManifestError(f"{describe_manifest(at, manifest)}: kind is required (VirtualCluster, ...)")
        if not isinstance(kind, str):
            raise ManifestError(f"{describe_manifest(at, manifest)}: kind must be a kind's name, got {kind!r}")
        manifests.append(manifest)
    return manifests


async def apply_resources(gateway: GatewayHost, manifests: Sequence[Manifest]) -> None:
    """Stores and applies ``manifests`` in order, as ``PUT`` calls of the admin API would (see the
    module docstring); ManifestError for the first one refused. The store's follower stops once
    they are applied: the resources stay applied to the gateway."""
    if not manifests:
        return
    kinds = collect_kinds(gateway)
    store = ResourceStore(kinds, MemoryLog())
    problem: str | None = None
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        problem = await _put_all(store, kinds, manifests)
        nursery.cancel_scope.cancel()
    if problem is not None:
        raise ManifestError(problem)


async def _put_all(store: ResourceStore, kinds: KindRegistry, manifests: Sequence[Manifest]) -> str | None:
    """Puts every manifest; the problem with the first one refused, or one that failed to apply."""
    stored: list[tuple[int, ResourceKind, Key]] = []
    for at, manifest in enumerate(manifests):
        kind = kinds.get(manifest["kind"])
        if kind is None:
            known = ", ".join(sorted(k.kind for k in kinds))
            return f"{describe_manifest(at, manifest)}: unknown kind (this gateway knows {known})"
        try:
            change = await store.put(kind, manifest)
        except ResourceError as exc:
            return f"{describe_manifest(at, manifest)}: {exc.msg} ({exc.status} {exc.title})"
        stored.append((at, kind, change.key))
    for at, kind, key in stored:  # (a later resource of a kind may make an earlier one fail)
        status = store.status(kind, key)
        if status is not None and status.state == "Failed":
            return f"{describe_manifest(at, manifests[at])}: failed to apply: {status.message}"
    return None
