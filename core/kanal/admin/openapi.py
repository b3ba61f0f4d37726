"""The OpenAPI 3.1 document of the admin API, built from the app's routes and the resource kinds.

Every route is listed (plugin routes included, summarised by their view's docstring); the resource
kinds contribute their manifest schemas, so the document always matches the plugins installed.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

from quart import Quart

from kanal import __version__
from kanal.admin.fleet import FLEET_SCHEMA
from kanal.admin.metrics import route_template
from kanal.api.resources import KindRegistry, ResourceKind

_ERROR = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "msg": {"type": "string"}, "cause": {"type": ["string", "null"]}},
}


_AUDIT_EVENT = {
    "type": "object",
    "description": "An audit event (CloudEvents-like), as written to the audit log topic",
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "source": {"type": "string", "description": "the gateway node: kanal://<advertised host>:<first port>"},
        "type": {"type": "string", "description": "AUTHENTICATION, ADMIN_API_CALL, or a plugin's (DATA_QUALITY...)"},
        "authenticationPrincipal": {"type": "string", "description": "the virtual cluster, or passthrough"},
        "userName": {"type": ["string", "null"]},
        "connection": {
            "type": "object",
            "properties": {
                "localAddress": {"type": ["string", "null"], "description": "host:port"},
                "remoteAddress": {"type": ["string", "null"], "description": "host:port"},
            },
        },
        "specVersion": {"type": "string", "const": "0.1.0"},
        "time": {"type": "string", "format": "date-time"},
        "eventData": {"description": "SUCCESS or a reason (AUTHENTICATION), the change (ADMIN_API_CALL)..."},
    },
}

_TIME = {"type": "string", "description": "ISO-8601 (UTC without an offset) or epoch milliseconds"}
_AUDIT_PARAMETERS = [
    {"name": "type", "in": "query", "schema": {"type": "string"}, "description": "event types, comma-separated"},
    {"name": "principal", "in": "query", "schema": {"type": "string"}, "description": "the userName"},
    {"name": "from", "in": "query", "schema": _TIME, "description": "events at or after this time"},
    {"name": "to", "in": "query", "schema": _TIME, "description": "events at or before this time"},
    {
        "name": "limit",
        "in": "query",
        "schema": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 100},
        "description": "how many of the newest events",
    },
]


def _manifest_schema(kind: ResourceKind) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["kind", "apiVersion", "metadata", "spec"],
        "properties": {
            "apiVersion": {"type": "string", "enum": list(kind.api_versions)},
            "kind": {"type": "string", "const": kind.kind},
            "metadata": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string"}},
                "description": "name" + (", " + ", ".join(kind.key_fields) if kind.key_fields else "") + " identify it",
            },
            "spec": dict(kind.spec_schema) if kind.spec_schema else {"type": "object"},
            "status": {
                "type": "object",
                "readOnly": True,
                "properties": {
                    "status": {"type": "string", "enum": ["Pending", "Ready", "Failed"]},
                    "message": {"type": "string"},
                },
            },
        },
        "description": kind.description,
    }


def _kind_of(path: str, kinds: KindRegistry) -> ResourceKind | None:
    parts = path.split("/")
    return kinds.by_path(parts[3]) if len(parts) > 3 and path.startswith("/gateway/v2/") else None


def openapi_document(
    app: Quart, kinds: KindRegistry, read_only: Iterable[str], public: Iterable[str]
) -> dict[str, Any]:
    read_only, public = set(read_only), set(public)
    paths: dict[str, dict[str, Any]] = {}
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        path = route_template(rule.rule)
        view = app.view_functions[rule.endpoint]
        doc = inspect.getdoc(view) or ""
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            operation: dict[str, Any] = {
                "operationId": rule.endpoint,
                "summary": doc.split("\n", 1)[0],
                "responses": {
                    "200": {"description": "OK"},
                    "400": {"description": "invalid request", "content": {"application/json": {"schema": _ERROR}}},
                },
            }
            if doc.count("\n"):
                operation["description"] = doc
            if "{name}" in path:
                operation["parameters"] = [
                    {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
                ]
                operation["responses"]["404"] = {"description": "not found"}
            if rule.endpoint in public:
                operation["security"] = []
            else:
                operation["responses"]["401"] = {"description": "missing or wrong credentials"}
                if rule.endpoint not in read_only:
                    operation["responses"]["403"] = {"description": "the user is read-only"}
            kind = _kind_of(path, kinds)
            if path == "/gateway/v2/fleet" and method == "GET":
                operation["responses"]["200"] = {
                    "description": "this node's membership group and its members",
                    "content": {"application/json": {"schema": FLEET_SCHEMA}},
                }
                operation["responses"]["404"] = {"description": "the node joins no membership group"}
            elif path == "/gateway/v2/audit" and method == "GET":
                operation["parameters"] = _AUDIT_PARAMETERS
                operation["responses"]["200"] = {
                    "description": "the events, newest first",
                    "content": {"application/json": {"schema": {"type": "array", "items": _AUDIT_EVENT}}},
                }
                operation["responses"]["404"] = {"description": "the audit log is off"}
            elif kind is not None and path == f"/gateway/v2/{kind.path}":
                ref = {"$ref": f"#/components/schemas/{kind.kind}"}
                if method == "PUT":
                    operation["parameters"] = [
                        {"name": "dryMode", "in": "query", "schema": {"type": "boolean", "default": False}}
                    ]
                    operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref}}}
                    operation["responses"]["200"] = {
                        "description": "the stored resource and what the upsert did",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {
                                        "resource": ref,
                                        "upsertResult": {"enum": ["CREATED", "UPDATED", "NOT_CHANGED"]},
                                    },
                                }
                            }
                        },
                    }
                    operation["responses"]["409"] = {"description": "conflict"}
                else:
                    operation["responses"]["200"] = {
                        "description": "the resources",
                        "content": {"application/json": {"schema": {"type": "array", "items": ref}}},
                    }
            elif kind is not None and path == f"/gateway/v2/{kind.path}/{{name}}":
                if method == "DELETE":
                    operation["responses"]["204"] = {"description": "deleted"}
                    del operation["responses"]["200"]
                    if kind.key_fields:
                        operation["requestBody"] = {
                            "required": False,
                            "content": {"application/json": {"schema": {"type": "object"}}},
                            "description": "the other key fields: " + ", ".join(kind.key_fields),
                        }
                else:
                    ref = {"$ref": f"#/components/schemas/{kind.kind}"}
                    operation["responses"]["200"] = {
                        "description": "the resource",
                        "content": {"application/json": {"schema": ref}},
                    }
            paths.setdefault(path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "Kanal admin API", "version": __version__},
        "components": {
            "securitySchemes": {"basic": {"type": "http", "scheme": "basic"}},
            "schemas": {k.kind: _manifest_schema(k) for k in kinds},
        },
        "security": [{"basic": []}],
        "paths": dict(sorted(paths.items())),
    }
