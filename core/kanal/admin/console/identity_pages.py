"""The console's identity pages: service accounts (and their tokens), gateway groups, virtual
clusters, and the audit log.

The three kinds share one helper (:func:`resource_pages`): a page that lists the stored resources
with a form to create or edit one, and the forms that save and delete. The kinds differ only in
their fields (:class:`KindPages`). Saving goes through the admin API's store (``console.store.put``:
the same validation, the same messages); a refusal shows the form again with what was typed and
why. Changes and tokens are audited as the admin API audits its own; a token is shown once, on the
page that answers the form, and is never stored, logged, audited or put in a URL.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlencode

from quart import Response, request

from kanal.admin.console.app import Console
from kanal.admin.host import GatewayHost
from kanal.admin.identity import KIND as SERVICE_ACCOUNT
from kanal.admin.identity import mint_token
from kanal.api.resources import Manifest, ResourceError, ResourceKind, invalid, lookup
from kanal.audit import ADMIN_API_CALL, AUTHENTICATION, AUTHORIZATION, BadFilter, parse_query
from kanal.audit.events import MAX_LIMIT
from kanal.identity.accounts import AccountType
from kanal.tenancy.clusters import KAFKA_API, REST_API

__all__ = ["Field", "KindPages", "add_identity_pages", "resource_pages"]

API_VERSION: Final = "gateway/v2"
GROUP: Final = "GatewayGroup"
VIRTUAL_CLUSTER: Final = "VirtualCluster"
ALIAS_TOPIC: Final = "AliasTopic"
#: A token's lifetime the form offers (the admin API asks for one; a day, as the docs' example).
DEFAULT_LIFETIME: Final = 86_400
AUDIT_PAGE: Final = 50  # events a page of the audit log shows
# A group member written ``name @ virtual-cluster`` (a virtual cluster's name has no space or '@').
_MEMBER = re.compile(r"(?P<name>.*?\S)\s+@\s*(?P<vcluster>[A-Za-z0-9._-]+)")


@dataclass(frozen=True, slots=True)
class Field:
    """One input of a kind's form. ``widget``: ``text``, ``select`` (of ``choices``), ``lines`` (a
    list, one value a line), ``json`` or ``checkbox``. ``key`` fields identify the resource, so they
    cannot change once it exists; ``suggest`` names a list of the page's context to offer."""

    name: str
    label: str
    widget: str = "text"
    choices: tuple[str, ...] = ()
    key: bool = False
    suggest: str | None = None


@dataclass(frozen=True, slots=True)
class KindPages:
    """What one kind's pages need beyond the generic list, form and delete: where they are, the
    form's fields, how a form becomes a manifest (``to_manifest`` may raise ``invalid``) and back."""

    kind: str
    path: str  # the list's page, under /console
    title: str
    noun: str  # "service account", for messages
    template: str
    fields: tuple[Field, ...]
    to_manifest: Callable[[Mapping[str, str]], dict[str, Any]]
    to_form: Callable[[Manifest], dict[str, str]]

    def blank(self) -> dict[str, str]:
        return {f.name: f.choices[0] if f.choices else "" for f in self.fields}


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _key_of(kind: ResourceKind, metadata: Mapping[str, Any]) -> dict[str, str]:
    """The fields that identify a resource, as its forms and links carry them (``name``, ``vCluster``)."""
    key = {"name": str(metadata.get("name") or "")}
    for path in kind.key_fields:
        value = lookup(metadata, path)
        if value is not None:
            key[path.rsplit(".", 1)[-1]] = str(value)
    return key


def _described(key: Mapping[str, str]) -> str:
    scope = [f"{k}={v}" for k, v in key.items() if k != "name"]
    return repr(key.get("name", "")) + (f" ({', '.join(scope)})" if scope else "")


def resource_pages(console: Console, pages: KindPages, context: Callable[[], dict[str, Any]]) -> None:
    """Registers ``/console/<path>`` (the list, and the form of a new resource or, with its key as
    query parameters, of an existing one), ``<path>/save`` and ``<path>/delete``. The page's
    template gets ``rows`` (each with its ``manifest``, ``key``, ``query`` and ``status``), the
    form's ``fields`` and values, and ``context()``."""
    kind = console.kinds.get(pages.kind)
    if kind is None:
        return
    store = console.store
    leaves = [path.rsplit(".", 1)[-1] for path in kind.key_fields]

    def rows() -> list[dict[str, Any]]:
        out = []
        for manifest in store.resources(pages.kind):
            shown = store.with_status(kind, manifest)
            key = _key_of(kind, manifest["metadata"])
            status = shown.get("status") or {}
            out.append(
                {
                    "manifest": shown,
                    "key": key,
                    "query": urlencode(key),
                    "status": status.get("status"),
                    "message": status.get("message"),
                }
            )
        return out

    def show(form: Mapping[str, str], editing: bool, status: int = 200, error: str | None = None) -> Response:
        return console.render(
            pages.template,
            status,
            title=pages.title,
            pages=pages,
            rows=rows(),
            form=form,
            editing=editing,
            error=error,
            **context(),
        )

    def stored_key(name: str, given: Mapping[str, str]) -> tuple[str | None, ...]:
        metadata = kind.delete_metadata(name, {leaf: given[leaf] for leaf in leaves if given.get(leaf)})
        return kind.key_of(metadata)

    async def list_page() -> Response:
        """The resources, and the form of a new one or of the one the query names."""
        name = request.args.get("name", "")
        existing = store.get(pages.kind, stored_key(name, request.args)) if name else None
        return show(pages.blank() if existing is None else pages.to_form(existing), existing is not None)

    async def save() -> Response:
        """Stores the form's resource through the admin API's validation; a refusal shows the form
        again, as typed, with the API's message."""
        form = await console.form()
        values = {f.name: form.get(f.name, "") for f in pages.fields}
        try:
            change = await store.put(kind, pages.to_manifest(values))
        except ResourceError as exc:
            return show(values, form.get("editing") == "1", exc.status, exc.msg)
        key = _key_of(kind, change.resource["metadata"])
        if change.result != "NOT_CHANGED":
            scope = {k: v for k, v in key.items() if k != "name"}
            console.audit(
                "UPSERT", kind=pages.kind, resourceName=key["name"], scope=scope or None, result=change.result
            )
        outcome = change.result.lower().replace("_", " ")  # created, updated, not changed
        return console.redirect(pages.path, f"{pages.noun.capitalize()} {_described(key)} {outcome}.")

    async def delete() -> Response:
        """Deletes the resource the form names."""
        form = await console.form()
        key = {"name": form.get("name", ""), **{leaf: form[leaf] for leaf in leaves if form.get(leaf)}}
        try:
            await store.delete(kind, stored_key(key["name"], key))
        except ResourceError as exc:
            return console.redirect(pages.path, exc.msg, error=True)
        scope = {k: v for k, v in key.items() if k != "name"}
        console.audit("DELETE", kind=pages.kind, resourceName=key["name"], scope=scope or None, result="DELETED")
        return console.redirect(pages.path, f"{pages.noun.capitalize()} {_described(key)} deleted.")

    slug = pages.path.replace("-", "_")
    for view, suffix, methods in (
        (list_page, "", ("GET",)),
        (save, "/save", ("POST",)),
        (delete, "/delete", ("POST",)),
    ):
        view.__qualname__ = f"{slug}_{view.__name__}"  # an endpoint of its own per kind
        console.page(pages.path + suffix, pages.title if not suffix else None, methods)(view)


# -- the kinds' forms -----------------------------------------------------------------------------


def _account_manifest(form: Mapping[str, str]) -> dict[str, Any]:
    metadata = {"name": form["name"].strip()}
    if form["vCluster"].strip():
        metadata["vCluster"] = form["vCluster"].strip()
    spec: dict[str, Any] = {"type": form["type"]}
    if _lines(form["externalNames"]):
        spec["externalNames"] = _lines(form["externalNames"])
    return {"apiVersion": API_VERSION, "kind": SERVICE_ACCOUNT, "metadata": metadata, "spec": spec}


def _account_form(manifest: Manifest) -> dict[str, str]:
    metadata, spec = manifest["metadata"], manifest["spec"]
    return {
        "name": metadata["name"],
        "vCluster": metadata.get("vCluster") or "",
        "type": spec["type"],
        "externalNames": "\n".join(spec.get("externalNames") or ()),
    }


def _member_line(member: Mapping[str, Any]) -> str:
    return str(member["name"]) + (f" @ {member['vCluster']}" if member.get("vCluster") else "")


def _group_manifest(form: Mapping[str, str]) -> dict[str, Any]:
    members = []
    for line in _lines(form["members"]):
        found = _MEMBER.fullmatch(line)
        members.append({"name": found["name"], "vCluster": found["vcluster"]} if found else {"name": line})
    spec = {"members": members, "externalGroups": _lines(form["externalGroups"])}
    return {"apiVersion": API_VERSION, "kind": GROUP, "metadata": {"name": form["name"].strip()}, "spec": spec}


def _group_form(manifest: Manifest) -> dict[str, str]:
    spec = manifest["spec"]
    return {
        "name": manifest["metadata"]["name"],
        "members": "\n".join(_member_line(m) for m in spec.get("members") or ()),
        "externalGroups": "\n".join(spec.get("externalGroups") or ()),
    }


def _cluster_manifest(form: Mapping[str, str]) -> dict[str, Any]:
    spec: dict[str, Any] = {"aclEnabled": form["aclEnabled"] == "on", "aclMode": form["aclMode"], "type": form["type"]}
    if _lines(form["superUsers"]):
        spec["superUsers"] = _lines(form["superUsers"])
    if form["acls"].strip():
        try:
            spec["acls"] = json.loads(form["acls"])
        except json.JSONDecodeError as exc:
            raise invalid(f"spec.acls: not JSON ({exc.msg}, line {exc.lineno} column {exc.colno})") from None
    return {
        "apiVersion": API_VERSION,
        "kind": VIRTUAL_CLUSTER,
        "metadata": {"name": form["name"].strip()},
        "spec": spec,
    }


def _cluster_form(manifest: Manifest) -> dict[str, str]:
    spec = manifest["spec"]
    acls = spec.get("acls")
    return {
        "name": manifest["metadata"]["name"],
        "aclEnabled": "on" if spec.get("aclEnabled") else "",
        "aclMode": spec.get("aclMode", KAFKA_API),
        "type": spec.get("type", "Standard"),
        "superUsers": "\n".join(spec.get("superUsers") or ()),
        "acls": json.dumps(acls, indent=2, ensure_ascii=False) if acls else "",
    }


ACCOUNTS = KindPages(
    kind=SERVICE_ACCOUNT,
    path="service-accounts",
    title="Service accounts",
    noun="service account",
    template="console/identity_service_accounts.html",
    fields=(
        Field("name", "Name", key=True),
        Field("vCluster", "Virtual cluster (empty: none)", key=True, suggest="vclusters"),
        Field("type", "Type", "select", tuple(t.value for t in AccountType)),
        Field("externalNames", "External names (EXTERNAL only: one a line, e.g. an OAuth sub)", "lines"),
    ),
    to_manifest=_account_manifest,
    to_form=_account_form,
)
GROUPS = KindPages(
    kind=GROUP,
    path="groups",
    title="Groups",
    noun="group",
    template="console/identity_groups.html",
    fields=(
        Field("name", "Name", key=True),
        Field("members", "Members (one a line: a principal's name, or name @ virtual-cluster)", "lines"),
        Field("externalGroups", "External groups (one a line: groups a credential claims)", "lines"),
    ),
    to_manifest=_group_manifest,
    to_form=_group_form,
)
CLUSTERS = KindPages(
    kind=VIRTUAL_CLUSTER,
    path="virtual-clusters",
    title="Virtual clusters",
    noun="virtual cluster",
    template="console/identity_virtual_clusters.html",
    fields=(
        Field(
            "name", "Name: the prefix of its topics, groups and transactional ids (end it with a separator)", key=True
        ),
        Field("aclEnabled", "The gateway enforces its ACLs", "checkbox"),
        Field("aclMode", "ACL mode (cannot change once created)", "select", (KAFKA_API, REST_API)),
        Field("superUsers", "Super users (KAFKA_API: one a line; they manage the ACLs)", "lines"),
        Field(
            "acls",
            "ACLs (REST_API: a JSON list of {resourcePattern, principal, host, operation, permissionType})",
            "json",
        ),
        Field("type", "Type", "select", ("Standard", "Partner")),
    ),
    to_manifest=_cluster_manifest,
    to_form=_cluster_form,
)


# -- the pages ------------------------------------------------------------------------------------


def _page_number(text: str | None) -> int:
    return int(text) if text and text.isascii() and text.isdigit() and 0 < int(text) <= MAX_LIMIT // AUDIT_PAGE else 1


def _event_data(data: Any) -> str | list[tuple[str, str]] | None:
    """An event's data as the audit page shows it: a text, or (field, value) pairs for an object
    (values that are not text as JSON), so that an event reads on a line or two."""
    if isinstance(data, Mapping):
        return [
            (str(k), v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str))
            for k, v in data.items()
        ]
    return None if data is None else str(data)


def add_identity_pages(console: Console, gateway: GatewayHost) -> None:
    """Registers the service accounts' pages (with the token form), the groups', the virtual
    clusters' (with a page per virtual cluster) and the audit log's."""
    store = console.store

    def vcluster_names() -> list[str]:
        return [m["metadata"]["name"] for m in store.resources(VIRTUAL_CLUSTER)]

    def by_vcluster(kind: str) -> dict[str, list[Manifest]]:
        out: dict[str, list[Manifest]] = {}
        for manifest in store.resources(kind):
            vcluster = manifest["metadata"].get("vCluster")
            if vcluster:
                out.setdefault(vcluster, []).append(manifest)
        return out

    def accounts_context() -> dict[str, Any]:
        return {"vclusters": vcluster_names(), "lifetime": DEFAULT_LIFETIME}

    def clusters_context() -> dict[str, Any]:
        return {"accounts_of": by_vcluster(SERVICE_ACCOUNT), "aliases_of": by_vcluster(ALIAS_TOPIC)}

    resource_pages(console, ACCOUNTS, accounts_context)
    resource_pages(console, GROUPS, lambda: {})
    resource_pages(console, CLUSTERS, clusters_context)

    if console.kinds.get(SERVICE_ACCOUNT) is not None:

        @console.page("service-accounts/token", methods=["POST"])
        async def mint() -> Response:
            """A token for a LOCAL account, shown on this answer only (the audit names the account
            and the lifetime, as the admin API's does, never the token)."""
            form = await console.form()
            lifetime = form.get("lifeTimeSeconds", "").strip()
            body = {
                "username": form.get("name", ""),
                "vCluster": form.get("vCluster") or None,
                "lifeTimeSeconds": int(lifetime) if lifetime.isascii() and lifetime.isdigit() else lifetime,
            }
            try:
                minted = mint_token(gateway.service_accounts, gateway.settings.user_pool_secret_key, body)
            except ResourceError as exc:
                return console.redirect(ACCOUNTS.path, exc.msg, error=True)
            account = minted.account
            console.audit(
                "MINT_TOKEN",
                kind=SERVICE_ACCOUNT,
                resourceName=account.name,
                scope={"vCluster": account.vcluster} if account.vcluster is not None else None,
                lifeTimeSeconds=minted.lifetime_seconds,
                result="SUCCESS",
            )
            return console.render(
                "console/identity_token.html",
                title=f"A token for {account.name}",
                account=account,
                token=minted.token,
                lifetime=minted.lifetime_seconds,
                protocol=gateway.settings.security_protocol.upper(),
            )

    clusters = console.kinds.get(VIRTUAL_CLUSTER)
    if clusters is not None:
        kind: ResourceKind = clusters  # (for the view: a closure does not keep the narrowing)

        @console.page("virtual-clusters/<name>")
        async def virtual_cluster_page(name: str) -> Response:
            """One virtual cluster: its settings, what its clients set, its ACLs, accounts and aliases."""
            manifest = store.get(VIRTUAL_CLUSTER, kind.key_of({"name": name}))
            if manifest is None:
                return console.render("console/message.html", 404, title=name, message=f"No virtual cluster {name!r}.")
            shown = store.with_status(kind, manifest)
            return console.render(
                "console/identity_virtual_cluster.html",
                title=f"Virtual cluster {name}",
                cluster=shown,
                state=shown.get("status") or {},
                query=urlencode({"name": name}),
                accounts=by_vcluster(SERVICE_ACCOUNT).get(name, []),
                aliases=by_vcluster(ALIAS_TOPIC).get(name, []),
            )

    @console.page("audit", "Audit log")
    async def audit_page() -> Response:
        """The newest events of the audit log (every node's), filtered as ``GET /gateway/v2/audit``
        filters them, a page at a time."""
        audit_log = console.api.audit_log
        if audit_log is None or not audit_log.enabled:
            return console.render(
                "console/message.html", 404, title="Audit log",
                message="The audit log is off (GATEWAY_FEATURE_FLAGS_AUDIT=false).",
            )  # fmt: skip
        filters = {k: request.args.get(k, "").strip() for k in ("type", "principal", "from", "to")}
        page = _page_number(request.args.get("page"))
        given = {k: v for k, v in filters.items() if v}
        error = None
        try:
            query = parse_query({**given, "limit": str(min(page * AUDIT_PAGE + 1, MAX_LIMIT))})
            found = audit_log.query(query)
        except BadFilter as exc:
            error, found = str(exc), []
        events = found[(page - 1) * AUDIT_PAGE : page * AUDIT_PAGE]
        return console.render(
            "console/identity_audit.html",
            400 if error else 200,
            title="Audit log",
            filters=filters,
            error=error,
            types=(AUTHENTICATION, AUTHORIZATION, ADMIN_API_CALL),
            page=page,
            events=[
                {
                    "time": str(e.get("time") or "").replace("T", " "),
                    "type": e.get("type"),
                    "user": e.get("userName"),
                    "vcluster": e.get("authenticationPrincipal"),
                    "client": (e.get("connection") or {}).get("remoteAddress"),
                    "source": e.get("source"),
                    "data": _event_data(e.get("eventData")),
                }
                for e in events
            ],
            previous=urlencode({**given, "page": page - 1}) if page > 1 else None,
            following=urlencode({**given, "page": page + 1}) if len(found) > page * AUDIT_PAGE else None,
        )
