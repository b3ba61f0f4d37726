"""SCRAM credentials: the GatewayScramCredential kind through the admin API, and the SCRAM logins the
listener then accepts or refuses.

The admin app runs for real (quart-trio test client) on an in-memory state log, in a gateway set up
for SASL_PLAINTEXT (GATEWAY_MANAGED); logins run the gateway's own per-client exchange
(``gateway.authenticator``) on Kafka request bytes, with the project's SCRAM client.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
from kio.schema.errors import ErrorCode

from kanal.admin.app import AdminApi
from kanal.admin.service import build_admin
from kanal.admin.store import MemoryLog
from kanal.config.settings import build_settings
from kanal.gateway import Gateway
from kanal.pipeline.registry import PluginRegistry
from kanal.protocol.api import ApiKey, require_request_class
from kanal.protocol.messages import decode_response, encode_request
from kanal.protocol.sasl import SaslError, ScramMechanism
from kanal.protocol.sasl_mechanisms import Identity
from kanal.protocol.sasl_server import Action

USERS = "[{username: admin, password: secret, admin: true}, {username: viewer, password: look}]"
ADMIN = {"Authorization": "Basic " + base64.b64encode(b"admin:secret").decode()}
VIEWER = {"Authorization": "Basic " + base64.b64encode(b"viewer:look").decode()}
SECRET_TEXT = base64.b64encode(bytes(range(100, 132))).decode()
OTHER_SECRET_TEXT = base64.b64encode(bytes(range(1, 33))).decode()
PATH = "/gateway/v2/scram-credential"
PASSWORD = "correct horse battery staple"

Client = Any


def gateway_env(secret: str | None = SECRET_TEXT) -> dict[str, str]:
    env = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "GATEWAY_ADMIN_API_USERS": USERS}
    if secret is not None:
        env |= {"GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "GATEWAY_USER_POOL_SECRET_KEY": secret}
    return env


def run_admin(
    body: Callable[[AdminApi, Client], Awaitable[None]],
    *,
    secret: str | None = SECRET_TEXT,
    log: MemoryLog | None = None,
) -> AdminApi:
    api = build_admin(Gateway(build_settings(gateway_env(secret)), PluginRegistry()), writer=log or MemoryLog())

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(api.store.run)
            async with api.app.test_app() as app:
                client = app.test_client()
                for manifest in (
                    account("orders-app", "LOCAL"),
                    account("orders-app", "LOCAL", vcluster="tenant-a"),
                    account("tenant-app", "LOCAL", vcluster="tenant-a"),
                    {**account("partner", "EXTERNAL"), "spec": {"type": "EXTERNAL", "externalNames": ["0oa-p"]}},
                ):
                    answer = await client.put("/gateway/v2/service-account", json=manifest, headers=ADMIN)
                    assert answer.status_code == 200, await answer.get_json()
                await body(api, client)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return api


def account(name: str, kind: str, vcluster: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if vcluster is not None:
        metadata["vCluster"] = vcluster
    return {"apiVersion": "gateway/v2", "kind": "GatewayServiceAccount", "metadata": metadata, "spec": {"type": kind}}


def credential(name: str, spec: dict[str, Any], vcluster: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if vcluster is not None:
        metadata["vCluster"] = vcluster
    return {"apiVersion": "gateway/v2", "kind": "GatewayScramCredential", "metadata": metadata, "spec": spec}


async def put(client: Client, manifest: Any, headers: dict[str, str] = ADMIN) -> tuple[int, Any]:
    response = await client.put(PATH, json=manifest, headers=headers)
    return response.status_code, await response.get_json()


def request(api_key: int, version: int, correlation_id: int, **fields: Any) -> bytes:
    return bytes(encode_request(require_request_class(api_key, version)(**fields), correlation_id, "test-client"))


def scram_login(api: AdminApi, mechanism: str, user: str, password: str) -> Identity | None:
    """Logs in through the gateway's SASL exchange for a new client: the identity, or None when refused."""
    gateway = api.gateway
    assert isinstance(gateway, Gateway)
    auth = gateway.authenticator("10.0.0.1")
    assert auth is not None
    step = auth.feed(request(ApiKey.SASL_HANDSHAKE, 1, 1, mechanism=mechanism))
    assert step.action is Action.SEND
    client = ScramMechanism(mechanism, user, password)
    message: bytes | None = client.start()
    correlation = 2
    while message is not None:
        step = auth.feed(request(ApiKey.SASL_AUTHENTICATE, 2, correlation, auth_bytes=message))
        answer = decode_response(ApiKey.SASL_AUTHENTICATE, 2, bytes(step.response or b""))
        if answer.error_code != ErrorCode.none:
            assert answer.error_code == ErrorCode.sasl_authentication_failed and step.action is Action.CLOSE
            assert password not in (answer.error_message or "")
            return None
        if step.authenticated:
            try:
                assert client.step(answer.auth_bytes) is None  # the client checks the server's signature
            except SaslError:
                pytest.fail("the gateway's server signature did not verify")
            return auth.identity
        message = client.step(answer.auth_bytes)
        correlation += 1
    pytest.fail("the exchange ended without an answer")


def no_secrets(text: str) -> None:
    assert PASSWORD not in text
    for field in ("storedKey", "serverKey", "salt", "password"):
        assert f'"{field}"' not in text, field


# -- the kind over HTTP -----------------------------------------------------------------------------


def test_a_credential_is_stored_salted_and_sealed_and_shows_only_mechanisms_and_iterations() -> None:
    log = MemoryLog()

    async def body(api: AdminApi, client: Client) -> None:
        status, answer = await put(client, credential("orders-app", {"password": PASSWORD}))
        assert (status, answer["upsertResult"]) == (200, "CREATED"), answer
        resource = answer["resource"]
        assert resource["metadata"] == {"name": "orders-app"}
        assert set(resource["spec"]) == {"mechanisms", "iterations", "sealedKeys"}
        assert resource["spec"]["mechanisms"] == ["SCRAM-SHA-256", "SCRAM-SHA-512"]
        assert resource["spec"]["iterations"] == 4096
        assert resource["status"] == {"status": "Ready"}
        listed = await (await client.get(PATH, headers=VIEWER)).get_data(as_text=True)
        one = await (await client.get(f"{PATH}/orders-app", headers=VIEWER)).get_data(as_text=True)
        for text in (json.dumps(answer), listed, one):
            no_secrets(text)
        assert json.loads(one)["spec"] == resource["spec"]

    run_admin(body, log=log)
    stored = b"".join(record.value or b"" for record in log.records).decode()
    no_secrets(stored)  # nor in the state topic


def test_clients_log_in_with_the_password_for_each_mechanism_and_get_the_account_identity() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        spec = {"password": PASSWORD, "mechanisms": ["scram-sha-512"], "iterations": 8192}
        status, answer = await put(client, credential("tenant-app", spec, vcluster="tenant-a"))
        assert status == 200 and answer["resource"]["spec"]["iterations"] == 8192
        assert scram_login(api, "SCRAM-SHA-512", "tenant-app", PASSWORD) == Identity(
            "tenant-app", vcluster="tenant-a", local=True
        )
        assert scram_login(api, "SCRAM-SHA-256", "tenant-app", PASSWORD) is None  # not enabled for it
        assert scram_login(api, "SCRAM-SHA-512", "tenant-app", "wrong") is None
        assert scram_login(api, "SCRAM-SHA-512", "nobody", PASSWORD) is None

        assert (await put(client, credential("orders-app", {"password": "other"})))[0] == 200
        assert scram_login(api, "SCRAM-SHA-256", "orders-app", "other") == Identity("orders-app", local=True)

    run_admin(body)


def test_applying_the_same_password_again_changes_nothing_and_a_new_one_replaces_it() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        manifest = credential("orders-app", {"password": PASSWORD, "mechanisms": ["SCRAM-SHA-512"]})
        _, first = await put(client, manifest)
        _, again = await put(client, manifest)
        assert again["upsertResult"] == "NOT_CHANGED" and again["resource"] == first["resource"]
        shown = await (await client.get(f"{PATH}/orders-app", headers=ADMIN)).get_json()
        assert (await put(client, shown))[1]["upsertResult"] == "NOT_CHANGED"  # a GET's output PUT back

        _, changed = await put(client, credential("orders-app", {"password": "new", "mechanisms": ["SCRAM-SHA-512"]}))
        assert changed["upsertResult"] == "UPDATED"
        assert scram_login(api, "SCRAM-SHA-512", "orders-app", "new") == Identity("orders-app", local=True)
        assert scram_login(api, "SCRAM-SHA-512", "orders-app", PASSWORD) is None

    run_admin(body)


def test_deleting_the_credential_or_the_account_stops_new_logins() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        await put(client, credential("orders-app", {"password": PASSWORD}))
        await put(client, credential("tenant-app", {"password": PASSWORD}, vcluster="tenant-a"))
        assert scram_login(api, "SCRAM-SHA-512", "orders-app", PASSWORD) == Identity("orders-app", local=True)

        assert (await client.delete(f"{PATH}/orders-app", headers=ADMIN)).status_code == 204
        assert scram_login(api, "SCRAM-SHA-512", "orders-app", PASSWORD) is None

        assert scram_login(api, "SCRAM-SHA-512", "tenant-app", PASSWORD) is not None
        gone = await client.delete(
            "/gateway/v2/service-account/tenant-app", json={"vCluster": "tenant-a"}, headers=ADMIN
        )
        assert gone.status_code == 204
        assert scram_login(api, "SCRAM-SHA-512", "tenant-app", PASSWORD) is None

    run_admin(body)


@pytest.mark.parametrize(
    ("manifest", "status", "reason"),
    [
        (credential("orders-app", {}), 400, "spec.password is required"),
        (credential("orders-app", {"password": ""}), 400, "spec.password must be a non-empty string"),
        (credential("orders-app", {"password": 12345}), 400, "spec.password must be a non-empty string"),
        (credential("orders-app", {"password": PASSWORD, "iterations": 4095}), 400, "from 4096 to 16384"),
        (credential("orders-app", {"password": PASSWORD, "iterations": 16385}), 400, "from 4096 to 16384"),
        (credential("orders-app", {"password": PASSWORD, "iterations": "many"}), 400, "spec.iterations"),
        (credential("orders-app", {"password": PASSWORD, "mechanisms": ["SCRAM-SHA-1"]}), 400, "'SCRAM-SHA-1'"),
        (credential("orders-app", {"password": PASSWORD, "mechanisms": []}), 400, "non-empty list"),
        (
            credential("orders-app", {"password": PASSWORD, "mechanisms": ["SCRAM-SHA-256", "scram-sha-256"]}),
            400,
            "twice",
        ),
        (credential("orders-app", {"password": PASSWORD, "storedKey": "x"}), 400, "unknown spec field 'storedKey'"),
        (credential("ghost", {"password": PASSWORD}), 400, "'ghost' does not exist"),
        (credential("orders-app", {"password": PASSWORD}, vcluster="tenant-b"), 400, "does not exist"),
        (credential("partner", {"password": PASSWORD}), 409, "EXTERNAL"),
        (credential("orders-app", {"sealedKeys": "v1.AAAA"}), 400, "spec.sealedKeys cannot be used here"),
    ],
    ids=[
        "no-password",
        "empty-password",
        "number-password",
        "too-few-iterations",
        "too-many-iterations",
        "iterations-not-a-number",
        "unknown-mechanism",
        "no-mechanism",
        "mechanism-twice",
        "stored-key-given",
        "no-account",
        "account-in-another-vcluster",
        "external-account",
        "garbage-sealed-keys",
    ],
)
def test_bad_input_is_refused_with_a_reason_and_the_password_never_echoed(
    manifest: dict[str, Any], status: int, reason: str
) -> None:
    async def body(api: AdminApi, client: Client) -> None:
        code, error = await put(client, manifest)
        assert code == status and reason in error["msg"], error
        assert PASSWORD not in json.dumps(error)
        assert (await client.get(PATH, headers=ADMIN)).status_code == 200
        assert await (await client.get(PATH, headers=ADMIN)).get_json() == []  # nothing stored

    run_admin(body)


def test_a_scram_user_name_belongs_to_one_account() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        assert (await put(client, credential("orders-app", {"password": PASSWORD})))[0] == 200
        status, error = await put(client, credential("orders-app", {"password": PASSWORD}, vcluster="tenant-a"))
        assert status == 409 and "already belongs to 'orders-app'" in error["msg"]

    run_admin(body)


def test_sealed_keys_cannot_be_moved_to_another_account_or_other_settings() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        _, answer = await put(client, credential("orders-app", {"password": PASSWORD}))
        sealed = answer["resource"]["spec"]["sealedKeys"]
        status, error = await put(client, credential("tenant-app", {"sealedKeys": sealed}, vcluster="tenant-a"))
        assert status == 400 and "sealed for another resource" in error["msg"]
        status, error = await put(client, credential("orders-app", {"sealedKeys": sealed, "iterations": 8192}))
        assert status == 400 and "give spec.password instead" in error["msg"]

    run_admin(body)


def test_without_a_user_pool_key_no_credential_is_accepted() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        status, error = await put(client, credential("orders-app", {"password": PASSWORD}))
        assert status == 409 and "GATEWAY_USER_POOL_SECRET_KEY is not set" in error["msg"]

    run_admin(body, secret=None)


def test_a_node_with_another_user_pool_key_reports_the_credential_failed_and_refuses_its_logins() -> None:
    log = MemoryLog()

    async def write(api: AdminApi, client: Client) -> None:
        assert (await put(client, credential("orders-app", {"password": PASSWORD})))[0] == 200

    async def read(api: AdminApi, client: Client) -> None:
        shown = await (await client.get(f"{PATH}/orders-app", headers=ADMIN)).get_json()
        assert shown["status"]["status"] == "Failed"
        assert "apply the credential again with its password" in shown["status"]["message"]
        assert scram_login(api, "SCRAM-SHA-512", "orders-app", PASSWORD) is None

    run_admin(write, log=log)
    run_admin(read, secret=OTHER_SECRET_TEXT, log=log)


def test_a_read_only_user_cannot_set_a_password() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        status, _ = await put(client, credential("orders-app", {"password": PASSWORD}), headers=VIEWER)
        assert status == 403
        assert scram_login(api, "SCRAM-SHA-512", "orders-app", PASSWORD) is None

    run_admin(body)
