"""Admin API routes of the data-quality plugin (``kanal_admin_routes``), under ``/gateway/v2/data-quality``.

* ``POST /test-rule``: a rule (``{"rule": "<name>"}`` or an inline rule) on a sample key, value and
  headers; answers ``{"result": "passed" | "failed" | "evaluationError", "message", "reason"}``.
* ``GET /metrics?range=30m|1h|1d|7d``: evaluated and violation counts of every policy over the range
  (``wouldHaveBlocked`` for policies in shadow mode).
* ``GET /policies/<name>/metrics?range=...``: one policy's counts and its violations graph; for a policy
  in shadow mode, what block would have rejected (``shadow``).
* ``GET /policies/<name>/violations?range=...&limit=100``: its violation history, newest first.
* ``GET /alerts``: every alert, whether it is firing.
* ``GET /observer``: the partitions of clusters without a gateway this node observes, and their offsets
  (``{}`` on a node that does not observe: only the fleet's leader does; the ``Kanal-Observer-Node``
  header names the node that does);
* ``GET /observer/status``: whether this node observes, which node does, and the last checkpoints.
* ``PUT /<kind>`` and ``DELETE /<kind>/<name>`` (kind: ``data-quality-rule``, ``data-quality-policy``,
  ``alert``): the same as the generic resource routes, open to members of a group with the
  ``ManageDataQuality`` permission (see :mod:`kanal_dataquality.permissions`), not only to admins.

Backtests have routes of their own (:mod:`kanal_dataquality.backtest_routes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from quart import Response, request

from kanal.api import AdminRoutes, Fleet, ResourceError, invalid
from kanal_dataquality.history import RANGES
from kanal_dataquality.permissions import authorize
from kanal_dataquality.resources import ALERT, POLICY, RULE
from kanal_dataquality.rules import RuleCompileError
from kanal_dataquality.runtime import SHADOW_STATUS, Runtime
from kanal_dataquality.testrule import ERROR, SampleError, compile_for_test, run_test

__all__ = ["add_routes"]

PREFIX = "/gateway/v2/data-quality"


def json_response(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """A JSON answer of the plugin's routes (indented, as the core's admin API answers)."""
    response = Response(orjson.dumps(body, option=orjson.OPT_INDENT_2), status, content_type="application/json")
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


async def json_body() -> Any:
    """The request's JSON (or YAML) body; 400 when it is missing or unreadable."""
    data = await request.get_data()
    if not data or not data.strip():
        raise invalid("a JSON body is required")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            import yaml

            return yaml.safe_load(data)
        except Exception:
            raise invalid("the body is not valid JSON") from None


def _range() -> tuple[str, int, int]:
    name = request.args.get("range", "1h")
    if name not in RANGES:
        raise invalid(f"range must be one of {', '.join(RANGES)}, got {name!r}")
    seconds, bucket = RANGES[name]
    return name, seconds, bucket


#: The header of ``GET /observer`` that names the node observing the clusters without a gateway.
OBSERVER_HEADER = "Kanal-Observer-Node"


def add_routes(admin: AdminRoutes, runtime: Runtime, fleet: Fleet) -> None:
    store = admin.store

    def policy_names() -> list[str]:
        return [m["metadata"]["name"] for m in store.resources(POLICY)]

    def require_policy(name: str) -> None:
        if name not in policy_names():
            raise ResourceError(404, "Not found", f"DataQualityPolicy {name!r} does not exist")

    @admin.route(f"{PREFIX}/test-rule", methods=["POST"], read_only=True)
    async def dq_test_rule() -> Response:
        """Test a data quality rule (by name or inline) on a sample key, value and headers."""
        body = await json_body()
        if not isinstance(body, Mapping):
            raise invalid("the body must be a JSON object {rule, key, value, headers}")
        spec = body.get("rule")
        if isinstance(spec, str):
            rule = runtime.describe_rules().get(spec)
            if rule is None:
                known = {m["metadata"]["name"] for m in store.resources(RULE)}
                if spec not in known:
                    raise ResourceError(404, "Not found", f"DataQualityRule {spec!r} does not exist")
                rule = runtime.compile_rules([m for m in store.resources(RULE) if m["metadata"]["name"] == spec]).get(
                    spec
                )
                if rule is None:
                    return json_response(
                        {"result": ERROR, "message": f"rule {spec!r} does not compile on this gateway"}
                    )
        elif isinstance(spec, Mapping):
            try:
                rule = compile_for_test(spec)
            except RuleCompileError as exc:
                return json_response({"result": ERROR, "message": str(exc)})
        else:
            raise invalid("rule is required: a rule name, or an inline rule {type, celExpression | schema}")
        try:
            answer = await run_test(rule, body, runtime.registry)
        except SampleError as exc:
            raise invalid(str(exc)) from None
        return json_response({"rule": rule.name, **{k: v for k, v in answer.items() if v is not None}})

    def shadow_enabled(name: str) -> bool:
        manifest = store.get(POLICY, (name,)) or {}
        return bool(((manifest.get("spec") or {}).get("actions") or {}).get("shadow", {}).get("enabled"))

    def shadow_of(name: str, seconds: int) -> dict[str, Any] | None:
        """What the policy in shadow mode would have blocked over the range; None for a policy that is
        not in shadow mode and never was within it."""
        enabled = shadow_enabled(name)
        shadow = runtime.history.shadow(name, seconds)
        if not enabled and not shadow.batches:
            return None
        return {
            "enabled": enabled,
            "wouldHaveBlocked": shadow.batches,
            "wouldHaveBlockedRecords": shadow.records,
            "violationsByRule": dict(sorted(shadow.rules.items())),
        }

    @admin.route(f"{PREFIX}/metrics", methods=["GET"])
    async def dq_metrics() -> Response:
        """Evaluated and violation counts of every data quality policy over ?range=30m|1h|1d|7d (and, for
        a policy in shadow mode, the batches block would have rejected)."""
        name, seconds, bucket = _range()
        out = []
        for policy in policy_names():
            counts = runtime.history.counts(policy, seconds, bucket)
            item: dict[str, Any] = {
                "policy": policy,
                "range": name,
                "evaluated": counts["evaluated"],
                "violations": counts["violations"],
            }
            shadow = shadow_of(policy, seconds)
            if shadow is not None:
                item["wouldHaveBlocked"] = shadow["wouldHaveBlocked"]
            out.append(item)
        return json_response(out)

    @admin.route(f"{PREFIX}/policies/<name>/metrics", methods=["GET"])
    async def dq_policy_metrics(name: str) -> Response:
        """One policy's evaluated and violation counts over ?range=, and its violations graph."""
        require_policy(name)
        range_name, seconds, bucket = _range()
        counts = runtime.history.counts(name, seconds, bucket)
        status = runtime.statuses.get(name)
        answer = {
            "policy": name,
            "range": range_name,
            "status": status.as_dict() if status else {"status": "Pending"},
            **counts,
        }
        shadow = shadow_of(name, seconds)
        if shadow is not None:
            answer["shadow"] = shadow
            if shadow["enabled"]:  # the status says it too: "would have blocked N"
                text = (
                    f"shadow mode: would have blocked {shadow['wouldHaveBlocked']} batches "
                    f"({shadow['wouldHaveBlockedRecords']} records) in {range_name}"
                )
                current = answer["status"].get("message")
                keep = current if current and current != SHADOW_STATUS else None
                answer["status"] = {**answer["status"], "message": f"{keep}; {text}" if keep else text}
        return json_response(answer)

    @admin.route(f"{PREFIX}/policies/<name>/violations", methods=["GET"])
    async def dq_policy_violations(name: str) -> Response:
        """One policy's violation history over ?range= (newest first, at most ?limit=, default 100)."""
        require_policy(name)
        _, seconds, _ = _range()
        try:
            limit = int(request.args.get("limit", "100"))
        except ValueError:
            raise invalid("limit must be an integer") from None
        if not 1 <= limit <= 10_000:
            raise invalid("limit must be between 1 and 10000")
        return json_response(runtime.history.violations(name, seconds, limit))

    @admin.route(f"{PREFIX}/alerts", methods=["GET"])
    async def dq_alerts() -> Response:
        """Every data quality alert and whether it is firing."""
        return json_response(runtime.alerts.describe())

    def observer_enabled() -> bool:
        return bool(runtime.settings.clusters) and runtime.settings.observer

    @admin.route(f"{PREFIX}/observer", methods=["GET"])
    async def dq_observer() -> Response:
        """Partitions of clusters without a gateway that this node observes, with the next offset to read
        (none on a node that does not lead its fleet; the Kanal-Observer-Node header names the one that
        does)."""
        response = json_response(runtime.observed if runtime.observing else {})
        leader = fleet.leader
        if observer_enabled() and leader is not None:
            response.headers[OBSERVER_HEADER] = leader.node_id
        return response

    @admin.route(f"{PREFIX}/observer/status", methods=["GET"])
    async def dq_observer_status() -> Response:
        """Whether this node observes the clusters without a gateway, which node of the fleet does (its
        leader), and the last checkpoint of each cluster."""
        leader = fleet.leader
        checkpoints = runtime.history.checkpoints.last
        return json_response(
            {
                "enabled": observer_enabled(),
                "observing": runtime.observing,
                "nodeId": fleet.node_id,
                "observer": None
                if leader is None or not observer_enabled()
                else {"nodeId": leader.node_id, "host": leader.host, "httpPort": leader.http_port},
                "clusters": runtime.observed if runtime.observing else {},
                "checkpoints": {
                    name: {
                        "nodeId": c.fleet_node,
                        "time": c.time,
                        "final": c.final,
                        "positions": {f"{t}-{p}": o for (t, p), o in sorted(c.positions.items())},
                    }
                    for name, c in sorted(checkpoints.items())
                },
            }
        )

    paths = {"data-quality-rule": RULE, "data-quality-policy": POLICY, "alert": ALERT}

    @admin.route(f"{PREFIX}/<path>", methods=["PUT"], read_only=True)
    async def dq_put(path: str) -> Response:
        """Create or update a rule, policy or alert: admins, or members of a group with ManageDataQuality."""
        kind = admin.kinds.get(paths.get(path, ""))
        if kind is None:
            raise ResourceError(404, "Not found", f"no data quality resource kind at {path!r}")
        body = await json_body()
        current = None
        if isinstance(body, Mapping) and isinstance(body.get("metadata"), Mapping):
            current = store.get(kind.kind, kind.key_of(body["metadata"]))
        authorize(admin.current_user(), runtime.settings.groups, kind.kind, body, current, store)
        dry = request.args.get("dryMode", "false").lower() in ("true", "1", "yes")
        change = await store.put(kind, body, dry_run=dry)
        if not dry and change.result != "NOT_CHANGED":
            admin.audit("UPSERT", kind=kind.kind, resourceName=change.key[0], result=change.result)
        return json_response({"resource": change.resource, "upsertResult": change.result})

    @admin.route(f"{PREFIX}/<path>/<name>", methods=["DELETE"], read_only=True)
    async def dq_delete(path: str, name: str) -> Response:
        """Delete a rule, policy or alert: admins, or members of a group with ManageDataQuality."""
        kind = admin.kinds.get(paths.get(path, ""))
        if kind is None:
            raise ResourceError(404, "Not found", f"no data quality resource kind at {path!r}")
        current = store.get(kind.kind, (name,))
        if current is None:
            raise ResourceError(404, "Not found", f"{kind.kind} {name!r} does not exist")
        authorize(admin.current_user(), runtime.settings.groups, kind.kind, None, current, store)
        await store.delete(kind, (name,))
        admin.audit("DELETE", kind=kind.kind, resourceName=name, result="DELETED")
        return Response(b"", 204)
