"""The ``VirtualCluster`` resource kind: a tenant's namespace on the physical cluster.

A VirtualCluster manifest::

    apiVersion: gateway/v2
    kind: VirtualCluster
    metadata:
      name: team-a.               # the physical prefix of the tenant's topics, groups, transactional ids
    spec:
      aclEnabled: false           # whether the gateway enforces the tenant's ACLs
      aclMode: KAFKA_API          # KAFKA_API: super users manage them with the Kafka Admin API;
                                  # REST_API: spec.acls is the whole list (cannot change once set)
      superUsers: [team-a-admin]  # KAFKA_API only
      acls: [...]                 # REST_API only: {resourcePattern, principal, host, operation, permissionType}
      type: Standard              # or Partner
      # read-only, filled in by the gateway:
      bootstrapServers: gateway:6969
      clientProperties: {security.protocol: SASL_PLAINTEXT, ...}

Clients are in a virtual cluster when their service account is (``metadata.vCluster``). Applying the
stored set replaces the gateway's :class:`~kanal.tenancy.clusters.VirtualClusters` (which the gateway
follows: the virtual clusters' ACLs and chains).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kanal.api.resources import Manifest, ResourceError, ResourceKind, StateView, check_envelope, envelope, invalid
from kanal.authz.store import acl_from_json
from kanal.tenancy.clusters import KAFKA_API, REST_API, VirtualCluster
from kanal.tenancy.names import VirtualNames

if TYPE_CHECKING:
    from kanal.admin.host import GatewayHost

__all__ = ["KIND", "refuse_without_authentication", "virtual_cluster_kind"]

KIND = "VirtualCluster"
_READ_ONLY = ("bootstrapServers", "clientProperties")
_TYPES = ("Standard", "Partner")

SPEC_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "aclEnabled": {"type": "boolean", "default": False},
        "aclMode": {"type": "string", "enum": [KAFKA_API, REST_API], "default": KAFKA_API},
        "superUsers": {"type": "array", "items": {"type": "string", "minLength": 1}},
        "acls": {"type": "array", "items": {"type": "object"}},
        "type": {"type": "string", "enum": list(_TYPES), "default": "Standard"},
        "bootstrapServers": {"type": "string", "readOnly": True},
        "clientProperties": {"type": "object", "readOnly": True},
    },
}


def _client_properties(gateway: GatewayHost) -> tuple[str, dict[str, str]]:
    """What a client of the virtual cluster sets: the gateway's bootstrap and its listener's security."""
    settings = gateway.settings
    host = getattr(gateway, "advertised_host", None) or settings.advertised_host or "localhost"
    bootstrap = f"{host}:{settings.port_start}"
    protocol = settings.security_protocol.upper()
    properties = {"bootstrap.servers": bootstrap, "security.protocol": protocol}
    if protocol.startswith("SASL_"):
        properties["sasl.mechanism"] = "PLAIN"
        properties["sasl.jaas.config"] = (
            'org.apache.kafka.common.security.plain.PlainLoginModule required username="<service account>"'
            ' password="<its token: POST /gateway/v2/token>";'
        )
    return bootstrap, properties


def _canonical(manifest: Any, kind: ResourceKind, gateway: GatewayHost) -> Manifest:
    metadata, spec = check_envelope(manifest, kind)
    unknown = set(metadata) - {"name", "labels", "annotations"}
    if unknown:
        raise invalid(f"unknown metadata field {sorted(unknown)[0]!r} (expected name)")
    name = metadata["name"]
    try:
        VirtualNames(name)
    except ValueError as exc:
        raise invalid(f"metadata.name: {exc}") from exc
    unknown = set(spec) - {"aclEnabled", "aclMode", "superUsers", "acls", "type", *_READ_ONLY}
    if unknown:
        raise invalid(
            f"unknown spec field {sorted(unknown)[0]!r} (expected aclEnabled, aclMode, superUsers, acls, type)"
        )
    acl_enabled = spec.get("aclEnabled", False)
    if not isinstance(acl_enabled, bool):
        raise invalid(f"spec.aclEnabled must be true or false, got {acl_enabled!r}")
    mode = spec.get("aclMode", KAFKA_API)
    if mode not in (KAFKA_API, REST_API):
        raise invalid(f"spec.aclMode must be {KAFKA_API} or {REST_API}, got {mode!r}")
    super_users = spec.get("superUsers") or []
    if not isinstance(super_users, list) or not all(isinstance(u, str) and u.strip() for u in super_users):
        raise invalid("spec.superUsers must be a list of principals (User:alice or alice)")
    if super_users and mode != KAFKA_API:
        raise invalid("spec.superUsers is for aclMode KAFKA_API; with REST_API, spec.acls is the whole list")
    acls = spec.get("acls") or []
    if not isinstance(acls, list):
        raise invalid("spec.acls must be a list of ACLs")
    if acls and mode != REST_API:
        raise invalid("spec.acls is for aclMode REST_API; with KAFKA_API, super users create them with CreateAcls")
    for at, acl in enumerate(acls):
        try:
            acl_from_json(acl)
        except ValueError as exc:
            raise invalid(f"spec.acls[{at}]: {exc}") from exc
    cluster_type = spec.get("type", "Standard")
    if cluster_type not in _TYPES:
        raise invalid(f"spec.type must be Standard or Partner, got {cluster_type!r}")
    bootstrap, properties = _client_properties(gateway)
    out: dict[str, Any] = {"aclEnabled": acl_enabled, "aclMode": mode, "type": cluster_type}
    if super_users:
        out["superUsers"] = list(super_users)
    if acls:
        out["acls"] = list(acls)
    out["bootstrapServers"] = bootstrap
    out["clientProperties"] = properties
    return envelope(kind, {"name": name}, out)


def refuse_without_authentication(gateway: GatewayHost, what: str) -> None:
    """A 409 unless the gateway authenticates its clients itself: only then is a client in a
    virtual cluster (its service account's)."""
    settings = gateway.settings
    if settings.security_mode == "kafka_managed" or settings.security_protocol.upper() == "PLAINTEXT":
        raise ResourceError(
            409,
            "Conflict",
            f"{what} need clients the gateway authenticates: a SASL or SSL listener"
            " (GATEWAY_SECURITY_PROTOCOL) with GATEWAY_SECURITY_MODE=GATEWAY_MANAGED",
        )


def virtual_cluster_kind(gateway: GatewayHost) -> ResourceKind:
    """The VirtualCluster kind; applying it replaces the gateway's virtual clusters."""

    def validate(manifest: Any, state: StateView) -> Manifest:
        refuse_without_authentication(gateway, "virtual clusters")
        canonical = _canonical(manifest, kind, gateway)
        name = canonical["metadata"]["name"]
        for other in state.resources(KIND):
            other_name = other["metadata"]["name"]
            if other_name == name:
                if other["spec"]["aclMode"] != canonical["spec"]["aclMode"]:
                    raise ResourceError(
                        409,
                        "Conflict",
                        f"spec.aclMode of virtual cluster {name!r} is {other['spec']['aclMode']} and cannot change;"
                        " delete and create the virtual cluster to change it",
                    )
            elif other_name.startswith(name) or name.startswith(other_name):
                raise ResourceError(
                    409,
                    "Conflict",
                    f"virtual cluster {name!r} and {other_name!r}: one name starts with the other, so one tenant"
                    " would see the other's topics; end names with a separator ('team-a.')",
                )
        return canonical

    def apply(resources: Sequence[Manifest], state: StateView) -> None:
        gateway.virtual_clusters.replace(_cluster(m) for m in resources)

    kind = ResourceKind(
        kind=KIND,
        path="virtual-cluster",
        validate=validate,
        apply=apply,
        description="A tenant: its topics, groups and transactional ids under its name, and its ACLs.",
        columns=(
            ("NAME", "metadata.name"),
            ("ACL", "spec.aclEnabled"),
            ("ACL MODE", "spec.aclMode"),
            ("BOOTSTRAP", "spec.bootstrapServers"),
            ("STATUS", "status.status"),
        ),
        aliases=("virtual-clusters", "virtualcluster", "virtualclusters", "vcluster", "vc"),
        spec_schema=SPEC_SCHEMA,
    )
    return kind


def _cluster(manifest: Manifest) -> VirtualCluster:
    spec = manifest["spec"]
    return VirtualCluster(
        name=manifest["metadata"]["name"],
        acl_enabled=bool(spec.get("aclEnabled", False)),
        acl_mode=spec.get("aclMode", KAFKA_API),
        super_users=tuple(spec.get("superUsers") or ()),
        acls=tuple(spec.get("acls") or ()),
        type=spec.get("type", "Standard"),
    )
