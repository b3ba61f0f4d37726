"""The ACLs the gateway enforces, stored in a compacted topic of their own and followed by every node.

ACLs created with the Kafka Admin API (CreateAcls) are records of an internal resource kind,
``KafkaAcl``, written through the same store as the admin API's resources (read-your-writes, every
node applies every change in the same order, a restart reads them back), but in their own topic
(``GATEWAY_ACLS_TOPIC``) and never shown by the admin API. A record's key is the whole ACL and the
virtual cluster it belongs to, so creating an ACL twice stores it once, as Kafka does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import trio

from kanal.api.resources import Key, Manifest, ResourceError, ResourceKind, StateView, Status, invalid
from kanal.authz.acl import AclBinding, AclFilter, Acls, Authorizer
from kanal.protocol.acl_codes import Operation, PatternType, Permission, ResourceType

__all__ = ["ACL_KIND", "AclDirectory", "AclStoreUnavailable", "AclWrites", "acl_from_json"]

ACL_KIND = "KafkaAcl"
_LOAD_WAIT = 10.0  # seconds a change waits for the ACL topic to be read


class AclStoreUnavailable(Exception):
    """The ACL topic cannot be written now (not read yet, or the cluster does not answer)."""


class AclWrites(Protocol):
    """Where ACL changes are written (the gateway's resource store on the ACL topic)."""

    loaded: trio.Event

    async def put(self, kind: ResourceKind, manifest: Any, *, dry_run: bool = False) -> Any: ...

    async def delete(self, kind: ResourceKind, key: Key, *, dry_run: bool = False) -> Any: ...


def _name(acl: AclBinding) -> str:
    return "|".join(
        (
            acl.resource_type.name,
            acl.pattern_type.name,
            acl.resource_name,
            acl.principal,
            acl.host,
            acl.operation.name,
            acl.permission.name,
        )
    )


def _manifest(acl: AclBinding, vcluster: str | None) -> Manifest:
    metadata: dict[str, Any] = {"name": _name(acl)}
    if vcluster is not None:
        metadata["vCluster"] = vcluster
    spec = {
        "resourceType": acl.resource_type.name,
        "resourceName": acl.resource_name,
        "patternType": acl.pattern_type.name,
        "principal": acl.principal,
        "host": acl.host,
        "operation": acl.operation.name,
        "permission": acl.permission.name,
    }
    return {"apiVersion": "gateway/v2", "kind": ACL_KIND, "metadata": metadata, "spec": spec}


def _binding(manifest: Mapping[str, Any]) -> AclBinding:
    spec = manifest["spec"]
    return AclBinding(
        ResourceType[spec["resourceType"]],
        str(spec["resourceName"]),
        PatternType[spec["patternType"]],
        str(spec["principal"]),
        str(spec["host"]),
        Operation[spec["operation"]],
        Permission[spec["permission"]],
    )


def acl_from_json(entry: Any) -> AclBinding:
    """An ACL as a VirtualCluster's ``spec.acls`` lists it (Kafka's AclBinding, in JSON)::

        {resourcePattern: {resourceType: TOPIC, name: orders-, patternType: PREFIXED},
         principal: User:orders-app, host: "*", operation: READ, permissionType: ALLOW}

    ``host`` defaults to ``*``, ``patternType`` to LITERAL, ``permissionType`` to ALLOW. Raises
    ValueError saying what is wrong."""
    if not isinstance(entry, Mapping):
        raise ValueError("an ACL must be an object {resourcePattern, principal, host, operation, permissionType}")
    unknown = set(entry) - {"resourcePattern", "principal", "host", "operation", "permissionType"}
    if unknown:
        raise ValueError(f"unknown ACL field {sorted(unknown)[0]!r}")
    pattern = entry.get("resourcePattern")
    if not isinstance(pattern, Mapping):
        raise ValueError("resourcePattern is required: {resourceType, name, patternType}")
    unknown = set(pattern) - {"resourceType", "name", "patternType"}
    if unknown:
        raise ValueError(f"unknown resourcePattern field {sorted(unknown)[0]!r}")

    def member(enum: Any, value: Any, field: str) -> Any:
        try:
            return enum[str(value).upper()]
        except KeyError:
            raise ValueError(f"{field}: {value!r} is not one of {', '.join(enum.__members__)}") from None

    acl = AclBinding(
        member(ResourceType, pattern.get("resourceType"), "resourcePattern.resourceType"),
        str(pattern.get("name") or ""),
        member(PatternType, pattern.get("patternType", "LITERAL"), "resourcePattern.patternType"),
        str(entry.get("principal") or ""),
        str(entry.get("host", "*")),
        member(Operation, entry.get("operation"), "operation"),
        member(Permission, entry.get("permissionType", "ALLOW"), "permissionType"),
    )
    problem = acl.problem()
    if problem is not None:
        raise ValueError(problem)
    return acl


class AclDirectory:
    """The ACLs of the passthrough cluster and of each virtual cluster, as this node has read them,
    with the super users who bypass them.

    A cluster's ACLs are those created with the Kafka Admin API (stored), unless its VirtualCluster
    declares them (``aclMode: REST_API``, :meth:`declare`): then those, and the Admin API only reads."""

    def __init__(self, super_users: Iterable[str] = (), on_change: Callable[[], None] = lambda: None) -> None:
        self.super_users = tuple(super_users)
        #: Called whenever the ACLs or super users change (decisions the gateway remembers are stale).
        self.on_change = on_change
        self.writes: AclWrites | None = None  # set by the gateway once its ACL store exists
        self._acls: dict[str | None, Acls] = {}  # stored
        self._declared: dict[str, Acls] = {}
        self._super_users: dict[str, tuple[str, ...]] = {}
        self._authorizers: dict[str | None, Authorizer] = {}
        self.kind = ResourceKind(
            ACL_KIND,
            "kafka-acl",
            self._validate,
            self._apply,
            description="An ACL created with the Kafka Admin API (internal: stored in GATEWAY_ACLS_TOPIC).",
            key_fields=("vCluster",),
            has_status=False,
        )

    def configure(self, super_users: Mapping[str, Sequence[str]], declared: Mapping[str, Sequence[AclBinding]]) -> None:
        """The virtual clusters' super users, and the ACLs of those that declare theirs (REST_API)."""
        self._super_users = {vcluster: tuple(users) for vcluster, users in super_users.items()}
        self._declared = {vcluster: Acls(acls) for vcluster, acls in declared.items()}
        self._authorizers = {}
        self.on_change()

    def declares(self, vcluster: str | None) -> bool:
        """Whether the cluster's ACLs are declared in its resource (the Admin API may only read them)."""
        return vcluster in self._declared

    def acls(self, vcluster: str | None = None) -> Acls:
        if vcluster is not None and vcluster in self._declared:
            return self._declared[vcluster]
        return self._acls.get(vcluster) or Acls()

    def authorizer(self, vcluster: str | None = None) -> Authorizer:
        """The authorizer of one cluster (None: the passthrough one); replaced on every change."""
        authorizer = self._authorizers.get(vcluster)
        if authorizer is None:
            super_users = self.super_users if vcluster is None else self._super_users.get(vcluster, ())
            authorizer = self._authorizers[vcluster] = Authorizer(self.acls(vcluster), super_users)
        return authorizer

    async def create(self, bindings: Sequence[AclBinding], vcluster: str | None = None) -> None:
        """Stores ACLs (an existing one is left as it is); returns once this node applies them.
        Raises AclStoreUnavailable."""
        writes = await self._writes()
        try:
            for acl in bindings:
                await writes.put(self.kind, _manifest(acl, vcluster))
        except ResourceError as exc:
            raise AclStoreUnavailable(exc.msg) from exc

    async def delete(self, filters: Sequence[AclFilter], vcluster: str | None = None) -> list[list[AclBinding]]:
        """Deletes the ACLs each filter matches; returns them per filter (one ACL may match several).
        Raises AclStoreUnavailable."""
        writes = await self._writes()
        acls = self.acls(vcluster)
        matched = [acls.matching(selector) for selector in filters]
        try:
            for acl in dict.fromkeys(acl for found in matched for acl in found):
                await writes.delete(self.kind, (_name(acl), vcluster))
        except ResourceError as exc:
            raise AclStoreUnavailable(exc.msg) from exc
        return matched

    async def _writes(self) -> AclWrites:
        """The store, once it has read the topic (its follower may have just started)."""
        writes = self.writes
        if writes is None:
            raise AclStoreUnavailable("the ACL store is not running")
        with trio.move_on_after(_LOAD_WAIT):
            await writes.loaded.wait()
        if not writes.loaded.is_set():
            raise AclStoreUnavailable(f"the ACL topic was not read within {_LOAD_WAIT:g} s; retry shortly")
        return writes

    def _validate(self, manifest: Manifest, state: StateView) -> Manifest:
        try:
            problem = _binding(manifest).problem()
        except (KeyError, TypeError) as exc:
            raise invalid(f"not an ACL: {exc}") from exc
        if problem is not None:
            raise invalid(problem)
        return manifest

    def _apply(self, resources: Sequence[Manifest], state: StateView) -> Mapping[Key, Status] | None:
        by_cluster: dict[str | None, list[AclBinding]] = {}
        for manifest in resources:
            by_cluster.setdefault(manifest["metadata"].get("vCluster"), []).append(_binding(manifest))
        self._acls = {vcluster: Acls(bindings) for vcluster, bindings in by_cluster.items()}
        self._authorizers = {}
        self.on_change()
        return None
