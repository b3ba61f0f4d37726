"""Service accounts: the GatewayServiceAccount kind through the admin API, the lookup the listener
reads, and the GATEWAY_USER_POOL_SECRET_KEY setting.

The admin app runs for real (quart-trio test client) with its resource store following an in-memory
log; what a test checks is what an operator sees over HTTP and what the gateway's lookup answers.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from admin_harness import serve_admin

from kanal.admin.app import AdminApi
from kanal.admin.service import build_admin
from kanal.admin.store import MemoryLog
from kanal.api.errors import ConfigError
from kanal.config.settings import build_settings
from kanal.gateway import Gateway
from kanal.identity.accounts import AccountType, ServiceAccount, ServiceAccounts, user_pool_secret
from kanal.pipeline.registry import PluginRegistry

USERS = "[{username: admin, password: secret, admin: true}]"
ADMIN = {"Authorization": "Basic " + base64.b64encode(b"admin:secret").decode()}
PATH = "/gateway/v2/service-account"

Client = Any


def run_admin(body: Callable[[AdminApi, Client], Awaitable[None]], log: MemoryLog | None = None) -> AdminApi:
    settings = build_settings({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "GATEWAY_ADMIN_API_USERS": USERS})
    api = build_admin(Gateway(settings, PluginRegistry()), writer=log or MemoryLog())
    return serve_admin(api, body)


def account(name: str, spec: dict[str, Any], vcluster: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if vcluster is not None:
        metadata["vCluster"] = vcluster
    return {"apiVersion": "gateway/v2", "kind": "GatewayServiceAccount", "metadata": metadata, "spec": spec}


async def put(client: Client, manifest: Any) -> tuple[int, Any]:
    response = await client.put(PATH, json=manifest, headers=ADMIN)
    return response.status_code, await response.get_json()


def accounts(api: AdminApi) -> ServiceAccounts:
    return api.gateway.service_accounts


# -- the kind over HTTP -----------------------------------------------------------------------------


def test_a_local_account_is_stored_in_canonical_form_and_reaches_the_lookup() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        status, answer = await put(client, account("app1", {"type": "local"}))
        assert status == 200 and answer["upsertResult"] == "CREATED"
        assert answer["resource"] == {
            "apiVersion": "gateway/v2",
            "kind": "GatewayServiceAccount",
            "metadata": {"name": "app1"},
            "spec": {"type": "LOCAL"},
            "status": {"status": "Ready"},
        }
        assert accounts(api).get("app1") == ServiceAccount("app1", None, AccountType.LOCAL)
        assert (await put(client, account("app1", {"type": "LOCAL"})))[1]["upsertResult"] == "NOT_CHANGED"
        listed = await (await client.get(PATH, headers=ADMIN)).get_json()
        assert [m["metadata"]["name"] for m in listed] == ["app1"]

    run_admin(body)


def test_the_virtual_cluster_is_part_of_the_identity() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        assert (await put(client, account("app1", {"type": "LOCAL"})))[0] == 200
        status, answer = await put(client, account("app1", {"type": "LOCAL"}, vcluster="tenant-a"))
        assert (status, answer["upsertResult"]) == (200, "CREATED")
        lookup = accounts(api)
        assert lookup.get("app1") == ServiceAccount("app1", None, AccountType.LOCAL)
        assert lookup.get("app1", "tenant-a") == ServiceAccount("app1", "tenant-a", AccountType.LOCAL)
        assert lookup.get("app1", "tenant-b") is None
        one = await client.get(f"{PATH}/app1", headers=ADMIN, query_string={"vCluster": "tenant-a"})
        assert (await one.get_json())["metadata"] == {"name": "app1", "vCluster": "tenant-a"}
        filtered = await (await client.get(PATH, headers=ADMIN, query_string={"vcluster": "tenant-a"})).get_json()
        assert [m["metadata"] for m in filtered] == [{"name": "app1", "vCluster": "tenant-a"}]

        deleted = await client.delete(f"{PATH}/app1", json={"vCluster": "tenant-a"}, headers=ADMIN)
        assert deleted.status_code == 204
        assert lookup.get("app1", "tenant-a") is None
        assert lookup.get("app1") is not None

    run_admin(body)


def test_an_external_account_is_found_by_its_external_names() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        spec = {"type": "EXTERNAL", "externalNames": ["0oa1b2c3", "CN=orders,O=acme"]}
        status, answer = await put(client, account("orders", spec, vcluster="tenant-a"))
        assert status == 200 and answer["resource"]["spec"] == spec
        lookup = accounts(api)
        expected = ServiceAccount("orders", "tenant-a", AccountType.EXTERNAL, ("0oa1b2c3", "CN=orders,O=acme"))
        assert lookup.by_external_name("CN=orders,O=acme") == expected
        assert lookup.by_external_name("orders") is None
        by_type = await (await client.get(PATH, headers=ADMIN, query_string={"type": "EXTERNAL"})).get_json()
        assert [m["metadata"]["name"] for m in by_type] == ["orders"]

        # switching to LOCAL drops the external names from the lookup
        assert (await put(client, account("orders", {"type": "LOCAL"}, vcluster="tenant-a")))[0] == 200
        assert lookup.by_external_name("0oa1b2c3") is None
        assert lookup.get("orders", "tenant-a") == ServiceAccount("orders", "tenant-a", AccountType.LOCAL)

    run_admin(body)


@pytest.mark.parametrize(
    ("manifest", "field"),
    [
        (account("a", {}), "spec.type"),
        (account("a", {"type": "ADMIN"}), "spec.type"),
        (account("a", {"type": 1}), "spec.type"),
        (account("a", {"type": "EXTERNAL"}), "spec.externalNames"),
        (account("a", {"type": "EXTERNAL", "externalNames": []}), "spec.externalNames"),
        (account("a", {"type": "EXTERNAL", "externalNames": "bob"}), "spec.externalNames"),
        (account("a", {"type": "EXTERNAL", "externalNames": ["bob", 7]}), "spec.externalNames"),
        (account("a", {"type": "EXTERNAL", "externalNames": [" "]}), "spec.externalNames"),
        (account("a", {"type": "EXTERNAL", "externalNames": ["bob", "bob"]}), "spec.externalNames"),
        (account("a", {"type": "LOCAL", "externalNames": ["bob"]}), "spec.externalNames"),
        (account("a", {"type": "LOCAL", "password": "x"}), "'password'"),
        ({**account("a", {"type": "LOCAL"}), "metadata": {"name": "a", "vCluster": 3}}, "metadata.vCluster"),
        ({**account("a", {"type": "LOCAL"}), "metadata": {"name": "a", "scope": {}}}, "'scope'"),
        ({**account("a", {"type": "LOCAL"}), "metadata": {"name": "a b"}}, "metadata.name"),
    ],
)
def test_invalid_manifests_are_refused_naming_the_field(manifest: dict[str, Any], field: str) -> None:
    async def body(api: AdminApi, client: Client) -> None:
        status, error = await put(client, manifest)
        assert status == 400
        assert set(error) == {"title", "msg", "cause"}
        assert field in error["msg"]
        assert len(accounts(api)) == 0
        assert api.store.count("GatewayServiceAccount") == 0

    run_admin(body)


def test_an_external_name_belongs_to_one_account() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        first = account("orders", {"type": "EXTERNAL", "externalNames": ["sub-1", "sub-2"]})
        assert (await put(client, first))[0] == 200
        status, error = await put(client, account("billing", {"type": "EXTERNAL", "externalNames": ["sub-2"]}))
        assert status == 409
        assert "spec.externalNames" in error["msg"] and "'sub-2'" in error["msg"] and "'orders'" in error["msg"]
        assert accounts(api).get("billing") is None
        # the owner may keep or change its own names
        renamed = account("orders", {"type": "EXTERNAL", "externalNames": ["sub-2", "sub-3"]})
        assert (await put(client, renamed))[1]["upsertResult"] == "UPDATED"
        assert accounts(api).by_external_name("sub-1") is None

    run_admin(body)


def test_the_kind_is_listed_for_the_cli() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        kinds = await (await client.get("/gateway/v2/resource-kinds", headers=ADMIN)).get_json()
        kind = next(k for k in kinds if k["kind"] == "GatewayServiceAccount")
        assert kind["path"] == "service-account" and kind["keyFields"] == ["vCluster"]
        assert "sa" in kind["aliases"]

    run_admin(body)


def test_a_restarted_node_has_the_accounts_of_the_log() -> None:
    log = MemoryLog()

    async def write(api: AdminApi, client: Client) -> None:
        assert (await put(client, account("app1", {"type": "LOCAL"}, vcluster="tenant-a")))[0] == 200

    async def read(api: AdminApi, client: Client) -> None:
        assert accounts(api).get("app1", "tenant-a") == ServiceAccount("app1", "tenant-a", AccountType.LOCAL)

    run_admin(write, log)
    run_admin(read, log)


# -- the lookup -------------------------------------------------------------------------------------


def test_an_external_name_claimed_twice_stays_with_the_first_account() -> None:
    first = ServiceAccount("a", None, AccountType.EXTERNAL, ("sub",))
    second = ServiceAccount("b", None, AccountType.EXTERNAL, ("sub", "other"))
    lookup = ServiceAccounts()
    refused = lookup.replace([first, second])
    assert [(a.name, "'sub'" in reason and "'a'" in reason) for a, reason in refused] == [("b", True)]
    assert lookup.by_external_name("sub") == first
    assert lookup.by_external_name("other") is None
    assert lookup.get("b") is None
    assert lookup.replace([]) == [] and len(lookup) == 0 and lookup.get("a") is None


# -- GATEWAY_USER_POOL_SECRET_KEY -----------------------------------------------------------------


def settings_with(secret: str | None) -> Any:
    env = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9"}
    if secret is not None:
        env["GATEWAY_USER_POOL_SECRET_KEY"] = secret
    return build_settings(env)


def test_the_secret_key_is_optional_and_never_in_a_repr() -> None:
    assert settings_with(None).user_pool_secret_key is None
    key = base64.b64encode(bytes(range(32))).decode()
    settings = settings_with(key)
    assert settings.user_pool_secret_key == key
    assert user_pool_secret(settings.user_pool_secret_key) == bytes(range(32))
    assert key not in repr(settings)


def test_a_url_safe_key_is_accepted() -> None:
    raw = bytes([251, 255] * 24)  # encodes with '-' and '_' in the URL-safe alphabet
    key = base64.urlsafe_b64encode(raw).decode()
    assert "-" in key or "_" in key
    assert user_pool_secret(key) == raw


@pytest.mark.parametrize(
    "value",
    [
        base64.b64encode(b"k" * 31).decode(),  # 248 bits
        "not base64 at all!",
        "",
    ],
)
def test_a_bad_secret_key_stops_the_gateway_naming_the_variable_not_the_value(value: str) -> None:
    with pytest.raises(ConfigError) as failure:
        settings_with(value)
    assert failure.value.key == "GATEWAY_USER_POOL_SECRET_KEY"
    assert "32" in str(failure.value) or "base64" in str(failure.value)
    if value:
        assert value not in str(failure.value)
