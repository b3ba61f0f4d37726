"""The VirtualCluster kind through the admin API: what an operator stores, sees and is refused, and
what reaches the gateway (its virtual clusters, their ACL configuration, their chains)."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from admin_harness import serve_admin

from kanal.admin.app import AdminApi
from kanal.admin.service import build_admin
from kanal.admin.store import MemoryLog
from kanal.authz.enforcer import AclEnforcer
from kanal.config.settings import build_settings
from kanal.gateway import Gateway
from kanal.pipeline.registry import PluginRegistry
from kanal.pipeline.topic_ids import TopicIdsOff
from kanal.protocol.acl_codes import Operation, ResourceType
from kanal.tenancy.interceptor import VirtualClusterNames

USERS = "[{username: admin, password: secret, admin: true}]"
ADMIN = {"Authorization": "Basic " + base64.b64encode(b"admin:secret").decode()}
PATH = "/gateway/v2/virtual-cluster"
Client = Any
SASL = {
    "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(secrets.token_bytes(32)).decode(),
    "GATEWAY_ADVERTISED_HOST": "gateway.example",
}


def run_admin(body: Callable[[AdminApi, Client], Awaitable[None]], env: dict[str, str] = SASL) -> AdminApi:
    settings = build_settings({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "GATEWAY_ADMIN_API_USERS": USERS, **env})
    api = build_admin(Gateway(settings, PluginRegistry()), writer=MemoryLog())
    return serve_admin(api, body)


def cluster(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "gateway/v2", "kind": "VirtualCluster", "metadata": {"name": name}, "spec": spec}


async def put(client: Client, manifest: Any) -> tuple[int, Any]:
    response = await client.put(PATH, json=manifest, headers=ADMIN)
    return response.status_code, await response.get_json()


def test_a_virtual_cluster_shows_how_to_connect_and_reaches_the_gateway() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        status, answer = await put(client, cluster("team-a."))
        assert status == 200 and answer["upsertResult"] == "CREATED", answer
        spec = answer["resource"]["spec"]
        assert spec["bootstrapServers"] == "gateway.example:6969"
        assert spec["clientProperties"]["security.protocol"] == "SASL_PLAINTEXT"
        assert spec["clientProperties"]["sasl.mechanism"] == "PLAIN"
        assert (spec["aclEnabled"], spec["aclMode"], spec["type"]) == (False, "KAFKA_API", "Standard")
        listed = await (await client.get(PATH, headers=ADMIN)).get_json()
        assert [m["metadata"]["name"] for m in listed] == ["team-a."]
        # Read back and put again (read-only fields included): nothing changes.
        assert (await put(client, answer["resource"]))[1]["upsertResult"] == "NOT_CHANGED"
        gateway = api.gateway
        assert isinstance(gateway, Gateway)
        assert gateway.virtual_clusters.get("team-a.") is not None
        chain = gateway.pipeline.resolve("app", (), "team-a.")
        assert [type(c.instance) for c in chain.interceptors] == [TopicIdsOff, VirtualClusterNames]

    run_admin(body)


def test_rest_api_acls_are_enforced_and_the_admin_api_only_reads_them() -> None:
    acl = {
        "resourcePattern": {"resourceType": "TOPIC", "name": "orders", "patternType": "PREFIXED"},
        "principal": "User:app",
        "operation": "READ",
    }

    async def body(api: AdminApi, client: Client) -> None:
        status, answer = await put(client, cluster("team-a.", aclEnabled=True, aclMode="REST_API", acls=[acl]))
        assert status == 200, answer
        gateway = api.gateway
        assert isinstance(gateway, Gateway)
        chain = gateway.pipeline.resolve("app", (), "team-a.")
        assert [type(c.instance) for c in chain.interceptors] == [AclEnforcer, TopicIdsOff, VirtualClusterNames]
        authorizer = gateway.acls.authorizer("team-a.")
        assert authorizer.allows("User:app", "10.0.0.1", Operation.READ, ResourceType.TOPIC, "orders-1")
        assert not authorizer.allows("User:app", "10.0.0.1", Operation.WRITE, ResourceType.TOPIC, "orders-1")
        assert gateway.acls.declares("team-a.")
        assert not gateway.acls.authorizer(None).allows("User:app", "h", Operation.READ, ResourceType.TOPIC, "orders")

    run_admin(body)


def test_what_cannot_work_is_refused_saying_why() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        assert (await put(client, cluster("team-a.", aclMode="REST_API")))[0] == 200
        status, answer = await put(client, cluster("team-a.", aclMode="KAFKA_API"))
        assert status == 409 and "cannot change" in answer["msg"]
        status, answer = await put(client, cluster("team-a.b"))
        assert status == 409 and "starts with the other" in answer["msg"]
        status, answer = await put(client, cluster("team-b.", aclMode="REST_API", acls=[{"principal": "User:x"}]))
        assert status == 400 and "spec.acls[0]" in answer["msg"] and "resourcePattern" in answer["msg"]
        status, answer = await put(client, cluster("team-c.", superUsers=["admin"], aclMode="REST_API"))
        assert status == 400 and "superUsers" in answer["msg"]
        status, answer = await put(client, cluster("bad name"))
        assert status == 400

    run_admin(body)


def test_a_plaintext_gateway_refuses_virtual_clusters() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        status, answer = await put(client, cluster("team-a."))
        assert status == 409 and "SASL or SSL listener" in answer["msg"]

    run_admin(body, env={})
