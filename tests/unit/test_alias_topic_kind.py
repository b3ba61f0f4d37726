"""The AliasTopic kind through the admin API: what an operator stores, sees and is refused, and what
reaches the gateway (its aliases, by virtual cluster)."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from admin_harness import serve_admin

from kanal.admin.app import AdminApi
from kanal.admin.service import build_admin
from kanal.admin.store import MemoryLog
from kanal.config.settings import build_settings
from kanal.gateway import Gateway
from kanal.pipeline.registry import PluginRegistry

USERS = "[{username: admin, password: secret, admin: true}]"
ADMIN = {"Authorization": "Basic " + base64.b64encode(b"admin:secret").decode()}
PATH = "/gateway/v2/alias-topic"
Client = Any
SASL = {
    "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(secrets.token_bytes(32)).decode(),
}
KAFKA_MANAGED = {"GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "GATEWAY_SECURITY_MODE": "KAFKA_MANAGED"}


def run_admin(body: Callable[[AdminApi, Client], Awaitable[None]], env: dict[str, str] = SASL) -> AdminApi:
    settings = build_settings({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "GATEWAY_ADMIN_API_USERS": USERS, **env})
    api = build_admin(Gateway(settings, PluginRegistry()), writer=MemoryLog())
    return serve_admin(api, body)


def alias(name: str, physical: object = "shared.orders", vcluster: str | None = "team-a.", **extra: Any) -> Any:
    metadata: dict[str, Any] = {"name": name}
    if vcluster is not None:
        metadata["vCluster"] = vcluster
    spec: dict[str, Any] = {} if physical is None else {"physicalName": physical}
    manifest: dict[str, Any] = {"apiVersion": "gateway/v2", "kind": "AliasTopic", "metadata": metadata, "spec": spec}
    for path, value in extra.items():  # metadata__x=1 -> metadata.x, spec__y=2 -> spec.y
        part, field = path.split("__")
        manifest[part][field] = value
    return manifest


async def put(client: Client, manifest: Any) -> tuple[int, Any]:
    response = await client.put(PATH, json=manifest, headers=ADMIN)
    return response.status_code, await response.get_json()


def aliases_of(api: AdminApi, vcluster: str | None) -> dict[str, str]:
    gateway = api.gateway
    assert isinstance(gateway, Gateway)
    return dict(gateway.aliases.of(vcluster))


def test_an_alias_is_stored_listed_with_both_keys_applied_and_deleted() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        status, answer = await put(client, alias("orders"))
        assert status == 200 and answer["upsertResult"] == "CREATED", answer
        assert answer["resource"]["metadata"] == {"name": "orders", "vCluster": "team-a."}
        assert answer["resource"]["spec"] == {"physicalName": "shared.orders"}
        assert aliases_of(api, "team-a.") == {"orders": "shared.orders"}
        # The same name in another virtual cluster is another alias.
        assert (await put(client, alias("orders", "other.orders", vcluster="team-b.")))[0] == 200
        assert aliases_of(api, "team-b.") == {"orders": "other.orders"}
        assert aliases_of(api, "team-a.") == {"orders": "shared.orders"}

        listed = await (await client.get(PATH, headers=ADMIN)).get_json()
        assert sorted((m["metadata"]["name"], m["metadata"]["vCluster"]) for m in listed) == [
            ("orders", "team-a."),
            ("orders", "team-b."),
        ]
        only_a = await (await client.get(PATH + "?vcluster=team-a.", headers=ADMIN)).get_json()
        assert [m["spec"]["physicalName"] for m in only_a] == ["shared.orders"]
        one = await client.get(PATH + "/orders?vCluster=team-b.", headers=ADMIN)
        assert one.status_code == 200 and (await one.get_json())["spec"]["physicalName"] == "other.orders"
        # Read back and put again: nothing changes.
        assert (await put(client, answer["resource"]))[1]["upsertResult"] == "NOT_CHANGED"

        deleted = await client.delete(PATH + "/orders", json={"vCluster": "team-a."}, headers=ADMIN)
        assert deleted.status_code == 204
        assert aliases_of(api, "team-a.") == {}
        assert aliases_of(api, "team-b.") == {"orders": "other.orders"}
        gone = await client.get(PATH + "/orders?vCluster=team-a.", headers=ADMIN)
        assert gone.status_code == 404

    run_admin(body)


def test_the_kind_is_described() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        kinds = await (await client.get("/gateway/v2/resource-kinds", headers=ADMIN)).get_json()
        (described,) = [k for k in kinds if k["kind"] == "AliasTopic"]
        assert described["path"] == "alias-topic" and described["keyFields"] == ["vCluster"]
        assert described["description"] and "\n" not in described["description"]

    run_admin(body)


@pytest.mark.parametrize(
    ("manifest", "field"),
    [
        (alias("orders", metadata__namespace="x"), "'namespace'"),
        (alias("orders", spec__partitions=3), "'partitions'"),
        (alias("orders", vcluster="bad prefix"), "metadata.vCluster"),
        (alias("orders", physical=None), "spec.physicalName"),
        (alias("orders", physical="no spaces"), "spec.physicalName"),
        (alias("orders", physical=".."), "spec.physicalName"),
        (alias("orders", physical="x" * 250), "spec.physicalName"),
        (alias("orders", physical=7), "spec.physicalName"),
        (alias("bad name"), "metadata.name"),
        (alias(".."), "metadata.name"),
        (alias("x" * 250), "metadata.name"),
    ],
)
def test_a_bad_field_is_a_400_naming_it(manifest: Any, field: str) -> None:
    async def body(api: AdminApi, client: Client) -> None:
        status, answer = await put(client, manifest)
        assert status == 400 and field in answer["msg"], answer
        assert aliases_of(api, "team-a.") == {}
        assert await (await client.get(PATH, headers=ADMIN)).get_json() == []

    run_admin(body)


def test_an_alias_without_a_virtual_cluster_is_the_passthrough_cluster_s_even_on_plaintext() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        status, answer = await put(client, alias("orders-v2", "orders", vcluster=None))
        assert status == 200, answer
        assert aliases_of(api, None) == {"orders-v2": "orders"} and aliases_of(api, "team-a.") == {}
        status, answer = await put(client, alias("v3", "orders-v2", vcluster=None))  # where orders-v2 would be
        assert status == 409 and "no alias of an alias" in answer["msg"] and "passthrough" in answer["msg"], answer

    run_admin(body, env={})


def test_a_name_too_long_with_the_prefix_is_refused_naming_kafkas_limit() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        fits = "x" * (249 - len("team-a."))
        assert (await put(client, alias(fits)))[0] == 200
        status, answer = await put(client, alias(fits + "y"))
        assert status == 400 and "metadata.name" in answer["msg"] and "249" in answer["msg"], answer
        assert list(aliases_of(api, "team-a.")) == [fits]

    run_admin(body)


@pytest.mark.parametrize("env", [{}, KAFKA_MANAGED], ids=["plaintext", "kafka-managed"])
def test_a_gateway_that_does_not_authenticate_its_clients_refuses_aliases(env: dict[str, str]) -> None:
    async def body(api: AdminApi, client: Client) -> None:
        status, answer = await put(client, alias("orders"))
        assert status == 409 and "need clients the gateway authenticates" in answer["msg"], answer
        assert aliases_of(api, "team-a.") == {}
        status, answer = await put(client, alias("orders", vcluster=None))
        if env == KAFKA_MANAGED:  # the cluster's own ACLs would see names the gateway changed
            assert status == 409 and "KAFKA_MANAGED" in answer["msg"], answer
        else:
            assert status == 200, answer

    run_admin(body, env=env)


@pytest.mark.parametrize("target_first", [True, False], ids=["target-first", "pointer-first"])
def test_no_alias_of_an_alias_whichever_comes_first(target_first: bool) -> None:
    target = alias("shadow", "shared.orders")
    pointer = alias("orders", "team-a.shadow")  # where the alias "shadow" of team-a. is stored

    async def body(api: AdminApi, client: Client) -> None:
        first, second = (target, pointer) if target_first else (pointer, target)
        assert (await put(client, first))[0] == 200
        status, answer = await put(client, second)
        assert status == 409 and "no alias of an alias" in answer["msg"], answer
        assert "'orders'" in answer["msg"] and "'shadow'" in answer["msg"]
        stored = first["metadata"]["name"]
        assert aliases_of(api, "team-a.") == {stored: first["spec"]["physicalName"]}
        # The same physical name in another virtual cluster is no alias of an alias there.
        assert (await put(client, alias("orders", "team-a.shadow", vcluster="team-b.")))[0] == 200

    run_admin(body)


def test_an_alias_of_itself_and_updates_of_the_same_alias() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        status, answer = await put(client, alias("orders", "team-a.orders"))
        assert status == 409 and "no alias of an alias" in answer["msg"], answer
        # Changing an alias's physical name is checked against the others, not its own old version.
        assert (await put(client, alias("orders", "shared.orders")))[0] == 200
        status, answer = await put(client, alias("orders", "shared.orders-v2"))
        assert status == 200 and answer["upsertResult"] == "UPDATED", answer
        assert aliases_of(api, "team-a.") == {"orders": "shared.orders-v2"}

    run_admin(body)
