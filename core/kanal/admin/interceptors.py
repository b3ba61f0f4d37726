"""The ``Interceptor`` resource kind, the plugin catalogue and the effective-chain resolver.

An Interceptor manifest::

    apiVersion: gateway/v2
    kind: Interceptor
    metadata:
      name: add-origin                 # same name + another scope = an override for that scope
      scope: {username: alice}         # optional: see below
    spec:
      pluginClass: header-injection    # an installed interceptor type (``plugin`` is accepted too)
      priority: 100                    # lower runs first
      config: {headers: {x-origin: kanal}}
      comment: optional free text

The scope's virtual cluster says which connections it targets: absent (or ``passthrough``), those in
no virtual cluster; null (stored as ``"*"``), every virtual cluster; a name, that one. ``group`` or
``username`` (never both) narrow it further. So a ``scope`` absent or ``{}`` is global for clients in
no virtual cluster, and ``{vCluster: null, group: null, username: null}`` is global for all.

Interceptors from the gateway's config file are listed too (read-only; a PUT of the same name and
scope answers 409). Applying the stored set replaces the gateway's pipeline atomically; a stored
interceptor this node cannot create (plugin missing on this node, config refused) reports Failed and
is left out, the others run.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kanal.api.interceptor import InterceptorConfigError, InterceptorSpec, Scope
from kanal.api.resources import (
    READY,
    Key,
    Manifest,
    ResourceError,
    ResourceKind,
    StateView,
    Status,
    check_envelope,
    envelope,
    invalid,
)
from kanal.pipeline.chain import PASSTHROUGH, check
from kanal.pipeline.registry import PluginRegistry
from kanal.protocol.sasl_mechanisms import Identity

if TYPE_CHECKING:
    from kanal.admin.host import GatewayHost

SCOPE_FIELDS = ("vCluster", "group", "username")
#: ``scope.vCluster`` of an interceptor for every virtual cluster, as stored (given as null): the
#: stored form needs a value, since a scope without one targets the passthrough cluster only. No
#: virtual cluster can be named so.
EVERY_VCLUSTER = "*"

SPEC_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "required": ["pluginClass"],
    "additionalProperties": False,
    "properties": {
        "pluginClass": {"type": "string", "description": "an installed interceptor type (see GET /gateway/v2/plugin)"},
        "priority": {"type": "integer", "default": 100, "description": "lower runs first"},
        "config": {"type": "object", "description": "the interceptor type's configuration"},
        "comment": {"type": "string"},
    },
}


def scope_of(metadata: Mapping[str, Any]) -> Scope:
    """The scope of a canonical manifest's metadata (see the module's docstring)."""
    scope = metadata.get("scope") or {}
    vcluster = scope.get("vCluster") or PASSTHROUGH
    return Scope(None if vcluster == EVERY_VCLUSTER else vcluster, scope.get("group"), scope.get("username"))


def spec_from_manifest(manifest: Mapping[str, Any]) -> InterceptorSpec:
    metadata, spec = manifest["metadata"], manifest["spec"]
    return InterceptorSpec(
        name=metadata["name"],
        plugin=spec["pluginClass"],
        priority=int(spec.get("priority", 100)),
        scope=scope_of(metadata),
        config=dict(spec.get("config") or {}),
    )


def manifest_from_spec(kind: ResourceKind, spec: InterceptorSpec) -> Manifest:
    metadata: dict[str, Any] = {"name": spec.name}
    vcluster = spec.scope.vcluster
    stored_vcluster = EVERY_VCLUSTER if vcluster is None else None if vcluster == PASSTHROUGH else vcluster
    scope = {
        k: v
        for k, v in (("vCluster", stored_vcluster), ("group", spec.scope.group), ("username", spec.scope.username))
        if v is not None
    }
    if scope:
        metadata["scope"] = scope
    return envelope(
        kind, metadata, {"pluginClass": spec.plugin, "priority": spec.priority, "config": dict(spec.config)}
    )


def _canonical(manifest: Any, kind: ResourceKind) -> Manifest:
    metadata, spec = check_envelope(manifest, kind)
    unknown = set(metadata) - {"name", "scope", "labels", "annotations"}
    if unknown:
        raise invalid(f"unknown metadata field {sorted(unknown)[0]!r} (expected name, scope)")
    out_meta: dict[str, Any] = {"name": metadata["name"]}
    scope = metadata.get("scope") or {}
    if not isinstance(scope, Mapping):
        raise invalid("metadata.scope must be an object {vCluster, group, username}")
    bad = set(scope) - set(SCOPE_FIELDS)
    if bad:
        raise invalid(f"unknown metadata.scope field {sorted(bad)[0]!r} (expected vCluster, group, username)")
    clean = {k: scope[k] for k in SCOPE_FIELDS if scope.get(k) not in (None, "")}
    for k, v in clean.items():
        if not isinstance(v, str):
            raise invalid(f"metadata.scope.{k} must be a string")
    if "vCluster" in scope and scope["vCluster"] is None:
        clean["vCluster"] = EVERY_VCLUSTER  # null: every virtual cluster (absent: passthrough only)
    elif clean.get("vCluster") == PASSTHROUGH:
        del clean["vCluster"]
    clean = {k: clean[k] for k in SCOPE_FIELDS if k in clean}
    if "group" in clean and "username" in clean:
        raise invalid("metadata.scope: group and username cannot both be set")
    if clean:
        out_meta["scope"] = clean
    unknown = set(spec) - {"pluginClass", "plugin", "priority", "config", "comment"}
    if unknown:
        raise invalid(f"unknown spec field {sorted(unknown)[0]!r} (expected pluginClass, priority, config, comment)")
    plugin = spec.get("pluginClass", spec.get("plugin"))
    if not isinstance(plugin, str) or not plugin:
        raise invalid("spec.pluginClass is required: the name of an installed interceptor type")
    priority = spec.get("priority", 100)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise invalid(f"spec.priority must be an integer, got {priority!r}")
    config = spec.get("config") or {}
    if not isinstance(config, Mapping):
        raise invalid("spec.config must be an object")
    out_spec: dict[str, Any] = {"pluginClass": plugin, "priority": priority, "config": dict(config)}
    comment = spec.get("comment")
    if comment is not None:
        if not isinstance(comment, str):
            raise invalid("spec.comment must be a string")
        out_spec["comment"] = comment
    return envelope(kind, out_meta, out_spec)


@dataclass(frozen=True)
class _InterceptorKind(ResourceKind):
    """The Interceptor kind: a scope given to find one (a DELETE's body, a GET's query, ``kanal
    delete -f`` of a manifest) reads as in a manifest, ``vCluster: null`` for every virtual cluster."""

    def delete_metadata(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        metadata = super().delete_metadata(name, body)
        nested = body.get("scope")
        given: Mapping[str, Any] = nested if isinstance(nested, Mapping) else body
        scope = metadata.pop("scope", {})
        if "vCluster" in given and given["vCluster"] is None:
            scope["vCluster"] = EVERY_VCLUSTER
        elif scope.get("vCluster") == PASSTHROUGH:
            del scope["vCluster"]
        if scope:
            metadata["scope"] = scope
        return metadata


def interceptor_kind(gateway: GatewayHost) -> ResourceKind:
    """The Interceptor kind of this gateway; interceptors configured before it (the config file) stay."""
    pipeline, registry = gateway.pipeline, gateway.registry
    static_specs = tuple(pipeline.specs(source="config"))
    static_keys = {(s.name, s.scope) for s in static_specs}

    def validate(manifest: Any, state: StateView) -> Manifest:
        canonical = _canonical(manifest, kind)
        spec = spec_from_manifest(canonical)
        if (spec.name, spec.scope) in static_keys:
            raise ResourceError(
                409,
                "Conflict",
                f"interceptor {spec.name!r} with this scope is defined in the gateway's config file; change it there",
            )
        try:
            check(spec, registry, pipeline.environ)
        except InterceptorConfigError as exc:
            raise invalid(str(exc)) from exc
        return canonical

    def apply(resources: Sequence[Manifest], state: StateView) -> dict[Key, Status]:
        statuses: dict[Key, Status] = {}
        usable: dict[Key, InterceptorSpec] = {}
        for manifest in resources:
            key = kind.key_of(manifest["metadata"])
            spec = spec_from_manifest(manifest)
            if (spec.name, spec.scope) in static_keys:
                statuses[key] = Status("Failed", "the config file of this node defines the same name and scope")
                continue
            usable[key] = spec
            statuses[key] = READY
        failed: dict[tuple[str, Any], str] = {}  # interceptors whose constructor refused their config
        pipeline.configure(list(usable.values()), source="admin", failed=failed)
        for key, spec in usable.items():
            if (spec.name, spec.scope) in failed:
                statuses[key] = Status("Failed", failed[(spec.name, spec.scope)])
        return statuses

    def static() -> list[Manifest]:
        return [manifest_from_spec(kind, s) for s in static_specs]

    kind = _InterceptorKind(
        kind="Interceptor",
        path="interceptor",
        validate=validate,
        apply=apply,
        description="A configured instance of an interceptor type: name, scope, plugin, priority, config.",
        key_fields=("scope.vCluster", "scope.group", "scope.username"),
        columns=(
            ("NAME", "metadata.name"),
            ("PLUGIN", "spec.pluginClass"),
            ("PRIORITY", "spec.priority"),
            ("VCLUSTER", "metadata.scope.vCluster"),
            ("GROUP", "metadata.scope.group"),
            ("USERNAME", "metadata.scope.username"),
            ("STATUS", "status.status"),
        ),
        aliases=("interceptors", "ic"),
        spec_schema=SPEC_SCHEMA,
        list_filters={
            "vcluster": "metadata.scope.vCluster",
            "group": "metadata.scope.group",
            "username": "metadata.scope.username",
        },
        static=static,
    )
    return kind


def resolve(gateway: GatewayHost, kind: ResourceKind, body: Any) -> list[Manifest]:
    """The effective chain, in the order it runs, for ``{username, vCluster, groups, externalGroups}``.

    Without ``groups`` the answer is the one a connection of that principal gets: the principal
    mapped through the service accounts (an EXTERNAL account's external name becomes the account)
    and its GatewayGroups looked up, with ``externalGroups`` as the groups its credential claims.
    With ``groups`` (GatewayGroup names), those are taken as they are, for a what-if.
    """

    if body is None:
        body = {}
    if not isinstance(body, Mapping):
        raise invalid("the body must be a JSON object {username, vCluster, groups, externalGroups}")
    unknown = set(body) - {"username", "groups", "externalGroups", "vCluster", "vcluster"}
    if unknown:
        raise invalid(f"unknown field {sorted(unknown)[0]!r} (expected username, vCluster, groups, externalGroups)")
    username = body.get("username")
    groups = body.get("groups")
    external = body.get("externalGroups") or []
    vcluster = body.get("vCluster", body.get("vcluster"))
    if username is not None and not isinstance(username, str):
        raise invalid("username must be a string")
    if groups is not None and (not isinstance(groups, list) or not all(isinstance(g, str) for g in groups)):
        raise invalid("groups must be a list of strings (GatewayGroup names)")
    if not isinstance(external, list) or not all(isinstance(g, str) for g in external):
        raise invalid("externalGroups must be a list of strings (groups a credential claims)")
    if groups is not None and external:
        raise invalid("give groups (GatewayGroup names, taken as they are) or externalGroups, not both")
    if vcluster is not None and not isinstance(vcluster, str):
        raise invalid("vCluster must be a string")
    if vcluster in ("", PASSTHROUGH):
        vcluster = None
    if groups is not None:
        chain = gateway.pipeline.resolve(username or None, tuple(sorted(set(groups))), vcluster)
    elif username:
        identity = gateway.directory.identify(Identity(username, tuple(external), vcluster))
        chain = gateway.pipeline.resolve(identity.principal, tuple(identity.groups), identity.vcluster)
    else:
        chain = gateway.pipeline.resolve(None, (), vcluster)  # an anonymous client
    return [manifest_from_spec(kind, c.spec) for c in chain.interceptors if not c.builtin]


def plugin_catalogue(registry: PluginRegistry) -> list[dict[str, Any]]:
    """Every installed interceptor type with its plugin, description, docs and config schema."""
    out = []
    for name, cls in sorted(registry.interceptor_types().items()):
        plugin = registry.plugin_of(name) or ""
        out.append(
            {
                "plugin": name,
                "pluginId": plugin,
                "title": name,
                "description": cls.description or _first_line(cls.__doc__),
                "readme": _dedent(cls.__doc__),
                "configSchema": cls.config_schema,
                "module": f"{cls.__module__}:{cls.__qualname__}",
                "version": _version_of(cls.__module__),
            }
        )
    return out


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().split("\n", 1)[0]


def _dedent(doc: str | None) -> str:
    import inspect

    return inspect.cleandoc(doc or "")


def _version_of(module: str) -> str | None:
    top = module.split(".", 1)[0]
    try:
        version = getattr(importlib.import_module(top), "__version__", None)
    except ImportError:
        return None
    return None if version is None else str(version)
