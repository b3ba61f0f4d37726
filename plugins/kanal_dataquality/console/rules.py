"""The rules pages: the list, a rule's page (create, edit) and the rule test.

Rules are stored through the console's store (``store.put``), so a rule is checked exactly as the
admin API checks it (the same 400 and message, shown above the form with the user's input kept). The
rule test is the admin API's (:mod:`kanal_dataquality.testrule`): on a saved rule, or on the draft in
the form before it is saved.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quart import request

from kanal.api import ConsolePages, Manifest, ResourceError, ResourceKind
from kanal_dataquality.console.forms import draft_rule, rule_fields, rule_manifest, sample_body
from kanal_dataquality.resources import POLICY, RULE
from kanal_dataquality.rules import CEL, ENFORCE_AVRO, JSON_SCHEMA, CompiledRule, RuleCompileError
from kanal_dataquality.runtime import Runtime
from kanal_dataquality.testrule import ERROR, SampleError, compile_for_test, run_test

__all__ = ["add_rule_pages"]

_SAMPLE = ("key", "value", "headers")


def add_rule_pages(console: ConsolePages, runtime: Runtime) -> None:
    store = console.store

    def kind() -> ResourceKind:
        found = console.kinds.get(RULE)
        assert found is not None, "the data-quality plugin registers its kinds before its pages"
        return found

    def used_by(name: str) -> list[str]:
        return sorted(p["metadata"]["name"] for p in store.resources(POLICY) if name in p["spec"].get("rules", ()))

    def render_rule(
        current: Manifest | None,
        fields: Mapping[str, str],
        *,
        status: int = 200,
        error: str | None = None,
        sample: Mapping[str, str] | None = None,
        result: Mapping[str, Any] | None = None,
    ) -> Any:
        name = current["metadata"]["name"] if current is not None else None
        return console.render(
            "dataquality/rule.html",
            status,
            title=f"Rule {name}" if name else "New rule",
            rule=current,
            fields=fields,
            used_by=used_by(name) if name else [],
            types=(CEL, JSON_SCHEMA),
            error=error,
            sample=sample or dict.fromkeys(_SAMPLE, ""),
            result=result,
        )

    async def test(rule: CompiledRule | None, problem: str | None, form: Mapping[str, str]) -> dict[str, Any]:
        """The rule test's answer, as the admin API gives it (a bad sample is an error too)."""
        if rule is None:
            return {"result": ERROR, "message": problem, "reason": None}
        try:
            answer = await run_test(rule, sample_body(form), runtime.registry)
        except (SampleError, ValueError) as exc:
            return {"result": "badSample", "message": str(exc), "reason": None}
        return {"result": answer["result"], "message": answer.get("message"), "reason": answer.get("reason")}

    @console.page("data-quality/rules", "Quality rules")
    async def dq_rules() -> Any:
        """Every rule, its type, logic and the policies that use it."""
        users: dict[str, list[str]] = {}  # rule -> policies (one pass: pages stay fast with many policies)
        for p in sorted(store.resources(POLICY), key=lambda p: str(p["metadata"]["name"])):
            for rule in p["spec"].get("rules") or ():
                users.setdefault(rule, []).append(p["metadata"]["name"])
        rows = [
            {
                "name": m["metadata"]["name"],
                "displayName": m["spec"].get("displayName"),
                "description": m["spec"].get("description"),
                "type": m["spec"].get("type"),
                "logic": rule_fields(m)["expression"],
                "usedBy": users.get(m["metadata"]["name"], []),
            }
            for m in sorted(store.resources(RULE), key=lambda m: str(m["metadata"]["name"]))
        ]
        return console.render("dataquality/rules.html", title="Data quality rules", rows=rows)

    @console.page("data-quality/new-rule", methods=["GET", "POST"])
    async def dq_rule_new() -> Any:
        """A form for a new rule; posted, the rule is stored (a name already taken is refused: its
        page edits it)."""
        if request.method == "GET":
            return render_rule(None, rule_fields(None))
        form = await console.form()
        manifest = rule_manifest(form, None)
        name = manifest["metadata"]["name"]
        if name and store.get(RULE, (name,)) is not None:
            error = f"A rule named {name!r} exists already: open it to edit it, or choose another name."
            return render_rule(None, {**rule_fields(None), **form}, status=409, error=error)
        try:
            change = await store.put(kind(), manifest)
        except ResourceError as exc:
            return render_rule(None, {**rule_fields(None), **form}, status=exc.status, error=exc.msg)
        console.audit("UPSERT", kind=RULE, resourceName=change.key[0], result=change.result)
        return console.redirect(f"data-quality/rules/{change.key[0]}", f"Rule {change.key[0]} created.")

    @console.page("data-quality/rules/<name>", methods=["GET", "POST"])
    async def dq_rule(name: str) -> Any:
        """A rule's page (its logic, the policies that use it, the test); posted, the edited rule."""
        current = store.get(RULE, (name,))
        if current is None:
            return console.render(
                "console/message.html", 404, title="Not found", message=f"There is no rule named {name!r}."
            )
        if request.method == "GET":
            return render_rule(current, rule_fields(current))
        form = await console.form()
        try:
            change = await store.put(kind(), rule_manifest(form, current, name))
        except ResourceError as exc:
            return render_rule(
                current, {**rule_fields(current), **form, "name": name}, status=exc.status, error=exc.msg
            )
        if change.result == "NOT_CHANGED":
            return console.redirect(f"data-quality/rules/{name}", f"Rule {name}: nothing changed.")
        console.audit("UPSERT", kind=RULE, resourceName=name, result=change.result)
        return console.redirect(f"data-quality/rules/{name}", f"Rule {name} saved.")

    @console.page("data-quality/test-rule", methods=["POST"], read_only=True)
    async def dq_rule_test_draft() -> Any:
        """The rule test on the form's draft (not stored): the form comes back with the result."""
        form = await console.form()
        edited = (form.get("editing") or "").strip()
        current = store.get(RULE, (edited,)) if edited else None
        rule: CompiledRule | None = None
        problem = None
        try:
            rule = compile_for_test(draft_rule(form, edited if current is not None else None))
        except RuleCompileError as exc:
            problem = str(exc)
        result = await test(rule, problem, form)
        fields = {**rule_fields(current), **form}
        sample = {k: form.get(k) or "" for k in _SAMPLE}
        return render_rule(current, fields, sample=sample, result=result)

    @console.page("data-quality/rules/<name>/test", methods=["POST"], read_only=True)
    async def dq_rule_test(name: str) -> Any:
        """The rule test on the saved rule (for every user: a test changes nothing)."""
        current = store.get(RULE, (name,))
        if current is None and name != ENFORCE_AVRO:
            return console.render(
                "console/message.html", 404, title="Not found", message=f"There is no rule named {name!r}."
            )
        form = await console.form()
        rule = runtime.describe_rules().get(name)
        problem = None
        if rule is None and current is not None:  # stored, not in the engine yet: compiled as the API does
            try:
                rule = compile_for_test(current)
            except RuleCompileError as exc:
                problem = f"rule {name!r} does not compile on this gateway: {exc}"
        result = await test(rule, problem, form)
        sample = {k: form.get(k) or "" for k in _SAMPLE}
        return render_rule(current, rule_fields(current), sample=sample, result=result)
