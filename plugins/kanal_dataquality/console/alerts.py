"""The alerts pages: every policy violation alert with whether it is firing (the admin API's
``/gateway/v2/data-quality/alerts``), and the alert form (create, edit, delete) for admins."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quart import request

from kanal.api import ConsolePages, Manifest, ResourceError, ResourceKind
from kanal_dataquality.console.forms import UNITS, alert_fields, alert_manifest, draft_fields
from kanal_dataquality.resources import ALERT, POLICY
from kanal_dataquality.runtime import Runtime

__all__ = ["add_alert_pages"]

_FIELDS = (
    "name",
    "group",
    "policyName",
    "triggerAfter",
    "within",
    "unit",
    "destination",
    "url",
    "displayName",
    "description",
)


def add_alert_pages(console: ConsolePages, runtime: Runtime) -> None:
    store = console.store

    def kind() -> ResourceKind:
        found = console.kinds.get(ALERT)
        assert found is not None, "the data-quality plugin registers its kinds before its pages"
        return found

    def policies() -> list[str]:
        return sorted(m["metadata"]["name"] for m in store.resources(POLICY))

    def rows() -> list[dict[str, Any]]:
        states = {a["name"]: a for a in runtime.alerts.describe()}
        return [
            {"manifest": m, "state": states.get(m["metadata"]["name"])}
            for m in sorted(store.resources(ALERT), key=lambda m: str(m["metadata"]["name"]))
        ]

    def render_list(fields: Mapping[str, str], status: int = 200, error: str | None = None) -> Any:
        return console.render(
            "dataquality/alerts.html",
            status,
            title="Data quality alerts",
            rows=rows(),
            fields=fields,
            policies=policies(),
            units=list(UNITS),
            error=error,
        )

    def render_alert(current: Manifest, fields: Mapping[str, str], status: int = 200, error: str | None = None) -> Any:
        name = current["metadata"]["name"]
        state = next((a for a in runtime.alerts.describe() if a["name"] == name), None)
        return console.render(
            "dataquality/alert.html",
            status,
            title=f"Alert {name}",
            alert=current,
            state=state,
            fields=fields,
            policies=policies(),
            units=list(UNITS),
            error=error,
        )

    @console.page("data-quality/alerts", "Quality alerts")
    async def dq_alerts() -> Any:
        """Every alert and whether it fires; a form for a new one (``?policy=`` fills in its policy)."""
        policy = request.args.get("policy", "")
        owner = store.get(POLICY, (policy,)) if policy else None
        group = (owner or {}).get("metadata", {}).get("group") or ""
        return render_list(alert_fields(None, policy, group))

    @console.page("data-quality/new-alert", methods=["POST"])
    async def dq_alert_new() -> Any:
        """Stores a new alert (a name already taken is refused: its page edits it)."""
        form = await console.form()
        manifest = alert_manifest(form, None)
        name = manifest["metadata"]["name"]
        if name and store.get(ALERT, (name,)) is not None:
            error = f"An alert named {name!r} exists already: open it to edit it, or choose another name."
            return render_list(draft_fields(form, _FIELDS), 409, error)
        try:
            change = await store.put(kind(), manifest)
        except ResourceError as exc:
            return render_list(draft_fields(form, _FIELDS), exc.status, exc.msg)
        console.audit("UPSERT", kind=ALERT, resourceName=change.key[0], result=change.result)
        return console.redirect(f"data-quality/alerts/{change.key[0]}", f"Alert {change.key[0]} created.")

    @console.page("data-quality/alerts/<name>", methods=["GET", "POST"])
    async def dq_alert(name: str) -> Any:
        """An alert: its threshold, destination and state; posted, the edited alert."""
        current = store.get(ALERT, (name,))
        if current is None:
            return console.render(
                "console/message.html", 404, title="Not found", message=f"There is no alert named {name!r}."
            )
        if request.method == "GET":
            return render_alert(current, alert_fields(current))
        form = await console.form()
        try:
            change = await store.put(kind(), alert_manifest(form, current, name))
        except ResourceError as exc:
            return render_alert(current, {**draft_fields(form, _FIELDS), "name": name}, exc.status, exc.msg)
        if change.result == "NOT_CHANGED":
            return console.redirect(f"data-quality/alerts/{name}", f"Alert {name}: nothing changed.")
        console.audit("UPSERT", kind=ALERT, resourceName=name, result=change.result)
        return console.redirect(f"data-quality/alerts/{name}", f"Alert {name} saved.")

    @console.page("data-quality/alerts/<name>/delete", methods=["POST"])
    async def dq_alert_delete(name: str) -> Any:
        """Deletes an alert (one button: an alert only notifies)."""
        if store.get(ALERT, (name,)) is None:
            return console.redirect("data-quality/alerts", f"There is no alert named {name!r}.", error=True)
        try:
            await store.delete(kind(), (name,))
        except ResourceError as exc:
            return console.redirect(f"data-quality/alerts/{name}", exc.msg, error=True)
        console.audit("DELETE", kind=ALERT, resourceName=name, result="DELETED")
        return console.redirect("data-quality/alerts", f"Alert {name} deleted.")
