"""``POST /gateway/v2/token``: gateway tokens for LOCAL service accounts, as an operator gets them.

The admin app runs for real (quart-trio test client) on an in-memory state log. A minted token is
checked the way the listener will check it, with :func:`kanal.identity.tokens.verify` and the same
secret.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import jwt
import pytest
import trio

from kanal.admin.app import AdminApi
from kanal.admin.service import build_admin
from kanal.admin.store import MemoryLog
from kanal.config.settings import build_settings
from kanal.gateway import Gateway
from kanal.identity.tokens import TokenClaims, TokenProblem, verify
from kanal.pipeline.registry import PluginRegistry

USERS = "[{username: admin, password: secret, admin: true}, {username: viewer, password: look}]"
ADMIN = {"Authorization": "Basic " + base64.b64encode(b"admin:secret").decode()}
VIEWER = {"Authorization": "Basic " + base64.b64encode(b"viewer:look").decode()}
SECRET = bytes(range(100, 132))
SECRET_TEXT = base64.b64encode(SECRET).decode()
TOKEN = "/gateway/v2/token"

Client = Any


def run_admin(body: Callable[[AdminApi, Client], Awaitable[None]], *, secret: str | None = SECRET_TEXT) -> None:
    env = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "GATEWAY_ADMIN_API_USERS": USERS}
    if secret is not None:
        env["GATEWAY_USER_POOL_SECRET_KEY"] = secret
    api = build_admin(Gateway(build_settings(env), PluginRegistry()), writer=MemoryLog())

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(api.store.run)
            async with api.app.test_app() as app:
                client = app.test_client()
                for manifest in (
                    account("app1", {"type": "LOCAL"}),
                    account("app1", {"type": "LOCAL"}, vcluster="tenant-a"),
                    account("partner", {"type": "EXTERNAL", "externalNames": ["0oa-partner"]}),
                ):
                    assert (
                        await client.put("/gateway/v2/service-account", json=manifest, headers=ADMIN)
                    ).status_code == 200
                await body(api, client)
            nursery.cancel_scope.cancel()

    trio.run(main)


def account(name: str, spec: dict[str, Any], vcluster: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if vcluster is not None:
        metadata["vCluster"] = vcluster
    return {"apiVersion": "gateway/v2", "kind": "GatewayServiceAccount", "metadata": metadata, "spec": spec}


async def post(client: Client, body: Any, headers: dict[str, str] = ADMIN) -> tuple[int, Any]:
    response = await client.post(TOKEN, json=body, headers=headers)
    return response.status_code, await response.get_json()


def test_a_token_for_a_local_account_verifies_with_the_same_secret() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        before = int(time.time())
        status, answer = await post(client, {"username": "app1", "lifeTimeSeconds": 3600})
        after = int(time.time())
        assert status == 200 and set(answer) == {"token"}
        claims = verify(answer["token"], SECRET)
        assert isinstance(claims, TokenClaims)
        assert (claims.username, claims.vcluster) == ("app1", None)
        assert before + 3600 <= claims.expires_at <= after + 3600
        assert verify(answer["token"], b"another key of at least 32 bytes") is TokenProblem.BAD_SIGNATURE
        raw = jwt.decode(answer["token"], options={"verify_signature": False})
        assert raw["exp"] - raw["iat"] == 3600

    run_admin(body)


def test_the_virtual_cluster_is_in_the_token() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        status, answer = await post(client, {"username": "app1", "vCluster": "tenant-a", "lifeTimeSeconds": 60})
        assert status == 200
        claims = verify(answer["token"], SECRET)
        assert isinstance(claims, TokenClaims) and (claims.username, claims.vcluster) == ("app1", "tenant-a")

    run_admin(body)


@pytest.mark.parametrize("lifetime", ["missing", 0, -60, 1.5, "3600", True, None, 2**31])
def test_the_lifetime_is_mandatory_and_a_positive_integer(lifetime: Any) -> None:
    request: dict[str, Any] = {"username": "app1"}
    if lifetime != "missing":
        request["lifeTimeSeconds"] = lifetime

    async def body(api: AdminApi, client: Client) -> None:
        status, error = await post(client, request)
        assert status == 400 and set(error) == {"title", "msg", "cause"}
        assert "lifeTimeSeconds" in error["msg"]

    run_admin(body)


@pytest.mark.parametrize(
    ("request_body", "expected"),
    [
        ({"lifeTimeSeconds": 60}, "username"),
        ({"username": 5, "lifeTimeSeconds": 60}, "username"),
        ({"username": "app1", "vCluster": ["a"], "lifeTimeSeconds": 60}, "vCluster"),
        ({"username": "app1", "lifeTimeSeconds": 60, "password": "x"}, "'password'"),
        (["app1", 60], "JSON object"),
    ],
)
def test_a_bad_body_is_refused_naming_the_field(request_body: Any, expected: str) -> None:
    async def body(api: AdminApi, client: Client) -> None:
        status, error = await post(client, request_body)
        assert status == 400 and expected in error["msg"]

    run_admin(body)


def test_an_unknown_account_gets_no_token() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        status, error = await post(client, {"username": "nobody", "lifeTimeSeconds": 60})
        assert status == 404 and "'nobody'" in error["msg"] and "GatewayServiceAccount" in error["msg"]
        # app1 exists, but not in this virtual cluster
        status, error = await post(client, {"username": "app1", "vCluster": "tenant-b", "lifeTimeSeconds": 60})
        assert status == 404 and "tenant-b" in error["msg"]
        # a deleted account gets no more tokens
        deleted = await client.delete("/gateway/v2/service-account/app1", headers=ADMIN)
        assert deleted.status_code == 204
        assert (await post(client, {"username": "app1", "lifeTimeSeconds": 60}))[0] == 404

    run_admin(body)


def test_an_external_account_gets_no_token() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        status, error = await post(client, {"username": "partner", "lifeTimeSeconds": 60})
        assert status == 409 and "EXTERNAL" in error["msg"] and "LOCAL" in error["msg"]

    run_admin(body)


def test_without_the_secret_key_no_token_is_minted() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        status, error = await post(client, {"username": "app1", "lifeTimeSeconds": 60})
        assert status == 409 and set(error) == {"title", "msg", "cause"}
        assert "GATEWAY_USER_POOL_SECRET_KEY is not set" in error["msg"]
        assert "token" not in error

    run_admin(body, secret=None)


def test_only_admin_users_mint_tokens() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        request = {"username": "app1", "lifeTimeSeconds": 60}
        assert (await post(client, request, headers={}))[0] == 401
        status, error = await post(client, request, headers=VIEWER)
        assert status == 403 and "read-only" in error["msg"]

    run_admin(body)


def test_minting_is_audited_without_the_token_or_the_secret(caplog: pytest.LogCaptureFixture) -> None:
    minted: list[str] = []

    async def body(api: AdminApi, client: Client) -> None:
        status, answer = await post(client, {"username": "app1", "vCluster": "tenant-a", "lifeTimeSeconds": 60})
        assert status == 200
        minted.append(answer["token"])

    with caplog.at_level("DEBUG"):
        run_admin(body)
    events = [vars(r) for r in caplog.records if r.name == "kanal.audit" and getattr(r, "action", None) == "MINT_TOKEN"]
    assert len(events) == 1
    event = events[0]
    assert (event["event"], event["kind"], event["resourceName"]) == ("ADMIN_API", "GatewayServiceAccount", "app1")
    assert (event["scope"], event["lifeTimeSeconds"], event["user"]) == ({"vCluster": "tenant-a"}, 60, "admin")
    everything = "\n".join(f"{r.getMessage()} {vars(r)}" for r in caplog.records if isinstance(r, logging.LogRecord))
    assert minted[0] not in everything
    assert minted[0].split(".")[2] not in everything  # not even the signature
    assert SECRET_TEXT not in everything


def test_the_route_and_the_kind_are_in_the_openapi_document() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        document = await (await client.get("/openapi.json")).get_json()
        operation = document["paths"][TOKEN]["post"]
        assert operation["summary"].startswith("Mints a gateway token")
        assert "GATEWAY_USER_POOL_SECRET_KEY" in operation["description"]
        schema = document["components"]["schemas"]["GatewayServiceAccount"]
        assert schema["properties"]["spec"]["properties"]["type"]["enum"] == ["LOCAL", "EXTERNAL"]

    run_admin(body)
