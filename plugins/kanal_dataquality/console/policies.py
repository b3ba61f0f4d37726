"""The policies pages: the list, a policy's page (its counts, chart and history, live), the policy
form, and the actions (Block behind a typed BLOCK / UNBLOCK, Mark with one button). An admin starts a
backtest of a policy from its page, and of a draft from the policy form (the job's own pages are
:mod:`kanal_dataquality.console.backtests`).

The figures are the admin API's (``/gateway/v2/data-quality/policies/<name>/metrics`` and
``/violations``): the same :class:`~kanal_dataquality.history.History` queries over the same ranges,
and the status the runtime reports for each policy (Pending until this node has applied it).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from quart import request

from kanal.api import ConsolePages, Manifest, ResourceError, ResourceKind, Status
from kanal_dataquality.backtest import DEFAULT_LATEST
from kanal_dataquality.backtest_service import Backtests
from kanal_dataquality.console.backtests import backtest_fields, first_topic, start_from_form
from kanal_dataquality.console.forms import (
    BLOCK_WORD,
    RULE_PREFIX,
    UNBLOCK_WORD,
    block_refusal,
    draft_policy_fields,
    policy_fields,
    policy_manifest,
    rule_fields,
    with_action,
)
from kanal_dataquality.history import RANGES
from kanal_dataquality.resources import ALERT, POLICY, RULE
from kanal_dataquality.rules import ENFORCE_AVRO
from kanal_dataquality.runtime import Runtime

__all__ = ["RANGE_LABELS", "add_policy_pages"]

#: The ranges of the counts and the chart, as the selector names them (the API's RANGES keys).
RANGE_LABELS: Mapping[str, str] = {"30m": "30 min", "1h": "1 hour", "1d": "1 day", "7d": "7 days"}
DEFAULT_RANGE = "1h"
#: Violations the history table shows (newest first).
HISTORY_ROWS = 50
_PENDING = Status("Pending")
_RULE_COLUMNS = ("type", "displayName", "description", "expression", "message")


def _range() -> str:
    name = request.args.get("range", DEFAULT_RANGE)
    return name if name in RANGES and name in RANGE_LABELS else DEFAULT_RANGE


def _clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _tick(iso: str, range_name: str) -> str:
    """A bar's label: the time of day for short ranges, the day too for seven days."""
    at = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return at.strftime("%m-%d %H:%M" if range_name == "7d" else "%H:%M")


def _entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A history entry as the table shows it (entries of other nodes' versions may lack fields)."""
    details = entry.get("details") or []
    return {
        "when": _clock(int(entry.get("time") or 0)),
        "cluster": entry.get("cluster") or "",
        "topic": entry.get("topic") or "",
        "partition": entry.get("partition", ""),
        "rules": [str(r) for r in entry.get("rules") or []],
        "message": entry.get("message") or "",
        "reasons": [(d.get("rule"), d["reason"]) for d in details if isinstance(d, Mapping) and d.get("reason")],
        "action": entry.get("action") or "",
        "clientId": entry.get("clientId") or "",
    }


def actions_of(manifest: Manifest) -> dict[str, bool]:
    """A policy's actions, on or off (report on unless disabled, as the resource's default)."""
    actions = manifest["spec"].get("actions") or {}
    return {
        name: bool((actions.get(name) or {}).get("enabled", name == "report"))
        for name in ("block", "mark", "report", "shadow")
    }


def add_policy_pages(console: ConsolePages, runtime: Runtime, backtests: Backtests) -> None:
    store = console.store
    history = runtime.history

    def kind() -> ResourceKind:
        found = console.kinds.get(POLICY)
        assert found is not None, "the data-quality plugin registers its kinds before its pages"
        return found

    def status_of(name: str) -> Status:
        return runtime.statuses.get(name) or _PENDING

    def rule_choices() -> list[str]:
        names = sorted(m["metadata"]["name"] for m in store.resources(RULE))
        return [*names, ENFORCE_AVRO] if runtime.registry is not None else names

    def live(name: str, range_name: str) -> dict[str, Any]:
        """What the live region shows: counts, the violations chart and the recent history."""
        seconds, bucket = RANGES[range_name]
        counts = history.counts(name, seconds, bucket)
        graph = counts["graph"]
        shadow = history.shadow(name, seconds)
        manifest = store.get(POLICY, (name,))
        shadow_on = manifest is not None and actions_of(manifest)["shadow"]
        return {
            "name": name,
            "range": range_name,
            "rangeLabel": RANGE_LABELS[range_name],
            "evaluated": counts["evaluated"],
            "violations": counts["violations"],
            "chart": {
                "values": [point["violations"] for point in graph],
                "labels": [_tick(point["time"], range_name) for point in graph],
            },
            "shadow": shadow if shadow_on or shadow.batches else None,
            "history": [_entry(entry) for entry in history.violations(name, seconds, HISTORY_ROWS)],
        }

    def linked_rule(name: str) -> dict[str, Any]:
        """One of a policy's rules as its page lists it (a deleted one is flagged)."""
        manifest = store.get(RULE, (name,))
        if manifest is None:
            built_in = name == ENFORCE_AVRO
            return {"name": name, "stored": False, "builtIn": built_in, "type": ENFORCE_AVRO if built_in else ""}
        fields = rule_fields(manifest)
        return {"name": name, "stored": True, "builtIn": False, **{k: fields[k] for k in _RULE_COLUMNS}}

    def alerts_of(name: str) -> list[dict[str, Any]]:
        states = {a["name"]: a for a in runtime.alerts.describe()}
        return [
            {"manifest": m, "state": states.get(m["metadata"]["name"])}
            for m in sorted(store.resources(ALERT), key=lambda m: str(m["metadata"]["name"]))
            if m["spec"].get("policyName") == name
        ]

    def render_detail(
        name: str,
        manifest: Manifest,
        status: int = 200,
        action_error: str | None = None,
        backtest: Mapping[str, str] | None = None,
        backtest_error: str | None = None,
    ) -> Any:
        range_name = _range()
        rules = [linked_rule(r) for r in manifest["spec"].get("rules") or []]
        return console.render(
            "dataquality/policy.html",
            status,
            title=f"Policy {name}",
            policy=manifest,
            state=status_of(name),
            actions=actions_of(manifest),
            rules=rules,
            alerts=alerts_of(name),
            ranges=RANGE_LABELS,
            live=live(name, range_name),
            action_error=action_error,
            block_word=BLOCK_WORD,
            unblock_word=UNBLOCK_WORD,
            backtest=backtest or backtest_fields(manifest),
            backtest_error=backtest_error,
        )

    def not_found(name: str) -> Any:
        return console.render(
            "console/message.html", 404, title="Not found", message=f"There is no policy named {name!r}."
        )

    def render_form(
        current: Manifest | None,
        fields: Mapping[str, Any],
        status: int = 200,
        error: str | None = None,
        backtest: Mapping[str, str] | None = None,
    ) -> Any:
        name = current["metadata"]["name"] if current is not None else None
        return console.render(
            "dataquality/policy_form.html",
            status,
            title=f"Edit policy {name}" if name else "New policy",
            policy=current,
            fields=fields,
            rule_choices=rule_choices(),
            rule_prefix=RULE_PREFIX,
            gateway_cluster=runtime.gateway_cluster,
            error=error,
            backtest=backtest or {"topic": "", "latest": str(DEFAULT_LATEST)},
        )

    async def backtest_draft(current: Manifest | None, form: Mapping[str, str], manifest: Manifest) -> Any:
        """The policy form's "Backtest this draft": the form's policy, validated as saving it would be
        but not saved, over the latest records of a topic (by default its first target topic)."""
        fields = {**draft_policy_fields(form), **({"name": current["metadata"]["name"]} if current else {})}
        try:
            return await start_from_form(console, backtests, form, manifest, first_topic(manifest))
        except ResourceError as exc:
            shown = {"topic": form.get("topic") or "", "latest": form.get("latest") or ""}
            return render_form(current, fields, exc.status, exc.msg, shown)

    @console.page("data-quality/policies", "Data quality")
    async def dq_policies() -> Any:
        """Every policy with its status, actions and counts over the chosen range."""
        range_name = _range()
        seconds, bucket = RANGES[range_name]
        rows = []
        for manifest in sorted(store.resources(POLICY), key=lambda m: str(m["metadata"]["name"])):
            name = manifest["metadata"]["name"]
            counts = history.counts(name, seconds, bucket)
            rows.append(
                {
                    "name": name,
                    "policy": manifest,
                    "status": status_of(name),
                    "actions": actions_of(manifest),
                    "evaluated": counts["evaluated"],
                    "violations": counts["violations"],
                }
            )
        return console.render(
            "dataquality/policies.html",
            title="Data quality policies",
            rows=rows,
            range=range_name,
            ranges=RANGE_LABELS,
        )

    @console.page("data-quality/policies/<name>")
    async def dq_policy(name: str) -> Any:
        """A policy: description, rules, targets, actions, alerts, and the live counts, chart and history."""
        manifest = store.get(POLICY, (name,))
        if manifest is None:
            return not_found(name)
        return render_detail(name, manifest)

    @console.page("data-quality/policies/<name>/live")
    async def dq_policy_live(name: str) -> Any:
        """The policy page's live region alone (counts, chart, history), refreshed by the page."""
        if store.get(POLICY, (name,)) is None:
            return not_found(name)
        return console.render("dataquality/policy_live.html", title=f"Policy {name}", live=live(name, _range()))

    @console.page("data-quality/new-policy", methods=["GET", "POST"])
    async def dq_policy_new() -> Any:
        """A form for a new policy (no action enabled: they are enabled on its page afterwards)."""
        if request.method == "GET":
            return render_form(None, policy_fields(None, runtime.gateway_cluster))
        form = await console.form()
        manifest = policy_manifest(form, None, runtime.gateway_cluster)
        if form.get("backtest"):
            return await backtest_draft(None, form, manifest)
        name = manifest["metadata"]["name"]
        if name and store.get(POLICY, (name,)) is not None:
            error = f"A policy named {name!r} exists already: open it to edit it, or choose another name."
            return render_form(None, draft_policy_fields(form), 409, error)
        try:
            change = await store.put(kind(), manifest)
        except ResourceError as exc:
            return render_form(None, draft_policy_fields(form), exc.status, exc.msg)
        console.audit("UPSERT", kind=POLICY, resourceName=change.key[0], result=change.result)
        return console.redirect(f"data-quality/policies/{change.key[0]}", f"Policy {change.key[0]} created.")

    @console.page("data-quality/policies/<name>/edit", methods=["GET", "POST"])
    async def dq_policy_edit(name: str) -> Any:
        """The policy form for a stored policy: its group, names, rules and targets (not its actions)."""
        current = store.get(POLICY, (name,))
        if current is None:
            return not_found(name)
        if request.method == "GET":
            return render_form(current, policy_fields(current, runtime.gateway_cluster))
        form = await console.form()
        manifest = policy_manifest(form, current, runtime.gateway_cluster, name)
        if form.get("backtest"):
            return await backtest_draft(current, form, manifest)
        try:
            change = await store.put(kind(), manifest)
        except ResourceError as exc:
            return render_form(current, {**draft_policy_fields(form), "name": name}, exc.status, exc.msg)
        if change.result == "NOT_CHANGED":
            return console.redirect(f"data-quality/policies/{name}", f"Policy {name}: nothing changed.")
        console.audit("UPSERT", kind=POLICY, resourceName=name, result=change.result)
        return console.redirect(f"data-quality/policies/{name}", f"Policy {name} saved.")

    async def switch(name: str, manifest: Manifest, action: str, enabled: bool) -> Any:
        try:
            change = await store.put(kind(), with_action(manifest, action, enabled))
        except ResourceError as exc:
            return render_detail(name, manifest, exc.status, exc.msg)
        console.audit(
            "UPSERT", kind=POLICY, resourceName=name, result=change.result, policyAction=action, enabled=enabled
        )
        state = "enabled" if enabled else "disabled"
        return console.redirect(f"data-quality/policies/{name}", f"{action.title()} {state} on policy {name}.")

    @console.page("data-quality/policies/<name>/block", methods=["POST"])
    async def dq_policy_block(name: str) -> Any:
        """Enables Block (the word BLOCK typed) or disables it (UNBLOCK typed); anything else is refused
        with a 400 and the page says why."""
        manifest = store.get(POLICY, (name,))
        if manifest is None:
            return not_found(name)
        form = await console.form()
        enable = form.get("enable") == "true"
        refusal = block_refusal(actions_of(manifest)["block"], enable, form.get("confirm") or "")
        if refusal is not None:
            return render_detail(name, manifest, 400, refusal)
        return await switch(name, manifest, "block", enable)

    @console.page("data-quality/policies/<name>/mark", methods=["POST"])
    async def dq_policy_mark(name: str) -> Any:
        """Switches Mark (no confirmation: it blocks nothing)."""
        manifest = store.get(POLICY, (name,))
        if manifest is None:
            return not_found(name)
        form = await console.form()
        return await switch(name, manifest, "mark", form.get("enable") == "true")

    @console.page("data-quality/policies/<name>/backtest", methods=["POST"])
    async def dq_policy_backtest(name: str) -> Any:
        """Starts a backtest of the stored policy (admins only, as the API's) and shows its page; a
        refused request shows the policy page again with the form as typed and the API's reason."""
        manifest = store.get(POLICY, (name,))
        if manifest is None:
            return not_found(name)
        form = await console.form()
        try:
            return await start_from_form(console, backtests, form, name, first_topic(manifest))
        except ResourceError as exc:
            return render_detail(
                name, manifest, exc.status, backtest=backtest_fields(manifest, form), backtest_error=exc.msg
            )
