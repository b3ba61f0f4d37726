"""The gateway KMS in its inline form, without a KMS connection: ``kmsConfig.gateway.masterKeyId`` a
KMS key URI (its block beside it in ``kmsConfig``), fields naming ``keySecretId: gateway-kms://...``.

- the parsed block, and the locator resolving ``gateway-kms://`` keys over the keys topic (an
  in-memory master and topic) beside other inline keys;
- the config errors, each naming the key at fault, from the interceptors as the gateway builds them;
- end to end with real clients (confluent-kafka), a real broker (Tansu), OpenBao holding the master
  key and a gateway process: the broker holds ciphertext, a decrypting consumer reads clear text,
  ``DELETE /gateway/v2/encryption-key/<keyId>`` shreds one user's records (returned encrypted) while
  the others and a field under another inline key stay readable, and that user's new records get a
  fresh key.

Nothing waits a fixed time: each step polls for the state it expects, with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio
from kafka_clients import consume, create_topic, produce
from kanal_encryption.crypto.envelope import TEXT_MAGIC
from kanal_encryption.interceptors import DecryptionInterceptor, EncryptionInterceptor
from kanal_encryption.keys import Locator
from kanal_encryption.kms.factory import KmsPool
from kanal_encryption.kms.gateway import GatewayKms
from kanal_encryption.kms.inline import GatewayInline, KeySecretId, parse_kms_config
from kanal_encryption.kms.keystore import keystore_of
from kanal_encryption.kms.memory import InMemoryKms

from kanal.api import InterceptorConfigError
from kanal.api.interceptor import Interceptor, validate_config
from kanal.embedded import TansuBroker
from kanal.embedded.admin_http import AdminHttp
from kanal.embedded.gateway_process import GatewayProcess
from kanal.testing import FakeServices

if TYPE_CHECKING:
    from conftest import OpenBao

USERS = "[{username: admin, password: secret, admin: true}]"
MASTER = "vault-kms://vault:8200/transit/keys/gateway-master"
VAULT = {"uri": "http://vault:8200", "token": "t"}
Records = list[tuple[str, dict[str, Any]]]


# -- the block and the locator


def test_the_inline_gateway_block_is_parsed_not_ignored() -> None:
    config = parse_kms_config({"gateway": {"masterKeyId": MASTER, "maxKeys": 10}, "vault": VAULT})
    assert config.gateway == GatewayInline(
        KeySecretId("vault-kms", "gateway-master", "vault:8200", "transit", MASTER), max_keys=10
    )
    defaults = parse_kms_config({"gateway": {"masterKeyId": "in-memory-kms://master"}})
    assert defaults.gateway is not None and defaults.gateway.max_keys == 1_000_000
    assert parse_kms_config({"vault": VAULT}).gateway is None


def test_the_locator_resolves_gateway_kms_uris_beside_other_inline_keys() -> None:
    async def main() -> None:
        services = FakeServices(cluster_id="inline")
        store = keystore_of(services)
        inline = parse_kms_config({"gateway": {"masterKeyId": "in-memory-kms://master", "maxKeys": 7}})
        pool = KmsPool()
        locator = Locator({}, pool, None, inline, None, lambda: store)
        assert locator.check(None, "gateway-kms://user-{{record.key}}", "f") == "gateway-kms://user-{{record.key}}"
        assert locator.check(None, "in-memory-kms://other", "f") == "in-memory-kms://other"
        where = locator.locate("gateway-kms://user-alice@example.com")
        gateway = where.kms
        assert isinstance(gateway, GatewayKms) and gateway is locator.gateway
        assert (where.key_id, where.key_ref) == ("user-alice@example.com", "gateway-kms://user-alice@example.com")
        assert (gateway.master_ref, gateway.master_key_id, gateway.max_keys) == ("in-memory-kms://master", "master", 7)
        assert isinstance(gateway.master, InMemoryKms) and gateway.store is store
        other = locator.locate("in-memory-kms://other")
        assert other.kms is gateway.master and other.key_ref == "in-memory-kms://other"  # one client per KMS
        assert locator.find("gateway-kms://user-x") == (gateway, "user-x")
        assert locator.reach("gateway-kms://user-x") == (gateway, "user-x")
        with pytest.raises(InterceptorConfigError, match="control"):
            locator.locate("gateway-kms://bad\nkey")
        with pytest.raises(InterceptorConfigError, match=r"kmsConfig\.gateway"):
            Locator({}, pool, None, parse_kms_config({"keyTtlMs": 0}), None, lambda: store).find("gateway-kms://u")

        async with trio.open_nursery() as nursery:
            for task, args in services.tasks:  # the keys topic's follower
                nursery.start_soon(task, *args)
            edek = await gateway.wrap("user-alice@example.com", b"d" * 32)
            [record] = services.logs["_kanal_inline_encryption_keys"].records
            assert json.loads(record.value or b"")["masterKeyId"] == "in-memory-kms://master"
            assert await gateway.unwrap("user-alice@example.com", edek) == b"d" * 32
            assert await store.delete("user-alice@example.com") == 1
            nursery.cancel_scope.cancel()
        await pool.aclose()

    trio.run(main)


# -- config errors, as the gateway builds the interceptors


CONNECTION = {  # a KMS connection, for the configs mixing both forms
    "GATEWAY_EXTERNAL_CONNECTION_VAULT_TYPE": "VAULT",
    "GATEWAY_EXTERNAL_CONNECTION_VAULT_CONFIG_URI": "http://127.0.0.1:1",
    "GATEWAY_EXTERNAL_CONNECTION_VAULT_CONFIG_TOKEN": "t",
}


def _build(cls: type[Interceptor], config: dict[str, Any]) -> Interceptor:
    return cls(validate_config(cls, config), FakeServices(settings=CONNECTION))


def _email(key_secret_id: str) -> dict[str, Any]:
    return {"recordValue": {"fields": [{"fieldName": "email", "keySecretId": key_secret_id}]}}


GATEWAY_KEY = _email("gateway-kms://user-{{record.key}}")
INLINE = {"gateway": {"masterKeyId": MASTER}, "vault": VAULT}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"kmsConfig": {"vault": VAULT}, **GATEWAY_KEY},
            "recordValue.fields[0].keySecretId: 'gateway-kms://user-{{record.key}}' is a gateway KMS key: "
            "set kmsConfig.gateway",
        ),
        (
            {"kmsConfig": {"gateway": {"masterKeyId": "gateway-master"}, "vault": VAULT}, **GATEWAY_KEY},
            "kmsConfig.gateway.masterKeyId: 'gateway-master' is not a KMS key URI",
        ),
        (
            {"kmsConfig": {"gateway": {"masterKeyId": MASTER}}, **GATEWAY_KEY},
            f"kmsConfig.gateway.masterKeyId: {MASTER!r} needs a kmsConfig.vault block",
        ),
        (
            {"kmsConfig": {"gateway": {"masterKeyId": "azure-kms://v.vault.azure.net/keys/m"}}, **GATEWAY_KEY},
            "kmsConfig.gateway.masterKeyId: 'azure-kms://v.vault.azure.net/keys/m' needs a kmsConfig.azure block",
        ),
        (
            {"kmsConfig": {"gateway": {"masterKeyId": "vault-kms://vault:8200/transit/keys/{{record.key}}"}}},
            "kmsConfig.gateway.masterKeyId: unresolved template",
        ),
        (
            {"kmsConfig": {"gateway": {"masterKeyId": "gateway-kms://master"}}, **GATEWAY_KEY},
            "kmsConfig.gateway.masterKeyId: 'gateway-kms://master': the gateway KMS's master key is a key of another",
        ),
        (
            {
                "kmsConfig": {
                    "gateway": {"masterKeyId": "vault-transform://vault:8200/transform/role/r"},
                    "vault": VAULT,
                }
            },
            "kmsConfig.gateway.masterKeyId: 'vault-transform://vault:8200/transform/role/r' is a Transform",
        ),
        (
            {"kmsConfig": {"gateway": {"masterKeyId": "vault-kms://vault:8200/keys"}, "vault": VAULT}},
            "kmsConfig.gateway.masterKeyId: malformed vault-kms key URI",
        ),
        ({"kmsConfig": {"gateway": {}}, **GATEWAY_KEY}, "kmsConfig.gateway.masterKeyId: required"),
        (
            {"kmsConfig": {"gateway": {"masterKeyID": MASTER}}, **GATEWAY_KEY},
            "kmsConfig.gateway.masterKeyID: unknown key (did you mean masterKeyId?)",
        ),
        (
            {"kmsConfig": {"gateway": {"masterKeyId": MASTER, "maxKeys": 0}, "vault": VAULT}, **GATEWAY_KEY},
            "kmsConfig.gateway.maxKeys: expected a positive number",
        ),
        ({"kmsConfig": INLINE, **_email("gateway-kms://")}, "recordValue.fields[0].keySecretId: invalid gateway key"),
        (
            {"kmsConfig": INLINE, "recordValue": {"fields": [{"fieldName": "email", "keyId": "user"}]}},
            "recordValue.fields[0]: name the key with keySecretId",
        ),
        (
            {"kmsConnectionName": "VAULT", "gateway": {"masterKeyId": "m"}, "kmsConfig": INLINE, **GATEWAY_KEY},
            "gateway: the gateway KMS is set twice",
        ),
        (
            {"kmsConnectionName": "VAULT", "kmsConfig": INLINE, **GATEWAY_KEY},
            "recordValue.fields[0]: with kmsConnectionName, name the key with keyId (not keySecretId); gateway KMS",
        ),
    ],
)
def test_encryption_config_errors_name_the_key(config: dict[str, Any], message: str) -> None:
    with pytest.raises(InterceptorConfigError) as caught:
        _build(EncryptionInterceptor, config)
    assert str(caught.value).startswith(message), str(caught.value)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"kmsConfig": {"gateway": {"masterKeyId": MASTER}}},
            f"kmsConfig.gateway.masterKeyId: {MASTER!r} needs a kmsConfig.vault block",
        ),
        (
            {"kmsConfig": {"gateway": {"masterKeyId": "master"}, "vault": VAULT}},
            "kmsConfig.gateway.masterKeyId: 'master' is not a KMS key URI",
        ),
        (
            {"kmsConnectionName": "VAULT", "gateway": {"masterKeyId": "m"}, "kmsConfig": INLINE},
            "gateway: the gateway KMS is set twice",
        ),
    ],
)
def test_decryption_config_errors_name_the_key(config: dict[str, Any], message: str) -> None:
    with pytest.raises(InterceptorConfigError) as caught:
        _build(DecryptionInterceptor, config)
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_valid_inline_gateway_config_builds() -> None:
    _build(EncryptionInterceptor, {"kmsConfig": INLINE, **GATEWAY_KEY})
    _build(DecryptionInterceptor, {"kmsConfig": INLINE, "errorPolicy": "return_encrypted"})


# -- end to end: real clients, Tansu, OpenBao, a gateway process and its admin API


def _sealed(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(TEXT_MAGIC)


def _consume(bootstrap: str, topic: str, count: int) -> Records:
    messages = consume({"bootstrap.servers": bootstrap}, topic, count)
    return [(m.key().decode(), json.loads(m.value())) for m in messages]


def _produce(bootstrap: str, topic: str, records: Records) -> None:
    produce({"bootstrap.servers": bootstrap}, topic, [(k.encode(), json.dumps(v).encode(), []) for k, v in records])


def _eventually(read: Callable[[], Records], expected: Callable[[Records], bool], timeout: float = 60) -> Records:
    """Reads until ``expected`` holds (an interceptor being applied, a follower reading)."""
    deadline = time.monotonic() + timeout
    while True:
        records = read()
        if expected(records) or time.monotonic() > deadline:
            return records


def _interceptor(name: str, plugin: str, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "gateway/v2",
        "kind": "Interceptor",
        "metadata": {"name": name},
        "spec": {"pluginClass": plugin, "priority": 100, "config": config},
    }


@contextlib.contextmanager
def _node(env: dict[str, str], log: Path) -> Iterator[tuple[GatewayProcess, AdminHttp]]:
    process = GatewayProcess(env, log_path=log).start(timeout=30)
    try:
        yield process, AdminHttp(env["GATEWAY_HTTP_PORT"])
    finally:
        code = process.stop(timeout=15)
        assert code == 0, f"gateway exited with {code}:\n{process.tail()}"


@pytest.mark.integration
def test_inline_gateway_kms_encrypts_decrypts_and_shreds_one_key_id(
    tansu: TansuBroker, openbao: OpenBao, tmp_path: Path, unique_topic: Callable[..., str]
) -> None:
    master, cards = openbao.create_transit_key(), openbao.create_transit_key()
    authority = openbao.address.removeprefix("http://")
    master_uri = f"vault-kms://{authority}/transit/keys/{master}"
    vault = {"uri": openbao.address, "token": openbao.root_token}
    kms_config = {"gateway": {"masterKeyId": master_uri, "maxKeys": 1000}, "vault": vault}
    env = {  # no KMS connection: everything is inline
        **tansu.gateway_settings(),
        "GATEWAY_ADMIN_API_USERS": USERS,
        "GATEWAY_CLUSTER_ID": f"inline-{uuid.uuid4().hex[:8]}",
    }
    topic = "inline-shred-" + unique_topic()
    with _node(env, tmp_path / "gateway.log") as (gateway, http):
        encrypt = _interceptor(
            "encrypt-users",
            "encryption",
            {
                "topic": "inline-shred-.*",
                "kmsConfig": kms_config,
                "recordValue": {
                    "fields": [
                        {"fieldName": "email", "keySecretId": "gateway-kms://user-{{record.key}}"},
                        {"fieldName": "card", "keySecretId": f"vault-kms://{authority}/transit/keys/{cards}"},
                    ]
                },
            },
        )
        decrypt = _interceptor(
            "decrypt-users",
            "decryption",
            {"topic": "inline-shred-.*", "kmsConfig": kms_config, "errorPolicy": "return_encrypted"},
        )
        for manifest in (encrypt, decrypt):
            status, answer = http.put("/gateway/v2/interceptor", manifest)
            assert status == 200 and answer["resource"].get("status", {}).get("status", "Ready") == "Ready", answer
        create_topic({"bootstrap.servers": tansu.bootstrap}, topic)
        users = ["alice", "bob", "eu/carol"]
        records = [(u, {"email": f"{u}@example.com", "card": f"card-{u}"}) for u in users]
        _produce(gateway.bootstrap, topic, records)

        stored = _consume(tansu.bootstrap, topic, 3)  # the broker holds ciphertext
        assert all(_sealed(v["email"]) and _sealed(v["card"]) for _, v in stored), stored
        assert _eventually(lambda: _consume(gateway.bootstrap, topic, 3), lambda r: r == records) == records

        status, listed = http.get("/gateway/v2/encryption-key")
        assert status == 200
        mine = {k["keyId"]: k for k in listed if k["keyId"] in {f"user-{u}" for u in users}}
        assert set(mine) == {f"user-{u}" for u in users}
        assert all(len(k["keys"]) == 1 and k["keys"][0]["masterKeyId"] == master_uri for k in mine.values())
        old_uuid = mine["user-alice"]["keys"][0]["uuid"]

        # shred alice: her email stays as stored; her card (another key) and the others decrypt
        status, _ = http.call("DELETE", "/gateway/v2/encryption-key/user-alice")
        assert status == 204
        after = _consume(gateway.bootstrap, topic, 3)
        assert after[0] == ("alice", {"email": stored[0][1]["email"], "card": "card-alice"})
        assert after[1:] == records[1:]

        # alice's new record gets a fresh key; the old one stays unreadable
        _produce(gateway.bootstrap, topic, [("alice", {"email": "new@example.com", "card": "card-2"})])
        final = _consume(gateway.bootstrap, topic, 4)
        assert final[:3] == after and final[3] == ("alice", {"email": "new@example.com", "card": "card-2"})
        assert _sealed(_consume(tansu.bootstrap, topic, 4)[3][1]["email"])
        status, alice = http.get("/gateway/v2/encryption-key/user-alice")
        assert status == 200 and [k["uuid"] for k in alice["keys"]] != [old_uuid] and len(alice["keys"]) == 1

        # a gateway-kms:// key without kmsConfig.gateway is refused, naming the key
        bad = _interceptor(
            "encrypt-bad", "encryption", {"topic": "other-.*", "kmsConfig": {"vault": vault}, **GATEWAY_KEY}
        )
        status, answer = http.put("/gateway/v2/interceptor", bad)
        assert status == 200 and answer["resource"]["status"]["status"] == "Failed", answer
        message = answer["resource"]["status"]["message"]
        refused = "recordValue.fields[0].keySecretId: 'gateway-kms://user-{{record.key}}' is a gateway KMS key"
        assert f"{refused}: set kmsConfig.gateway" in message, message
