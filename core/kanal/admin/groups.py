"""The ``GatewayGroup`` resource kind: named sets of principals that interceptors can target.

A GatewayGroup manifest::

    apiVersion: gateway/v2
    kind: GatewayGroup
    metadata:
      name: payments             # unique across the gateway (groups are in no virtual cluster)
    spec:
      members:                   # principals by name: service accounts, or any principal name
        - name: orders-app
          vCluster: tenant-a     # optional; absent = in no virtual cluster (passthrough)
        - name: billing-app
      externalGroups:            # groups a credential claims (an OAuth token's groups claim)
        - payments-team

A connection is in the group when its principal (after the service accounts' mapping) is a member,
or when its credential claims one of the external groups. Interceptors with ``scope.group: payments``
then apply to it. Applying the stored set replaces the gateway's
:class:`~kanal.identity.groups.Groups` (``gateway.groups``); live connections see the change at their
next request, without reconnecting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kanal.api.resources import READY, Key, Manifest, ResourceKind, StateView, Status, check_envelope, envelope, invalid
from kanal.identity.groups import Group, Groups, Member
from kanal.pipeline.chain import PASSTHROUGH

if TYPE_CHECKING:
    pass

KIND = "GatewayGroup"

SPEC_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "members": {
            "type": "array",
            "description": "principals in the group, by name and virtual cluster (absent: passthrough); service"
            " accounts or any principal name",
            "items": {
                "type": "object",
                "required": ["name"],
                "additionalProperties": False,
                "properties": {"name": {"type": "string", "minLength": 1}, "vCluster": {"type": "string"}},
            },
        },
        "externalGroups": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "description": "group names a credential claims (an OAuth token's groups claim) that make its"
            " connection a member",
        },
    },
}


def group_from_manifest(manifest: Mapping[str, Any]) -> Group:
    """The group a canonical manifest stands for."""
    spec = manifest["spec"]
    return Group(
        name=manifest["metadata"]["name"],
        members=tuple(Member(m["name"], m.get("vCluster")) for m in spec.get("members", ())),
        external_groups=tuple(spec.get("externalGroups", ())),
    )


def _members(raw: Any) -> list[dict[str, str]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid("spec.members must be a list of {name, vCluster}")
    out: list[dict[str, str]] = []
    seen: set[tuple[str, str | None]] = set()
    for i, item in enumerate(raw):
        where = f"spec.members[{i}]"
        if not isinstance(item, Mapping):
            raise invalid(f"{where} must be an object {{name, vCluster}}, got {item!r}")
        unknown = set(item) - {"name", "vCluster"}
        if unknown:
            raise invalid(f"unknown field {where}.{sorted(unknown)[0]} (expected name, vCluster)")
        name = item.get("name")
        if not isinstance(name, str) or not name.strip():
            raise invalid(f"{where}.name is required: a principal's name (a service account's)")
        vcluster = item.get("vCluster")
        if vcluster is not None and not isinstance(vcluster, str):
            raise invalid(f"{where}.vCluster must be a string (absent: no virtual cluster)")
        if vcluster in ("", PASSTHROUGH):
            vcluster = None
        if (name, vcluster) in seen:
            where_vc = f" in vCluster {vcluster!r}" if vcluster is not None else ""
            raise invalid(f"spec.members lists {name!r}{where_vc} twice")
        seen.add((name, vcluster))
        out.append({"name": name} if vcluster is None else {"name": name, "vCluster": vcluster})
    return out


def _external_groups(raw: Any) -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(g, str) and g.strip() for g in raw):
        raise invalid("spec.externalGroups must be a list of non-empty strings (group names a credential claims)")
    twice = next((g for g in raw if raw.count(g) > 1), None)
    if twice is not None:
        raise invalid(f"spec.externalGroups lists {twice!r} twice")
    return list(raw)


def _canonical(manifest: Any, kind: ResourceKind) -> Manifest:
    metadata, spec = check_envelope(manifest, kind)
    if metadata.get("vCluster") not in (None, ""):
        raise invalid(
            "metadata.vCluster: a group is in no virtual cluster (its name is unique across the gateway);"
            " give each member's virtual cluster in spec.members[].vCluster"
        )
    unknown = set(metadata) - {"name", "vCluster", "labels", "annotations"}
    if unknown:
        raise invalid(f"unknown metadata field {sorted(unknown)[0]!r} (expected name)")
    unknown = set(spec) - {"members", "externalGroups"}
    if unknown:
        raise invalid(f"unknown spec field {sorted(unknown)[0]!r} (expected members, externalGroups)")
    out_spec: dict[str, Any] = {"members": _members(spec.get("members"))}
    external = _external_groups(spec.get("externalGroups"))
    if external:
        out_spec["externalGroups"] = external
    return envelope(kind, {"name": metadata["name"]}, out_spec)


def group_kind(groups: Groups) -> ResourceKind:
    """The GatewayGroup kind; applying it replaces ``groups``."""

    def validate(manifest: Any, state: StateView) -> Manifest:
        return _canonical(manifest, kind)

    def apply(resources: Sequence[Manifest], state: StateView) -> dict[Key, Status]:
        groups.replace(group_from_manifest(m) for m in resources)
        return {kind.key_of(m["metadata"]): READY for m in resources}

    kind = ResourceKind(
        kind=KIND,
        path="group",
        validate=validate,
        apply=apply,
        description="A named set of principals (members, external groups) that interceptor scopes target.",
        columns=(
            ("NAME", "metadata.name"),
            ("MEMBERS", "spec.members"),
            ("EXTERNAL GROUPS", "spec.externalGroups"),
            ("STATUS", "status.status"),
        ),
        aliases=("gatewaygroups", "gateway-group", "gateway-groups"),
        spec_schema=SPEC_SCHEMA,
    )
    return kind


__all__ = ["KIND", "group_from_manifest", "group_kind"]
