"""The ``TopicView`` resource kind (``apiVersion: gateway/v2``): validation, canonical form, applying.

::

    apiVersion: gateway/v2
    kind: TopicView
    metadata:
      name: big-eur-orders                      # the name of the virtual topic
    spec:
      transformation:
        type: sql
        statement: SELECT id, amount, customer.tier AS tier FROM orders WHERE amount > 100 AND currency = 'EUR'
      onError:
        type: DROP                              # or FAIL_FETCH
      schemaRegistryConnectionName: my-registry # optional: Avro records in Confluent framing

The admin layer serves it at ``/gateway/v2/topic-view`` (PUT, GET, DELETE, ``dryMode``), stores it in
the gateway's compacted state topic and calls :func:`apply` on every node with all stored views, which
installs (or removes) the ``topic-views`` interceptor in the node's pipeline.

Validation (400 with a message naming the field): the SQL must compile (the message names the
unsupported construct), onError is DROP or FAIL_FETCH, the view may not read itself or another view,
its name may not be a topic the gateway knows on the cluster nor the input topic of another view, and
a schema registry connection must be declared (``GATEWAY_EXTERNAL_CONNECTION_<NAME>_...``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from kanal.api import (
    READY,
    GatewayServices,
    InterceptorConfigError,
    InterceptorSpec,
    Key,
    Manifest,
    ResourceKind,
    StateView,
    Status,
    check_envelope,
    envelope,
    invalid,
)

from .connections import ExternalConnectionError, ValueDecoders
from .interceptor import PLUGIN_NAME, PRIORITY
from .runtime import ensure_runtime
from .sql import ViewSqlError
from .views import ON_ERROR, View, ViewConfigError, compiled

__all__ = ["KIND", "PATH", "SOURCE", "SPEC_SCHEMA", "canonical", "topic_view_kind"]

KIND: Final = "TopicView"
PATH: Final = "topic-view"
SOURCE: Final = "topic-views"  # the pipeline source of the plugin's interceptor (the plugin's name)

SPEC_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "required": ["transformation", "onError"],
    "additionalProperties": False,
    "properties": {
        "transformation": {
            "type": "object",
            "required": ["type", "statement"],
            "additionalProperties": False,
            "properties": {
                "type": {"enum": ["sql"]},
                "statement": {
                    "type": "string",
                    "description": "SELECT <field list> FROM <physical topic> [WHERE <condition>]",
                },
            },
        },
        "onError": {
            "type": "object",
            "required": ["type"],
            "additionalProperties": False,
            "properties": {
                "type": {
                    "enum": list(ON_ERROR),
                    "description": "DROP: drop a record that cannot be transformed; "
                    "FAIL_FETCH: fail the partition's fetch",
                }
            },
        },
        "schemaRegistryConnectionName": {
            "type": "string",
            "description": "a schema registry external connection (GATEWAY_EXTERNAL_CONNECTION_<NAME>_CONFIG_URL...)",
        },
    },
}


def _object(value: Any, where: str, keys: Sequence[str]) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise invalid(f"{where} is required, an object with {', '.join(keys)}")
    unknown = sorted(set(value) - set(keys))
    if unknown:
        raise invalid(f"unknown field {where}.{unknown[0]} (expected {', '.join(keys)})")
    return dict(value)


def canonical(manifest: Any, kind: ResourceKind, decoders: ValueDecoders | None) -> tuple[Manifest, str]:
    """The canonical manifest and the view's input topic; raises ``invalid`` (400)."""
    metadata, spec = check_envelope(manifest, kind)
    unknown = sorted(set(metadata) - {"name"})
    if unknown:
        raise invalid(f"unknown metadata field {unknown[0]!r} (expected name)")
    name = str(metadata["name"])
    spec = _object(spec, "spec", ("transformation", "onError", "schemaRegistryConnectionName"))
    transformation = _object(spec.get("transformation"), "spec.transformation", ("type", "statement"))
    kind_of = transformation.get("type")
    if not isinstance(kind_of, str) or kind_of.lower() != "sql":
        raise invalid(f"spec.transformation.type must be sql, got {kind_of!r}")
    statement = transformation.get("statement")
    if not isinstance(statement, str) or not statement.strip():
        raise invalid("spec.transformation.statement is required: SELECT <fields> FROM <topic> [WHERE <condition>]")
    try:
        sql = compiled(statement)
    except ViewSqlError as exc:
        raise invalid(f"spec.transformation.statement: {exc}", cause=type(exc).__name__) from None
    on_error = _object(spec.get("onError"), "spec.onError", ("type",)).get("type")
    if not isinstance(on_error, str) or on_error.upper() not in ON_ERROR:
        raise invalid(f"spec.onError.type must be DROP or FAIL_FETCH, got {on_error!r}")
    out: dict[str, Any] = {
        "transformation": {"type": "sql", "statement": statement},
        "onError": {"type": on_error.upper()},
    }
    connection = spec.get("schemaRegistryConnectionName")
    if connection is not None:
        if not isinstance(connection, str) or not connection:
            raise invalid("spec.schemaRegistryConnectionName must be the name of an external connection")
        known = decoders.names() if decoders is not None else []
        reason = decoders.why_not(connection) if decoders is not None else None
        if reason is not None:
            raise invalid(f"spec.schemaRegistryConnectionName: {reason}")
        if decoders is None or not decoders.has(connection):
            raise invalid(
                f"spec.schemaRegistryConnectionName: no schema registry external connection {connection!r} "
                f"(declared: {', '.join(known) or 'none'}; declare one with "
                f"GATEWAY_EXTERNAL_CONNECTION_<NAME>_CONFIG_URL)"
            )
        out["schemaRegistryConnectionName"] = connection
    if sql.topic == name:
        raise invalid(f"spec.transformation.statement: the view {name!r} cannot read itself")
    return envelope(kind, {"name": name}, out), sql.topic


def topic_view_kind(services: GatewayServices, decoders: ValueDecoders | None = None) -> ResourceKind:
    """The TopicView kind of a gateway (its plugin services); ``decoders`` resolves schema registry
    connections (default: those declared in the gateway's ``GATEWAY_EXTERNAL_CONNECTION_*`` settings).
    Builds the plugin's runtime in ``services.shared``, which the interceptors it installs read."""
    cluster_id = services.cluster_id
    decoders = ensure_runtime(services, decoders).decoders

    def validate(manifest: Any, state: StateView) -> Manifest:
        result, topic = canonical(manifest, kind, decoders)
        name = result["metadata"]["name"]
        others = [m for m in state.resources(KIND) if m["metadata"]["name"] != name]
        if any(m["metadata"]["name"] == topic for m in others):
            raise invalid(f"spec.transformation.statement: {topic!r} is a topic view; a view reads a topic")
        for m in others:
            try:
                reads = compiled(m["spec"]["transformation"]["statement"]).topic
            except (ViewSqlError, KeyError, TypeError):
                continue
            if reads == name:
                raise invalid(f"metadata.name: {name!r} is the input topic of topic view {m['metadata']['name']!r}")
        if services.topic_names.id(name) is not None:
            raise invalid(
                f"metadata.name: a topic named {name!r} exists on the cluster; a view needs a name of its own"
            )
        return result

    def apply(resources: Sequence[Manifest], state: StateView) -> dict[Key, Status]:
        statuses: dict[Key, Status] = {}
        usable: list[Manifest] = []
        for manifest in resources:
            key = kind.key_of(manifest["metadata"])
            try:
                View.from_manifest(manifest, cluster_id, decoders)
            except (ViewConfigError, ExternalConnectionError, KeyError, TypeError) as exc:
                statuses[key] = Status("Failed", str(exc))
                continue
            usable.append(manifest)
            statuses[key] = READY
        specs = []
        if usable:
            config = {"views": usable, "clusterId": cluster_id}
            specs.append(InterceptorSpec(name=PLUGIN_NAME, plugin=PLUGIN_NAME, priority=PRIORITY, config=config))
        try:
            services.install(specs)
        except InterceptorConfigError as exc:
            return {kind.key_of(m["metadata"]): Status("Failed", str(exc)) for m in resources}
        return statuses

    kind = ResourceKind(
        kind=KIND,
        path=PATH,
        validate=validate,
        apply=apply,
        description="A live, read-only SQL projection of one topic, served by the gateway as a topic of its own.",
        columns=(
            ("NAME", "metadata.name"),
            ("ON ERROR", "spec.onError.type"),
            ("STATEMENT", "spec.transformation.statement"),
            ("STATUS", "status.status"),
        ),
        aliases=("topicview", "topicviews", "topic-views", "tv"),
        spec_schema=SPEC_SCHEMA,
        plugin=PLUGIN_NAME,
    )
    return kind
