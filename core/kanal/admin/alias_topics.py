"""The ``AliasTopic`` resource kind: a logical topic name in a virtual cluster for a physical topic.

An AliasTopic manifest::

    apiVersion: gateway/v2
    kind: AliasTopic
    metadata:
      name: orders                  # the logical name the tenant's clients use
      vCluster: team-a.             # optional: without it, an alias of the passthrough cluster
    spec:
      physicalName: shared.orders   # the cluster's topic it stands for

An alias is identified by its name and its virtual cluster (``orders`` in ``team-a.`` and ``orders``
in ``team-b.`` are two aliases). Its physical name may be any topic of the cluster, but never where
another alias of the same virtual cluster is stored (``<vCluster><other alias>``): no alias of an
alias (see :mod:`kanal.tenancy.aliases`). Applying the stored set replaces the gateway's
:class:`~kanal.tenancy.aliases.AliasTopics` (which the gateway follows: the tenants' names).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kanal.admin.virtual_clusters import refuse_without_authentication
from kanal.api.resources import Manifest, ResourceError, ResourceKind, StateView, check_envelope, envelope, invalid
from kanal.tenancy.aliases import AliasTopic, alias_of_alias
from kanal.tenancy.names import MAX_TOPIC_LENGTH, VirtualNames

if TYPE_CHECKING:
    from kanal.admin.host import GatewayHost

__all__ = ["KIND", "alias_topic_kind"]

KIND = "AliasTopic"
# What Kafka accepts as a topic name (the physical name is one as it is, with no prefix added).
_TOPIC = re.compile(rf"[a-zA-Z0-9._-]{{1,{MAX_TOPIC_LENGTH}}}")
_RESERVED = frozenset({".", ".."})

SPEC_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["physicalName"],
    "properties": {
        "physicalName": {"type": "string", "pattern": rf"^[a-zA-Z0-9._-]{{1,{MAX_TOPIC_LENGTH}}}$"},
    },
}


def _canonical(manifest: Any, kind: ResourceKind) -> Manifest:
    """The manifest with only the fields the kind knows, or a 400 naming the field at fault."""
    metadata, spec = check_envelope(manifest, kind)
    unknown = set(metadata) - {"name", "vCluster", "labels", "annotations"}
    if unknown:
        raise invalid(f"unknown metadata field {sorted(unknown)[0]!r} (expected name, vCluster)")
    name = metadata["name"]
    vcluster = metadata.get("vCluster")
    if vcluster is not None and not isinstance(vcluster, str):
        raise invalid(f"metadata.vCluster must be a virtual cluster's name, got {vcluster!r}")
    if vcluster:
        try:
            names = VirtualNames(vcluster)
        except ValueError as exc:
            raise invalid(f"metadata.vCluster: {exc}") from exc
    else:
        vcluster, names = None, VirtualNames.passthrough({})
    why = names.invalid_topic(name)
    if why is not None:
        raise invalid(f"metadata.name: {why}")
    unknown = set(spec) - {"physicalName"}
    if unknown:
        raise invalid(f"unknown spec field {sorted(unknown)[0]!r} (expected physicalName)")
    physical = spec.get("physicalName")
    if physical in (None, ""):
        raise invalid("spec.physicalName is required: the cluster's topic the alias stands for")
    if not isinstance(physical, str) or not _TOPIC.fullmatch(physical) or physical in _RESERVED:
        raise invalid(
            f"spec.physicalName must be a topic name: 1 to {MAX_TOPIC_LENGTH} ASCII letters, digits,"
            f" '.', '_' or '-', not '.' or '..'; got {physical!r}"
        )
    metadata_out = {"name": name} if vcluster is None else {"name": name, "vCluster": vcluster}
    return envelope(kind, metadata_out, {"physicalName": physical})


def _alias(manifest: Manifest) -> AliasTopic:
    """The alias a canonical manifest stands for."""
    metadata = manifest["metadata"]
    return AliasTopic(
        name=metadata["name"], vcluster=metadata.get("vCluster"), physical_name=manifest["spec"]["physicalName"]
    )


def _refuse_alias_of_alias(aliases: Iterable[AliasTopic]) -> None:
    """A 409 naming both aliases when one stands for where the other is stored."""
    aliases = list(aliases)
    offending = alias_of_alias(aliases)
    if offending is None:
        return
    target = next(
        a
        for a in aliases
        if a.vcluster == offending.vcluster and (a.vcluster or "") + a.name == offending.physical_name
    )
    cluster = "the passthrough cluster" if offending.vcluster is None else f"virtual cluster {offending.vcluster!r}"
    where = f"alias topic {offending.name!r} of {cluster}"
    if target.name == offending.name:
        msg = (
            f"{where} stands for {offending.physical_name!r}, where the alias itself is stored: no alias of an"
            f" alias; without the alias, {offending.name!r} is that topic already"
        )
    else:
        msg = (
            f"{where} stands for {offending.physical_name!r}, where alias topic {target.name!r} of the same"
            f" cluster is stored: no alias of an alias; point {offending.name!r} at what"
            f" {target.name!r} stands for, {target.physical_name!r}"
        )
    raise ResourceError(409, "Conflict", msg)


def alias_topic_kind(gateway: GatewayHost) -> ResourceKind:
    """The AliasTopic kind; applying it replaces the gateway's aliases."""

    def validate(manifest: Any, state: StateView) -> Manifest:
        canonical = _canonical(manifest, kind)
        if "vCluster" in canonical["metadata"]:
            refuse_without_authentication(gateway, "alias topics of a virtual cluster")
        elif gateway.settings.security_mode == "kafka_managed":
            raise ResourceError(
                409,
                "Conflict",
                "alias topics are not available with GATEWAY_SECURITY_MODE=KAFKA_MANAGED (the cluster's"
                " own ACLs would see names the gateway changed)",
            )
        key = kind.key_of(canonical["metadata"])
        others = [_alias(m) for m in state.resources(KIND) if kind.key_of(m["metadata"]) != key]
        _refuse_alias_of_alias([*others, _alias(canonical)])
        return canonical

    def apply(resources: Sequence[Manifest], state: StateView) -> None:
        gateway.aliases.replace(_alias(m) for m in resources)

    kind = ResourceKind(
        kind=KIND,
        path="alias-topic",
        validate=validate,
        apply=apply,
        description="A topic name, in a virtual cluster or the passthrough cluster, for a topic of the cluster.",
        key_fields=("vCluster",),
        columns=(
            ("NAME", "metadata.name"),
            ("VCLUSTER", "metadata.vCluster"),
            ("PHYSICAL NAME", "spec.physicalName"),
            ("STATUS", "status.status"),
        ),
        aliases=("alias-topics", "aliastopic", "aliastopics", "alias", "at"),
        spec_schema=SPEC_SCHEMA,
        list_filters={"vcluster": "metadata.vCluster"},
    )
    return kind
