"""GatewayGroups: the kind through the admin API, the directory that gives connections their groups,
a live connection following a membership change, interceptor scopes as stored, and the resolver.

The admin app runs for real (quart-trio test client) with its resource store following an in-memory
log, on a real (not started) gateway; what a test checks is what an operator sees over HTTP and the
groups and chains the gateway gives a connection.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import pytest
import trio
import trio.testing
from admin_harness import serve_admin

from kanal.admin.app import AdminApi
from kanal.admin.cli import Client as CliClient
from kanal.admin.service import build_admin
from kanal.admin.store import MemoryLog
from kanal.api import GatewayServices
from kanal.api.context import Connection
from kanal.api.hookspecs import hookimpl
from kanal.api.interceptor import Interceptor, InterceptorConfigError, InterceptorSpec, Scope
from kanal.config.settings import build_settings
from kanal.gateway import Gateway
from kanal.identity.accounts import AccountType, ServiceAccount, ServiceAccounts
from kanal.identity.directory import Directory
from kanal.identity.groups import Group, Groups, Member
from kanal.net.connection import ClientConnection
from kanal.pipeline.registry import PluginRegistry
from kanal.protocol.sasl_mechanisms import Identity

USERS = "[{username: admin, password: secret, admin: true}]"
ADMIN = {"Authorization": "Basic " + base64.b64encode(b"admin:secret").decode()}
GROUPS = "/gateway/v2/group"
INTERCEPTORS = "/gateway/v2/interceptor"

Client = Any


class Tagger(Interceptor):
    """Does nothing; ``config.tag`` tells which interceptor a chain holds."""

    plugin_name: ClassVar[str] = "tagger"

    def __init__(self, config: Any, services: GatewayServices) -> None:
        super().__init__(config, services)
        if not isinstance(self.config.get("tag"), str):
            raise InterceptorConfigError("tag: required, a string")


class TaggerPlugin:
    @hookimpl
    def kanal_interceptor_types(self) -> list[type[Interceptor]]:
        return [Tagger]


def new_gateway(static: list[InterceptorSpec] | None = None) -> Gateway:
    registry = PluginRegistry()
    registry.register(TaggerPlugin(), "tagger")
    settings = build_settings({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "GATEWAY_ADMIN_API_USERS": USERS})
    gateway = Gateway(settings, registry)
    gateway.pipeline.configure(static or [])
    return gateway


def run_admin(body: Callable[[AdminApi, Client], Awaitable[None]]) -> AdminApi:
    api = build_admin(new_gateway(), writer=MemoryLog())
    return serve_admin(api, body)


def group(name: str, spec: Any, **metadata: Any) -> dict[str, Any]:
    return {"apiVersion": "gateway/v2", "kind": "GatewayGroup", "metadata": {"name": name, **metadata}, "spec": spec}


def interceptor(name: str, tag: str, scope: Any = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if scope is not None:
        metadata["scope"] = scope
    return {
        "apiVersion": "gateway/v2",
        "kind": "Interceptor",
        "metadata": metadata,
        "spec": {"pluginClass": "tagger", "priority": 100, "config": {"tag": tag}},
    }


async def put(client: Client, path: str, manifest: Any) -> tuple[int, Any]:
    response = await client.put(path, json=manifest, headers=ADMIN)
    return response.status_code, await response.get_json()


async def resolved(client: Client, who: dict[str, Any]) -> list[str]:
    response = await client.post(f"{INTERCEPTORS}/resolve", json=who, headers=ADMIN)
    assert response.status_code == 200, await response.get_json()
    return [r["spec"]["config"]["tag"] for r in await response.get_json()]


# -- the kind over HTTP -----------------------------------------------------------------------------


def test_a_group_is_stored_in_canonical_form_and_reaches_the_gateway() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        spec: dict[str, Any] = {
            "members": [{"name": "orders-app", "vCluster": "tenant-a"}, {"name": "billing-app", "vCluster": None}],
            "externalGroups": ["payments-team"],
        }
        status, answer = await put(client, GROUPS, group("payments", spec))
        assert (status, answer["upsertResult"]) == (200, "CREATED")
        assert answer["resource"] == {
            "apiVersion": "gateway/v2",
            "kind": "GatewayGroup",
            "metadata": {"name": "payments"},
            "spec": {
                "members": [{"name": "orders-app", "vCluster": "tenant-a"}, {"name": "billing-app"}],
                "externalGroups": ["payments-team"],
            },
            "status": {"status": "Ready"},
        }
        groups = api.gateway.groups  # type: ignore[attr-defined]
        assert groups.of("orders-app", "tenant-a") == ("payments",)
        assert groups.of("orders-app") == ()  # the member is the one of tenant-a
        assert groups.of("billing-app") == ("payments",)
        assert groups.of("someone", None, ("payments-team",)) == ("payments",)
        same = group("payments", {**spec, "members": [spec["members"][0], {"name": "billing-app"}]})
        assert (await put(client, GROUPS, same))[1]["upsertResult"] == "NOT_CHANGED"

        gone = await client.delete(f"{GROUPS}/payments", headers=ADMIN)
        assert gone.status_code == 204
        assert groups.of("billing-app") == ()

    run_admin(body)


@pytest.mark.parametrize(
    ("spec", "metadata", "reason"),
    [
        ({"member": []}, {}, "unknown spec field 'member'"),
        ({"members": "alice"}, {}, "spec.members must be a list"),
        ({"members": ["alice"]}, {}, "spec.members[0] must be an object"),
        ({"members": [{"vCluster": "a"}]}, {}, "spec.members[0].name is required"),
        ({"members": [{"name": "a", "role": "x"}]}, {}, "unknown field spec.members[0].role"),
        ({"members": [{"name": "a", "vCluster": 3}]}, {}, "spec.members[0].vCluster must be a string"),
        ({"members": [{"name": "a"}, {"name": "a", "vCluster": "passthrough"}]}, {}, "lists 'a' twice"),
        ({"members": [{"name": "a", "vCluster": "t"}, {"name": "a", "vCluster": "t"}]}, {}, "'a' in vCluster 't'"),
        ({"externalGroups": "admins"}, {}, "spec.externalGroups must be a list"),
        ({"externalGroups": ["admins", "admins"]}, {}, "lists 'admins' twice"),
        ({}, {"vCluster": "tenant-a"}, "a group is in no virtual cluster"),
        ({}, {"scope": {}}, "unknown metadata field 'scope'"),
    ],
)
def test_a_bad_group_is_a_400_that_says_why(spec: Any, metadata: dict[str, Any], reason: str) -> None:
    async def body(api: AdminApi, client: Client) -> None:
        status, answer = await put(client, GROUPS, group("g", spec, **metadata))
        assert status == 400
        assert reason in answer["msg"]
        assert (await (await client.get(GROUPS, headers=ADMIN)).get_json()) == []

    run_admin(body)


def test_the_cli_finds_the_kind_as_groups_with_its_columns() -> None:
    api = build_admin(new_gateway(), writer=MemoryLog())
    cli = CliClient("http://unused", None, None)
    cli._kinds = api.kinds.describe()  # what GET /gateway/v2/resource-kinds answers
    for name in ("groups", "group", "GatewayGroup", "gatewaygroups"):
        assert cli.kind(name)["kind"] == "GatewayGroup"
    headers = [column[0] for column in cli.kind("groups")["columns"]]
    assert headers == ["NAME", "MEMBERS", "EXTERNAL GROUPS", "STATUS"]


# -- the directory ----------------------------------------------------------------------------------


@pytest.fixture
def directory() -> Directory:
    accounts = ServiceAccounts(
        [
            ServiceAccount("orders-app", "tenant-a", AccountType.LOCAL),
            ServiceAccount("partner", None, AccountType.EXTERNAL, ("CN=partner,O=acme",)),
        ]
    )
    groups = Groups(
        [
            Group("orders", (Member("orders-app", "tenant-a"),)),
            Group("partners", (Member("partner"), Member("not-an-account"))),
            Group("admins", external_groups=("idp-admins", "idp-ops")),
            Group("ops", external_groups=("idp-ops",)),
        ]
    )
    return Directory(accounts, groups)


def test_members_are_matched_by_name_and_virtual_cluster(directory: Directory) -> None:
    assert directory.identify(Identity("orders-app", vcluster="tenant-a")).groups == ("orders",)
    assert directory.identify(Identity("orders-app")).groups == ()
    assert directory.identify(Identity("orders-app", vcluster="tenant-b")).groups == ()
    assert directory.identify(Identity("not-an-account")).groups == ("partners",)


def test_an_external_account_is_a_member_under_its_account_name(directory: Directory) -> None:
    identity = directory.identify(Identity("CN=partner,O=acme"))
    assert (identity.principal, identity.groups) == ("partner", ("partners",))


def test_a_local_accounts_own_login_is_never_renamed_by_an_external_name(directory: Directory) -> None:
    # A LOCAL login named like an EXTERNAL account's external name stays who it logged in as.
    identity = directory.identify(Identity("CN=partner,O=acme", local=True))
    assert (identity.principal, identity.groups) == ("CN=partner,O=acme", ())


def test_claimed_groups_give_the_groups_listing_them_and_nothing_else(directory: Directory) -> None:
    identity = directory.identify(Identity("someone", groups=("idp-ops", "idp-unknown", "orders")))
    assert identity.groups == ("admins", "ops")  # "orders" claimed is no membership of group orders
    assert directory.identify(Identity("someone", groups=("idp-admins",))).groups == ("admins",)


def test_a_replacement_reaches_the_directory_and_tells_the_pipeline() -> None:
    gateway = new_gateway()
    before = gateway.pipeline.version
    gateway.groups.replace([Group("team", (Member("alice"),))])
    assert gateway.pipeline.version != before
    assert gateway.identify(Identity("alice")).groups == ("team",)
    assert gateway.pipeline.groups_of("alice", None, ()) == ("team",)


# -- a live connection ------------------------------------------------------------------------------


def test_a_live_connection_follows_a_membership_change_at_its_next_chain() -> None:
    gateway = new_gateway(
        [
            InterceptorSpec("policy", "tagger", scope=Scope(), config={"tag": "global"}),
            InterceptorSpec("policy", "tagger", scope=Scope(group="team"), config={"tag": "team"}),
        ]
    )
    ours, _theirs = trio.testing.memory_stream_pair()
    info = Connection(id=1, client_address="127.0.0.1:5000", listener_address="127.0.0.1:6969", node_id=0)
    connection = ClientConnection(gateway, ours, info)
    connection.identified(Identity("alice"), "SSL")  # as a client certificate would

    def tag() -> str:
        (configured,) = [c for c in connection.chain().interceptors if not c.builtin]
        return str(configured.spec.config["tag"])

    assert (info.groups, tag()) == ((), "global")
    gateway.groups.replace([Group("team", (Member("alice"),))])
    assert (tag(), info.groups) == ("team", ("team",))
    gateway.groups.replace([])
    assert (tag(), info.groups) == ("global", ())


# -- interceptor scopes as stored, and the resolver -------------------------------------------------


def test_interceptor_scopes_follow_the_targeting_table() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        cases = [
            (None, {"name": "x"}),  # omitted: passthrough only
            ({}, {"name": "x"}),
            ({"vCluster": "passthrough"}, {"name": "x"}),
            ({"vCluster": None, "group": None, "username": None}, {"name": "x", "scope": {"vCluster": "*"}}),
            (
                {"vCluster": "tenant-a", "group": "team"},
                {"name": "x", "scope": {"vCluster": "tenant-a", "group": "team"}},
            ),
            ({"username": "alice", "group": None}, {"name": "x", "scope": {"username": "alice"}}),
        ]
        for scope, metadata in cases:
            status, answer = await put(client, INTERCEPTORS, interceptor("x", "t", scope))
            assert status == 200, answer
            assert answer["resource"]["metadata"] == metadata
        both = await put(client, INTERCEPTORS, interceptor("x", "t", {"group": "g", "username": "u"}))
        assert both[0] == 400 and "group and username cannot both be set" in both[1]["msg"]

        every = await client.get(f"{INTERCEPTORS}/x", query_string={"vCluster": "*"}, headers=ADMIN)
        assert (await every.get_json())["metadata"]["scope"] == {"vCluster": "*"}
        passthrough = await client.get(f"{INTERCEPTORS}/x", query_string={"vCluster": "passthrough"}, headers=ADMIN)
        assert (await passthrough.get_json())["metadata"] == {"name": "x"}
        # A scope to delete by reads as in the manifest (kanal delete -f sends the manifest's metadata).
        as_applied = {"scope": {"vCluster": None, "group": None, "username": None}}
        assert (await client.delete(f"{INTERCEPTORS}/x", json=as_applied, headers=ADMIN)).status_code == 204
        assert (await client.get(f"{INTERCEPTORS}/x", headers=ADMIN)).status_code == 200  # the passthrough one stays
        assert (await client.delete(f"{INTERCEPTORS}/x", headers=ADMIN)).status_code == 204
        remaining = await (await client.get(INTERCEPTORS, headers=ADMIN)).get_json()
        assert sorted(str(r["metadata"].get("scope")) for r in remaining) == sorted(
            [str({"vCluster": "tenant-a", "group": "team"}), str({"username": "alice"})]
        )

    run_admin(body)


def test_resolve_gives_a_principal_the_chain_its_connection_gets() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        partner = {
            "apiVersion": "gateway/v2",
            "kind": "GatewayServiceAccount",
            "metadata": {"name": "partner", "vCluster": "tenant-a"},
            "spec": {"type": "EXTERNAL", "externalNames": ["0oa-partner"]},
        }
        assert (await put(client, "/gateway/v2/service-account", partner))[0] == 200
        members = [{"name": "alice", "vCluster": "tenant-a"}, {"name": "partner", "vCluster": "tenant-a"}]
        await put(client, GROUPS, group("team", {"members": members, "externalGroups": ["idp-team"]}))
        for scope, tag in [
            ({"vCluster": None}, "global"),
            (None, "passthrough"),
            ({"vCluster": "tenant-a"}, "vcluster"),
            ({"vCluster": "tenant-a", "group": "team"}, "group"),
            ({"vCluster": "tenant-a", "username": "bob"}, "bob"),
        ]:
            assert (await put(client, INTERCEPTORS, interceptor("policy", tag, scope)))[0] == 200

        assert await resolved(client, {}) == ["passthrough"]  # an anonymous client
        assert await resolved(client, {"username": "alice", "vCluster": "tenant-a"}) == ["group"]
        assert await resolved(client, {"username": "bob", "vCluster": "tenant-a"}) == ["bob"]
        assert await resolved(client, {"username": "carol", "vCluster": "tenant-a"}) == ["vcluster"]
        assert await resolved(client, {"username": "carol", "vCluster": "tenant-b"}) == ["global"]
        assert await resolved(client, {"username": "alice"}) == ["passthrough"]
        # An EXTERNAL account's external name is that account, in its virtual cluster and groups.
        assert await resolved(client, {"username": "0oa-partner"}) == ["group"]
        # A credential claiming an external group of the group; groups given are taken as they are.
        claimed = {"username": "carol", "vCluster": "tenant-a", "externalGroups": ["idp-team"]}
        assert await resolved(client, claimed) == ["group"]
        assert await resolved(client, {"username": "carol", "vCluster": "tenant-a", "groups": ["team"]}) == ["group"]
        assert await resolved(client, {"username": "alice", "vCluster": "tenant-a", "groups": []}) == ["vcluster"]

        for bad, reason in [
            ({"groups": "team"}, "groups must be a list"),
            ({"externalGroups": [1]}, "externalGroups must be a list"),
            ({"groups": ["a"], "externalGroups": ["b"]}, "not both"),
            ({"principal": "alice"}, "unknown field 'principal'"),
        ]:
            response = await client.post(f"{INTERCEPTORS}/resolve", json=bad, headers=ADMIN)
            assert response.status_code == 400 and reason in (await response.get_json())["msg"]

    run_admin(body)
