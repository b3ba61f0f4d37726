"""The console's forms and the manifests they stand for, both ways.

A page posts plain fields; these functions turn them into the manifest the admin API would take (the
store validates it, so the console never checks a field the API does not), and turn a stored manifest
back into fields to edit. What a form does not show (labels, annotations, a policy's actions when its
rules are edited) is carried over from the stored manifest, so an edit in the console loses nothing.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

import orjson

from kanal.api import Manifest
from kanal_dataquality.resources import ALERT, POLICY, PREFIXED, RULE
from kanal_dataquality.rules import CEL, JSON_SCHEMA

__all__ = [
    "BLOCK_WORD",
    "RULE_PREFIX",
    "UNBLOCK_WORD",
    "UNITS",
    "alert_fields",
    "alert_manifest",
    "block_refusal",
    "draft_fields",
    "draft_policy_fields",
    "draft_rule",
    "policy_fields",
    "policy_manifest",
    "rule_fields",
    "rule_manifest",
    "sample_body",
    "slug",
    "with_action",
]

#: What an admin types to enable Block, and to disable it.
BLOCK_WORD = "BLOCK"
UNBLOCK_WORD = "UNBLOCK"
#: A policy form's checkbox of rule ``<name>`` is the field ``rule:<name>``.
RULE_PREFIX = "rule:"
#: The units an alert's window is given in (the spec's "within Y minutes, hours or days").
UNITS: Mapping[str, int] = {"seconds": 1, "minutes": 60, "hours": 3600, "days": 86400}

_NOT_NAME = re.compile(r"[^a-z0-9._-]+")


def _text(form: Mapping[str, str], name: str) -> str:
    return (form.get(name) or "").strip()


def slug(text: str) -> str:
    """A technical id from a display name ("Positive amount" -> "positive-amount"), as the spec's UI
    fills it in when the name is left empty."""
    return _NOT_NAME.sub("-", text.lower()).strip("-.")[:249]


def _metadata(current: Manifest | None, name: str) -> dict[str, Any]:
    metadata = dict(current["metadata"]) if current is not None else {}
    metadata["name"] = name
    return metadata


# -- rules ------------------------------------------------------------------------------------------


def _rule_spec(form: Mapping[str, str]) -> dict[str, Any]:
    rule_type = _text(form, "type") or CEL
    spec: dict[str, Any] = {"type": rule_type, "displayName": _text(form, "displayName")}
    for field in ("description", "message"):
        if _text(form, field):
            spec[field] = _text(form, field)
    expression = form.get("expression") or ""
    spec["schema" if rule_type == JSON_SCHEMA else "celExpression"] = expression
    return spec


def rule_manifest(form: Mapping[str, str], current: Manifest | None, name: str | None = None) -> Manifest:
    """The DataQualityRule a rule form describes (``name``: the rule being edited; else the form's
    technical id, or one made from the display name)."""
    name = name or _text(form, "name") or slug(_text(form, "displayName"))
    return {"apiVersion": "v1", "kind": RULE, "metadata": _metadata(current, name), "spec": _rule_spec(form)}


def draft_rule(form: Mapping[str, str], name: str | None = None) -> dict[str, Any]:
    """The draft of a rule form as an inline rule for the rule test (not stored); ``name``: the rule
    being edited."""
    name = name or _text(form, "name") or slug(_text(form, "displayName")) or "draft"
    return {"metadata": {"name": name}, "spec": _rule_spec(form)}


def rule_fields(manifest: Manifest | None) -> dict[str, str]:
    """The fields of a rule form for a stored rule (empty ones for a new rule)."""
    if manifest is None:
        return {"name": "", "displayName": "", "description": "", "type": CEL, "expression": "", "message": ""}
    spec = manifest["spec"]
    schema = spec.get("schema")
    expression = spec.get("celExpression") or ""
    if spec.get("type") == JSON_SCHEMA:
        expression = orjson.dumps(schema, option=orjson.OPT_INDENT_2).decode()
    return {
        "name": manifest["metadata"]["name"],
        "displayName": spec.get("displayName") or "",
        "description": spec.get("description") or "",
        "type": spec.get("type") or CEL,
        "expression": expression,
        "message": spec.get("message") or "",
    }


def sample_body(form: Mapping[str, str]) -> dict[str, Any]:
    """The rule test's sample (``key``, ``value``, ``headers``) from a test form: empty fields are left
    out; headers are a JSON object or lines of ``name: value``. Raises ValueError for headers that are
    neither."""
    body: dict[str, Any] = {}
    for field in ("key", "value"):
        text = form.get(field) or ""
        if text.strip():
            body[field] = text
    headers_text = (form.get("headers") or "").strip()
    headers: dict[str, str] = {}
    if headers_text.startswith("{"):
        try:
            parsed = orjson.loads(headers_text)
        except orjson.JSONDecodeError:
            raise ValueError("headers: not a JSON object; write one header per line as name: value") from None
        if not isinstance(parsed, dict):
            raise ValueError("headers: a JSON object of name to text")
        headers = {str(k): v if isinstance(v, str) else orjson.dumps(v).decode() for k, v in parsed.items()}
    else:
        for number, line in enumerate(headers_text.splitlines(), 1):
            if not line.strip():
                continue
            name, colon, value = line.partition(":")
            if not colon or not name.strip():
                raise ValueError(f"headers, line {number}: write name: value (got {line.strip()!r})")
            headers[name.strip()] = value.strip()
    if headers:
        body["headers"] = headers
    return body


# -- policies ---------------------------------------------------------------------------------------


def _targets(text: str, cluster: str) -> list[dict[str, str]]:
    """Targets from lines of ``topic``, ``prefix*`` or ``cluster:topic`` (topic names hold no colon)."""
    targets = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        on, colon, topic = line.rpartition(":")
        targets.append({"cluster": on.strip() if colon else cluster, "topic": topic.strip()})
    return targets


def _targets_text(targets: list[Mapping[str, Any]], cluster: str) -> str:
    lines = []
    for target in targets:
        topic = target["topic"] + ("*" if target.get("patternType") == PREFIXED else "")
        lines.append(topic if target["cluster"] == cluster else f"{target['cluster']}:{topic}")
    return "\n".join(lines)


def policy_manifest(
    form: Mapping[str, str], current: Manifest | None, gateway_cluster: str, name: str | None = None
) -> Manifest:
    """The DataQualityPolicy a policy form describes. A new policy has no action enabled (the spec:
    actions are enabled after creation); an edited one keeps its actions."""
    name = name or _text(form, "name") or slug(_text(form, "displayName"))
    metadata = _metadata(current, name)
    if _text(form, "group"):
        metadata["group"] = _text(form, "group")
    else:
        metadata.pop("group", None)
    spec: dict[str, Any] = copy.deepcopy(dict(current["spec"])) if current is not None else {}
    spec["displayName"] = _text(form, "displayName")
    if _text(form, "description"):
        spec["description"] = _text(form, "description")
    else:
        spec.pop("description", None)
    spec["rules"] = [key[len(RULE_PREFIX) :] for key in form if key.startswith(RULE_PREFIX)]
    spec["targets"] = _targets(form.get("targets") or "", gateway_cluster)
    spec.setdefault("actions", {"block": {"enabled": False}, "mark": {"enabled": False}})
    return {"apiVersion": "v1", "kind": POLICY, "metadata": metadata, "spec": spec}


def policy_fields(manifest: Manifest | None, gateway_cluster: str) -> dict[str, Any]:
    """The fields of a policy form for a stored policy (empty ones for a new policy); ``rules`` is the
    list of the rules ticked."""
    if manifest is None:
        return {"name": "", "group": "", "displayName": "", "description": "", "rules": [], "targets": ""}
    spec = manifest["spec"]
    return {
        "name": manifest["metadata"]["name"],
        "group": manifest["metadata"].get("group") or "",
        "displayName": spec.get("displayName") or "",
        "description": spec.get("description") or "",
        "rules": list(spec.get("rules") or []),
        "targets": _targets_text(list(spec.get("targets") or []), gateway_cluster),
    }


def draft_policy_fields(form: Mapping[str, str]) -> dict[str, Any]:
    """The fields as submitted (to show the form again, unchanged, with the error)."""
    return {
        "name": _text(form, "name"),
        "group": _text(form, "group"),
        "displayName": form.get("displayName") or "",
        "description": form.get("description") or "",
        "rules": [key[len(RULE_PREFIX) :] for key in form if key.startswith(RULE_PREFIX)],
        "targets": form.get("targets") or "",
    }


def block_refusal(enabled: bool, enable: bool, typed: str) -> str | None:
    """Why a Block change is refused (None: it may go ahead). Enabling needs the word BLOCK typed,
    disabling UNBLOCK, exactly; a change the policy already has is refused too (a page left open
    while someone else changed it)."""
    if enable == enabled:
        return f"Block is already {'enabled' if enabled else 'disabled'} on this policy: nothing changed."
    word = BLOCK_WORD if enable else UNBLOCK_WORD
    if typed.strip() != word:
        shown = f"you typed {typed.strip()!r}" if typed.strip() else "the field was empty"
        verb = "enable" if enable else "disable"
        return f"Type {word} (in capitals) to {verb} Block; {shown}. Nothing changed."
    return None


def with_action(manifest: Manifest, action: str, enabled: bool) -> Manifest:
    """A copy of a policy with one action (``block`` or ``mark``) switched."""
    changed = copy.deepcopy(dict(manifest))
    changed.pop("status", None)
    actions = changed["spec"].setdefault("actions", {})
    actions[action] = {"enabled": enabled}
    return changed


# -- alerts -----------------------------------------------------------------------------------------


def alert_manifest(form: Mapping[str, str], current: Manifest | None, name: str | None = None) -> Manifest:
    """The Alert an alert form describes (a DataQualityPolicyAlert; the window given in a unit)."""
    name = name or _text(form, "name")
    metadata = _metadata(current, name)
    if _text(form, "group"):
        metadata["group"] = _text(form, "group")
    else:
        metadata.pop("group", None)
    spec: dict[str, Any] = {
        "type": "DataQualityPolicyAlert",
        "policyName": _text(form, "policyName"),
        "triggerAfter": _text(form, "triggerAfter"),
    }
    within = _text(form, "within")
    unit = UNITS.get(_text(form, "unit"), 1)
    spec["withinInSeconds"] = str(int(within) * unit) if within.isdigit() else within
    for field in ("displayName", "description"):
        if _text(form, field):
            spec[field] = _text(form, field)
    destination = _text(form, "destination")
    if destination == "Webhook":
        spec["destination"] = {"type": "Webhook", "url": _text(form, "url")}
        headers = ((current or {}).get("spec") or {}).get("destination", {}).get("headers")
        if headers:  # not shown (they may hold a token): kept as stored
            spec["destination"]["headers"] = headers
    elif destination == "AuditLog":
        spec["destination"] = {"type": "AuditLog"}
    return {"apiVersion": "v3", "kind": ALERT, "metadata": metadata, "spec": spec}


def alert_fields(manifest: Manifest | None, policy: str = "", group: str = "") -> dict[str, str]:
    """The fields of an alert form for a stored alert (a new one on ``policy``, owned by ``group``)."""
    if manifest is None:
        return {
            "name": "",
            "group": group,
            "policyName": policy,
            "triggerAfter": "10",
            "within": "1",
            "unit": "minutes",
            "destination": "AuditLog",
            "url": "",
            "displayName": "",
            "description": "",
        }
    spec = manifest["spec"]
    seconds = int(spec.get("withinInSeconds") or 0)
    unit = next((u for u in ("days", "hours", "minutes") if seconds and seconds % UNITS[u] == 0), "seconds")
    destination = spec.get("destination") or {}
    return {
        "name": manifest["metadata"]["name"],
        "group": manifest["metadata"].get("group") or "",
        "policyName": spec.get("policyName") or "",
        "triggerAfter": str(spec.get("triggerAfter") or ""),
        "within": str(seconds // UNITS[unit]),
        "unit": unit,
        "destination": destination.get("type") or "",
        "url": destination.get("url") or "",
        "displayName": spec.get("displayName") or "",
        "description": spec.get("description") or "",
    }


def draft_fields(form: Mapping[str, str], names: tuple[str, ...]) -> dict[str, str]:
    """A form's fields as submitted, to show it again with the error."""
    return {name: form.get(name) or "" for name in names}
