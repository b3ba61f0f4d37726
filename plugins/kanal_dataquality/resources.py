"""The manifests of the plugin: DataQualityRule (v1), DataQualityPolicy (v1) and Alert (v3).

Each ``canonical_*`` function checks a manifest and returns its canonical form (defaults filled in,
unknown fields refused), or raises :func:`kanal.api.invalid` (a 400 whose message says
why). :func:`resource_kinds` turns them into the admin API's resource kinds; the gateway then serves
``/gateway/v2/data-quality-rule``, ``/gateway/v2/data-quality-policy`` and ``/gateway/v2/alert``,
stores them in its state topic and applies them on every node.

DataQualityRule::

    apiVersion: v1
    kind: DataQualityRule
    metadata: {name: positive-amount}
    spec:
      type: Cel                      # or JsonSchema
      displayName: Positive amount
      description: optional
      celExpression: value.amount > 0  # Cel
      schema: {...}                  # JsonSchema (an object, or its JSON text)
      message: optional custom violation text (default "<name> did not pass")

DataQualityPolicy::

    apiVersion: v1
    kind: DataQualityPolicy
    metadata: {name: orders, group: team-orders}
    spec:
      displayName: Orders
      description: optional
      rules: [positive-amount, EnforceAvro]
      targets:
        - {cluster: gateway, topic: orders, patternType: LITERAL}
        - {cluster: gateway, topic: "payments-*"}          # a prefix (patternType PREFIXED)
      actions: {block: {enabled: false}, mark: {enabled: true}, report: {enabled: true}}
      # shadow (our extension): {enabled: true} evaluates live traffic and reports what block would
      # have rejected, blocking and marking nothing

Alert::

    apiVersion: v3
    kind: Alert
    metadata: {name: orders-alert, group: team-orders}
    spec:
      type: DataQualityPolicyAlert
      policyName: orders
      triggerAfter: 10
      withinInSeconds: 60
      destination: {type: Webhook, url: "https://hooks.example/x"}   # optional; or {type: AuditLog}
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from kanal.api import Key, Manifest, ResourceKind, StateView, Status, check_envelope, envelope, invalid
from kanal_dataquality.rules import CEL, ENFORCE_AVRO, JSON_SCHEMA, RuleCompileError, compile_rule

__all__ = [
    "ALERT",
    "ALERT_TYPE",
    "LITERAL",
    "POLICY",
    "PREFIXED",
    "RULE",
    "Checks",
    "canonical_alert",
    "canonical_policy",
    "canonical_rule",
    "resource_kinds",
]

RULE = "DataQualityRule"
POLICY = "DataQualityPolicy"
ALERT = "Alert"
ALERT_TYPE = "DataQualityPolicyAlert"
LITERAL = "LITERAL"
PREFIXED = "PREFIXED"

_METADATA = ("name", "labels", "annotations")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_TYPES = {
    "cel": CEL,
    "jsonschema": JSON_SCHEMA,
    "json-schema": JSON_SCHEMA,
    "json_schema": JSON_SCHEMA,
}
_DESTINATIONS = {"webhook": "Webhook", "auditlog": "AuditLog", "audit-log": "AuditLog", "audit": "AuditLog"}


@dataclass(frozen=True)
class Checks:
    """What validation needs to know about this gateway."""

    gateway_cluster: str  # GATEWAY_CLUSTER_ID
    observed_clusters: frozenset[str] = frozenset()  # Kafka clusters without a gateway (DATA_QUALITY_CLUSTERS)
    registry_configured: bool = False


def _metadata(metadata: Mapping[str, Any], allowed: Sequence[str]) -> dict[str, Any]:
    unknown = set(metadata) - set(allowed)
    if unknown:
        raise invalid(f"unknown metadata field {sorted(unknown)[0]!r} (expected {', '.join(allowed)})")
    out: dict[str, Any] = {"name": metadata["name"]}
    for field in allowed[1:]:
        value = metadata.get(field)
        if value is None:
            continue
        if field in ("labels", "annotations"):
            if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
                raise invalid(f"metadata.{field} must be a map of strings")
            out[field] = dict(value)
        else:
            if not isinstance(value, str) or not value.strip():
                raise invalid(f"metadata.{field} must be a non-empty string")
            out[field] = value.strip()
    return out


def _unknown(spec: Mapping[str, Any], allowed: Sequence[str], where: str = "spec") -> None:
    unknown = set(spec) - set(allowed)
    if unknown:
        raise invalid(f"unknown {where} field {sorted(unknown)[0]!r} (expected {', '.join(allowed)})")


def _text(spec: Mapping[str, Any], field: str, *, required: bool) -> str | None:
    value = spec.get(field)
    if value is None or (isinstance(value, str) and not value.strip() and not required):
        if required:
            raise invalid(f"spec.{field} is required")
        return None
    if not isinstance(value, str) or not value.strip():
        raise invalid(f"spec.{field} must be a non-empty string")
    return value


# -- DataQualityRule ----------------------------------------------------------------------------


def canonical_rule(manifest: Any, kind: ResourceKind) -> Manifest:
    """A DataQualityRule, checked and compiled once (invalid CEL or schema: 400)."""
    metadata, spec = check_envelope(manifest, kind)
    meta = _metadata(metadata, _METADATA)
    name = meta["name"]
    if name == ENFORCE_AVRO:
        raise invalid(f"{ENFORCE_AVRO} is a built-in rule: list it in a policy's rules, do not declare it")
    _unknown(spec, ("type", "displayName", "description", "celExpression", "schema", "message"))
    raw_type = spec.get("type")
    if not isinstance(raw_type, str) or raw_type.strip().lower() not in _TYPES:
        raise invalid(f"spec.type is required: {CEL} or {JSON_SCHEMA} (got {raw_type!r})")
    rule_type = _TYPES[raw_type.strip().lower()]
    out: dict[str, Any] = {"type": rule_type, "displayName": _text(spec, "displayName", required=True)}
    description = _text(spec, "description", required=False)
    if description is not None:
        out["description"] = description
    if rule_type == CEL:
        if "schema" in spec:
            raise invalid("spec.schema is for JsonSchema rules; a Cel rule has spec.celExpression")
        out["celExpression"] = _text(spec, "celExpression", required=True)
    else:
        if "celExpression" in spec:
            raise invalid("spec.celExpression is for Cel rules; a JsonSchema rule has spec.schema")
        schema = spec.get("schema")
        if schema is None:
            raise invalid("spec.schema is required for a JsonSchema rule")
        if isinstance(schema, str):
            try:
                schema = orjson.loads(schema)
            except orjson.JSONDecodeError as exc:
                raise invalid(f"invalid JSON schema: spec.schema is not JSON: {exc}") from None
        if not isinstance(schema, dict | bool):
            raise invalid("invalid JSON schema: spec.schema must be a JSON object")
        out["schema"] = schema
    message = _text(spec, "message", required=False)
    if message is not None:
        out["message"] = message
    try:
        compile_rule(name, out)
    except RuleCompileError as exc:
        raise invalid(f"rule {name!r}: {exc}") from None
    return envelope(kind, meta, out)


# -- DataQualityPolicy --------------------------------------------------------------------------


def _flag(actions: Mapping[str, Any], name: str, default: bool) -> bool:
    action = actions.get(name)
    if action is None:
        return default
    if isinstance(action, bool):
        return action
    if not isinstance(action, Mapping):
        raise invalid(f"spec.actions.{name} must be an object {{enabled: true|false}}")
    _unknown(action, ("enabled",), f"spec.actions.{name}")
    enabled = action.get("enabled", False)
    if not isinstance(enabled, bool):
        raise invalid(f"spec.actions.{name}.enabled must be true or false")
    return enabled


def _target(i: int, target: Any) -> dict[str, str]:
    where = f"spec.targets[{i}]"
    if not isinstance(target, Mapping):
        raise invalid(f"{where} must be an object {{cluster, topic, patternType}}")
    _unknown(target, ("cluster", "topic", "patternType"), where)
    cluster = target.get("cluster")
    if not isinstance(cluster, str) or not cluster.strip():
        raise invalid(f"{where}.cluster is required: the name of the gateway cluster (or of an observed cluster)")
    topic = target.get("topic")
    if not isinstance(topic, str) or not topic.strip():
        raise invalid(f"{where}.topic is required: a topic name, or a prefix written <prefix>*")
    topic = topic.strip()
    pattern = target.get("patternType")
    if pattern is not None and (not isinstance(pattern, str) or pattern.upper() not in (LITERAL, PREFIXED)):
        raise invalid(f"{where}.patternType must be {LITERAL} or {PREFIXED}, got {pattern!r}")
    pattern = pattern.upper() if isinstance(pattern, str) else None
    if topic.endswith("*"):
        topic = topic[:-1]
        pattern = PREFIXED
    if pattern is None:
        pattern = LITERAL
    if "*" in topic:
        raise invalid(f"{where}.topic: '*' is allowed only at the end (a prefix), got {target.get('topic')!r}")
    if topic and not _TOPIC.match(topic):
        raise invalid(f"{where}.topic: {topic!r} is not a valid topic name or prefix")
    if pattern == LITERAL and not topic:
        raise invalid(f"{where}.topic is required")
    return {"cluster": cluster.strip(), "topic": topic, "patternType": pattern}


def canonical_policy(manifest: Any, kind: ResourceKind, state: StateView, checks: Checks) -> Manifest:
    """A DataQualityPolicy: rules exist, targets valid and not mixing gateway and non-gateway clusters."""
    metadata, spec = check_envelope(manifest, kind)
    meta = _metadata(metadata, ("name", "group", "labels", "annotations"))
    if "group" not in meta:
        raise invalid("metadata.group is required: the group that owns the policy")
    _unknown(spec, ("displayName", "description", "rules", "targets", "actions"))
    out: dict[str, Any] = {"displayName": _text(spec, "displayName", required=True)}
    description = _text(spec, "description", required=False)
    if description is not None:
        out["description"] = description

    rules = spec.get("rules")
    if rules is None or (isinstance(rules, list) and not rules):
        raise invalid("spec.rules: a policy needs at least one rule")
    if not isinstance(rules, list) or not all(isinstance(r, str) and r for r in rules):
        raise invalid("spec.rules must be a list of rule names (metadata.name of DataQualityRule resources)")
    if len(set(rules)) != len(rules):
        duplicate = next(r for r in rules if rules.count(r) > 1)
        raise invalid(f"spec.rules lists {duplicate!r} twice")
    known = {r["metadata"]["name"] for r in state.resources(RULE)}
    for rule in rules:
        if rule == ENFORCE_AVRO:
            if not checks.registry_configured:
                raise invalid(
                    f"rule {ENFORCE_AVRO} needs a schema registry: set DATA_QUALITY_SCHEMA_REGISTRY_URL "
                    "(or SCHEMA_REGISTRY_URL) on the gateway"
                )
        elif rule not in known:
            raise invalid(
                f"spec.rules: unknown rule {rule!r} (no DataQualityRule of that name, and not {ENFORCE_AVRO})"
            )
    out["rules"] = list(rules)

    targets = spec.get("targets")
    if targets is None or (isinstance(targets, list) and not targets):
        raise invalid("spec.targets: a policy needs at least one target")
    if not isinstance(targets, list):
        raise invalid("spec.targets must be a list of {cluster, topic, patternType}")
    canonical_targets = [_target(i, t) for i, t in enumerate(targets)]
    gateway = [t for t in canonical_targets if t["cluster"] == checks.gateway_cluster]
    observed = [t for t in canonical_targets if t["cluster"] in checks.observed_clusters]
    unknown = [t["cluster"] for t in canonical_targets if t not in gateway and t not in observed]
    if unknown:
        observed_text = ", ".join(sorted(checks.observed_clusters)) or "none configured (DATA_QUALITY_CLUSTERS)"
        raise invalid(
            f"spec.targets: unknown cluster {unknown[0]!r}: this gateway cluster is {checks.gateway_cluster!r} "
            f"(GATEWAY_CLUSTER_ID); clusters without a gateway: {observed_text}"
        )
    if gateway and observed:
        raise invalid(
            "spec.targets: a policy cannot mix targets on a gateway cluster "
            f"({gateway[0]['cluster']!r}) with targets on a cluster without a gateway ({observed[0]['cluster']!r})"
        )
    unique: list[dict[str, str]] = []
    for t in canonical_targets:
        if t not in unique:
            unique.append(t)
    out["targets"] = unique

    actions = spec.get("actions") or {}
    if not isinstance(actions, Mapping):
        raise invalid("spec.actions must be an object {block: {enabled}, mark: {enabled}}")
    _unknown(actions, ("block", "mark", "report", "shadow"), "spec.actions")
    block, mark, report = _flag(actions, "block", False), _flag(actions, "mark", False), _flag(actions, "report", True)
    shadow = _flag(actions, "shadow", False)
    if observed and (block or mark or shadow):
        action = "block" if block else "mark" if mark else "shadow"
        raise invalid(
            f"spec.actions.{action}: actions need a gateway; cluster {observed[0]['cluster']!r} has none, so this "
            "policy can only observe (counts and history). Disable block, mark and shadow."
        )
    out["actions"] = {"block": {"enabled": block}, "mark": {"enabled": mark}, "report": {"enabled": report}}
    if shadow:  # our extension: written only when on, so policies without it keep their canonical form
        out["actions"]["shadow"] = {"enabled": True}
    return envelope(kind, meta, out)


# -- Alert --------------------------------------------------------------------------------------


def _positive_int(spec: Mapping[str, Any], field: str) -> int:
    value = spec.get(field)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise invalid(f"spec.{field} is required: a positive integer, got {value!r}")
    return value


def _destination(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise invalid("spec.destination must be an object {type: Webhook, url} or {type: AuditLog}")
    raw = value.get("type")
    kind = _DESTINATIONS.get(str(raw).strip().lower()) if isinstance(raw, str) else None
    if kind is None:
        raise invalid(f"spec.destination.type must be Webhook or AuditLog, got {raw!r}")
    if kind == "AuditLog":
        _unknown(value, ("type",), "spec.destination")
        return {"type": kind}
    _unknown(value, ("type", "url", "headers"), "spec.destination")
    url = value.get("url")
    if not isinstance(url, str) or not re.match(r"^https?://[^/\s]+", url):
        raise invalid(f"spec.destination.url must be an http(s) URL, got {url!r}")
    out: dict[str, Any] = {"type": kind, "url": url}
    headers = value.get("headers")
    if headers is not None:
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise invalid("spec.destination.headers must be a map of strings")
        out["headers"] = dict(headers)
    return out


def canonical_alert(manifest: Any, kind: ResourceKind, state: StateView) -> Manifest:
    """An Alert of type DataQualityPolicyAlert on an existing policy."""
    metadata, spec = check_envelope(manifest, kind)
    meta = _metadata(metadata, ("name", "group", "user", "labels", "annotations"))
    _unknown(
        spec, ("type", "policyName", "triggerAfter", "withinInSeconds", "destination", "displayName", "description")
    )
    if spec.get("type") != ALERT_TYPE:
        raise invalid(
            f"spec.type must be {ALERT_TYPE} (the only alert type this gateway knows), got {spec.get('type')!r}"
        )
    policy = spec.get("policyName")
    if not isinstance(policy, str) or not policy:
        raise invalid("spec.policyName is required: the metadata.name of a DataQualityPolicy")
    if policy not in {p["metadata"]["name"] for p in state.resources(POLICY)}:
        raise invalid(f"spec.policyName: unknown policy {policy!r}")
    out: dict[str, Any] = {
        "type": ALERT_TYPE,
        "policyName": policy,
        "triggerAfter": _positive_int(spec, "triggerAfter"),
        "withinInSeconds": _positive_int(spec, "withinInSeconds"),
    }
    for field in ("displayName", "description"):
        text = _text(spec, field, required=False)
        if text is not None:
            out[field] = text
    if spec.get("destination") is not None:
        out["destination"] = _destination(spec["destination"])
    return envelope(kind, meta, out)


# -- kinds --------------------------------------------------------------------------------------

Applier = Callable[[str, Sequence[Manifest], StateView], Mapping[Key, Status] | None]


def resource_kinds(checks: Callable[[], Checks], apply: Applier) -> list[ResourceKind]:
    """The three kinds; ``apply(kind_name, resources, state)`` installs them on this node."""

    def validate_rule(manifest: Manifest, state: StateView) -> Manifest:
        return canonical_rule(manifest, rule_kind)

    def validate_policy(manifest: Manifest, state: StateView) -> Manifest:
        return canonical_policy(manifest, policy_kind, state, checks())

    def validate_alert(manifest: Manifest, state: StateView) -> Manifest:
        return canonical_alert(manifest, alert_kind, state)

    rule_kind = ResourceKind(
        kind=RULE,
        path="data-quality-rule",
        validate=validate_rule,
        apply=lambda resources, state: apply(RULE, resources, state),
        description="A data quality rule: a CEL expression or a JSON schema over a record's key, value and headers.",
        api_versions=("v1",),
        columns=(("NAME", "metadata.name"), ("TYPE", "spec.type"), ("DISPLAY NAME", "spec.displayName")),
        aliases=("dataqualityrules", "dq-rule", "dqr"),
        spec_schema=RULE_SCHEMA,
        has_status=False,
        plugin="data-quality",
    )
    policy_kind = ResourceKind(
        kind=POLICY,
        path="data-quality-policy",
        validate=validate_policy,
        apply=lambda resources, state: apply(POLICY, resources, state),
        description="A data quality policy: rules applied to target topics, with optional block and mark actions.",
        api_versions=("v1",),
        columns=(
            ("NAME", "metadata.name"),
            ("GROUP", "metadata.group"),
            ("RULES", "spec.rules"),
            ("BLOCK", "spec.actions.block.enabled"),
            ("MARK", "spec.actions.mark.enabled"),
            ("STATUS", "status.status"),
        ),
        aliases=("dataqualitypolicies", "dq-policy", "dqp"),
        spec_schema=POLICY_SCHEMA,
        has_status=True,
        plugin="data-quality",
        list_filters={"group": "metadata.group"},
    )
    alert_kind = ResourceKind(
        kind=ALERT,
        path="alert",
        validate=validate_alert,
        apply=lambda resources, state: apply(ALERT, resources, state),
        description="An alert: fires when a data quality policy has triggerAfter violations within withinInSeconds.",
        api_versions=("v3",),
        columns=(
            ("NAME", "metadata.name"),
            ("TYPE", "spec.type"),
            ("POLICY", "spec.policyName"),
            ("TRIGGER AFTER", "spec.triggerAfter"),
            ("WITHIN (S)", "spec.withinInSeconds"),
        ),
        aliases=("alerts",),
        spec_schema=ALERT_SCHEMA,
        has_status=False,
        plugin="data-quality",
        list_filters={"policyName": "spec.policyName", "group": "metadata.group"},
    )
    return [rule_kind, policy_kind, alert_kind]


RULE_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "required": ["type", "displayName"],
    "additionalProperties": False,
    "properties": {
        "type": {"enum": [CEL, JSON_SCHEMA]},
        "displayName": {"type": "string"},
        "description": {"type": "string"},
        "celExpression": {"type": "string", "description": "CEL over key, value and headers (type Cel)"},
        "schema": {"type": ["object", "boolean"], "description": "a JSON schema (type JsonSchema)"},
        "message": {"type": "string", "description": "violation text; default '<name> did not pass'"},
    },
}

POLICY_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "required": ["displayName", "rules", "targets"],
    "additionalProperties": False,
    "properties": {
        "displayName": {"type": "string"},
        "description": {"type": "string"},
        "rules": {"type": "array", "minItems": 1, "items": {"type": "string"}},
        "targets": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["cluster", "topic"],
                "properties": {
                    "cluster": {"type": "string"},
                    "topic": {"type": "string", "description": "a topic, or a prefix written <prefix>*"},
                    "patternType": {"enum": [LITERAL, PREFIXED]},
                },
            },
        },
        "actions": {
            "type": "object",
            "properties": {
                name: {"type": "object", "properties": {"enabled": {"type": "boolean"}}}
                for name in ("block", "mark", "report", "shadow")
            },
        },
    },
}

ALERT_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "required": ["type", "policyName", "triggerAfter", "withinInSeconds"],
    "additionalProperties": False,
    "properties": {
        "type": {"enum": [ALERT_TYPE]},
        "policyName": {"type": "string"},
        "triggerAfter": {"type": "integer", "minimum": 1},
        "withinInSeconds": {"type": "integer", "minimum": 1},
        "destination": {
            "type": "object",
            "properties": {
                "type": {"enum": ["Webhook", "AuditLog"]},
                "url": {"type": "string"},
                "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "displayName": {"type": "string"},
        "description": {"type": "string"},
    },
}
