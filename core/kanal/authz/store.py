"""The ACLs the gateway enforces, stored in a compacted topic of their own and followed by every node.

ACLs created with the Kafka Admin API (CreateAcls) are records of an internal resource kind,
``KafkaAcl``, written through the same store as the admin API's resources (read-your-writes, every
node applies every change in the same order, a restart reads them back), but in their own topic
(``GATEWAY_ACLS_TOPIC``) and never shown by the admin API. A record's key is the whole ACL and the
virtual cluster it belongs to, so creating an ACL twice stores it once, as Kafka does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from kanal.api.resources import Key, Manifest, ResourceKind, StateView, Status, invalid
from kanal.authz.acl import AclBinding, AclFilter, Acls, Authorizer
from kanal.protocol.acl_codes import Operation, PatternType, Permission, ResourceType

__all__ = ["ACL_KIND", "AclDirectory", "AclWrites"]

ACL_KIND = "KafkaAcl"
_FIELDS = ("resourceType", "resourceName", "patternType", "principal", "host", "operation", "permission")


class AclWrites(Protocol):
    """Where ACL changes are written (the gateway's resource store on the ACL topic)."""

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
    spec = dict(
        zip(
            _FIELDS,
            (
                acl.resource_type.name,
                acl.resource_name,
                acl.pattern_type.name,
                acl.principal,
                acl.host,
                acl.operation.name,
                acl.permission.name,
            ),
            strict=True,
        )
    )
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


class AclDirectory:
    """The ACLs of the passthrough cluster and of each virtual cluster, as this node has read them,
    with the super users who bypass them."""

    def __init__(self, super_users: Iterable[str] = ()) -> None:
        self.super_users = tuple(super_users)
        self.writes: AclWrites | None = None  # set by the gateway once its ACL store exists
        self._acls: dict[str | None, Acls] = {}
        self._authorizers: dict[str | None, Authorizer] = {}
        self.version = 0  # moves on every change, so enforcers drop what they remember
        self.kind = ResourceKind(
            ACL_KIND,
            "kafka-acl",
            self._validate,
            self._apply,
            description="An ACL created with the Kafka Admin API (internal: stored in GATEWAY_ACLS_TOPIC).",
            key_fields=("vCluster",),
            has_status=False,
        )

    def acls(self, vcluster: str | None = None) -> Acls:
        return self._acls.get(vcluster) or Acls()

    def authorizer(self, vcluster: str | None = None) -> Authorizer:
        """The authorizer of one cluster (None: the passthrough one); replaced on every change."""
        authorizer = self._authorizers.get(vcluster)
        if authorizer is None:
            authorizer = self._authorizers[vcluster] = Authorizer(self.acls(vcluster), self.super_users)
        return authorizer

    async def create(self, bindings: Sequence[AclBinding], vcluster: str | None = None) -> None:
        """Stores ACLs (an existing one is left as it is); returns once this node applies them."""
        writes = self._writes()
        for acl in bindings:
            await writes.put(self.kind, _manifest(acl, vcluster))

    async def delete(self, filters: Sequence[AclFilter], vcluster: str | None = None) -> list[list[AclBinding]]:
        """Deletes the ACLs each filter matches; returns them per filter (one ACL may match several)."""
        writes = self._writes()
        acls = self.acls(vcluster)
        matched = [acls.matching(selector) for selector in filters]
        for acl in dict.fromkeys(acl for found in matched for acl in found):
            await writes.delete(self.kind, (_name(acl), vcluster))
        return matched

    def _writes(self) -> AclWrites:
        if self.writes is None:
            raise RuntimeError("the ACL store is not running")
        return self.writes

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
        self.version += 1
        return None
