"""Crypto shredding end to end, with real clients (confluent-kafka), a real broker, OpenBao and real
gateways: a user's records encrypted with a key of their own, that key deleted, the user's records
unreadable for ever (the decryption returns the ciphertext) while the other users' stay readable and
the user's new records get a fresh key.

- the gateway KMS: two gateway processes of one cluster (admin API on each), the key deleted with
  ``DELETE /gateway/v2/encryption-key/<keyId>`` on one node, taking effect on both;
- an external KMS: a templated OpenBao transit key deleted in OpenBao.

Nothing waits a fixed time: each step polls for the state it expects, with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import kanal_encryption.plugin
import pytest
from kanal_encryption.crypto.envelope import TEXT_MAGIC

from kanal.api.interceptor import InterceptorSpec
from kanal.embedded import TansuBroker
from kanal.embedded.admin_http import AdminHttp
from kanal.embedded.gateway_process import GatewayProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from inprocess import bootstrap_of, inprocess_gateway
from kafka_clients import consume, create_topic, produce

pytestmark = pytest.mark.integration

USERS = "[{username: admin, password: secret, admin: true}]"
Records = list[tuple[str, dict[str, Any]]]


def _create(bootstrap: str, topic: str) -> None:
    create_topic({"bootstrap.servers": bootstrap}, topic)


def _produce(bootstrap: str, topic: str, records: Records) -> None:
    produce({"bootstrap.servers": bootstrap}, topic, [(k.encode(), json.dumps(v).encode(), []) for k, v in records])


def _consume(bootstrap: str, topic: str, count: int) -> Records:
    messages = consume({"bootstrap.servers": bootstrap}, topic, count)
    return [(m.key().decode(), json.loads(m.value())) for m in messages]


def _eventually(read: Callable[[], Records], expected: Callable[[Records], bool], timeout: float = 60) -> Records:
    """Reads until ``expected`` holds (a node following a topic, an interceptor being applied)."""
    deadline = time.monotonic() + timeout
    while True:
        records = read()
        if expected(records) or time.monotonic() > deadline:
            return records


def _sealed(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(TEXT_MAGIC)


def _emails(records: Records) -> list[tuple[str, Any]]:
    return [(key, value["email"]) for key, value in records]


# -- the gateway KMS, two nodes


@contextlib.contextmanager
def _node(env: dict[str, str], log: Path) -> Iterator[tuple[GatewayProcess, AdminHttp]]:
    process = GatewayProcess(env, log_path=log).start(timeout=30)
    try:
        yield process, AdminHttp(env["GATEWAY_HTTP_PORT"])
    finally:
        code = process.stop(timeout=15)
        assert code == 0, f"gateway exited with {code}:\n{process.tail()}"


def _interceptor(name: str, plugin: str, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "gateway/v2",
        "kind": "Interceptor",
        "metadata": {"name": name},
        "spec": {"pluginClass": plugin, "priority": 100, "config": config},
    }


def test_deleting_a_gateway_key_shreds_one_users_records_on_every_node(
    tansu: TansuBroker, openbao: Any, tmp_path: Path, unique_topic: Callable[..., str]
) -> None:
    cluster = f"shred-{uuid.uuid4().hex[:8]}"
    common = {
        "GATEWAY_ADMIN_API_USERS": USERS,
        "GATEWAY_CLUSTER_ID": cluster,
        "GATEWAY_EXTERNAL_CONNECTION_VAULT_TYPE": "VAULT",
        "GATEWAY_EXTERNAL_CONNECTION_VAULT_CONFIG_URI": openbao.address,
        "GATEWAY_EXTERNAL_CONNECTION_VAULT_CONFIG_TOKEN": openbao.root_token,
    }
    master = openbao.create_transit_key()
    gateway_block = {"masterKeyId": master}
    topic = "shred-" + unique_topic()
    with (
        _node({**tansu.gateway_settings(), **common}, tmp_path / "a.log") as (a, http_a),
        _node({**tansu.gateway_settings(), **common}, tmp_path / "b.log") as (b, http_b),
    ):
        encrypt = _interceptor(
            "encrypt-users",
            "encryption",
            {
                "topic": "shred-.*",
                "kmsConnectionName": "VAULT",
                "gateway": gateway_block,
                "recordValue": {"fields": [{"fieldName": "email", "keyId": "user-{{record.key}}"}]},
            },
        )
        decrypt = _interceptor(
            "decrypt-users",
            "decryption",
            {"kmsConnectionName": "VAULT", "gateway": gateway_block, "errorPolicy": "return_encrypted"},
        )
        for manifest in (encrypt, decrypt):
            status, answer = http_a.put("/gateway/v2/interceptor", manifest)
            assert status == 200, answer
        _create(tansu.bootstrap, topic)
        users = ["alice.smith", "bob", "eu/carol"]
        _produce(a.bootstrap, topic, [(user, {"user": user, "email": f"{user}@example.com"}) for user in users])

        stored = _consume(tansu.bootstrap, topic, 3)
        assert all(_sealed(email) for _, email in _emails(stored))  # (node a had the interceptor already)
        clear = [(user, f"{user}@example.com") for user in users]
        assert _emails(_eventually(lambda: _consume(b.bootstrap, topic, 3), lambda r: _emails(r) == clear)) == clear

        status, listed = http_b.get("/gateway/v2/encryption-key")
        assert status == 200
        assert {k["keyId"] for k in listed} == {f"user-{u}" for u in users}
        assert all(len(k["keys"]) == 1 and "wrappedKey" not in k["keys"][0] for k in listed)
        status, one = http_a.get("/gateway/v2/encryption-key/" + quote("user-eu/carol", safe=""))
        assert status == 200 and one["keySecretId"] == "gateway-kms://user-eu/carol"
        assert http_a.call("DELETE", "/gateway/v2/encryption-key/user-nobody")[0] == 404

        # shred alice on node b: at once there, and on node a once its follower reads the tombstone
        status, _ = http_b.call("DELETE", "/gateway/v2/encryption-key/" + quote("user-alice.smith", safe=""))
        assert status == 204
        on_b = _emails(_consume(b.bootstrap, topic, 3))
        assert _sealed(on_b[0][1]) and on_b[1:] == clear[1:]
        on_a = _emails(_eventually(lambda: _consume(a.bootstrap, topic, 3), lambda r: _sealed(r[0][1]["email"])))
        assert _sealed(on_a[0][1]) and on_a[1:] == clear[1:]
        assert on_a[0][1] == stored[0][1]["email"]  # the ciphertext, as stored

        # alice's new record gets a fresh key; the old ones stay unreadable for ever
        _produce(a.bootstrap, topic, [("alice.smith", {"user": "alice.smith", "email": "new@example.com"})])
        for node in (a, b):
            after = _emails(_consume(node.bootstrap, topic, 4))
            assert _sealed(after[0][1]) and after[1:3] == clear[1:] and after[3] == ("alice.smith", "new@example.com")
        status, listed = http_a.get("/gateway/v2/encryption-key/user-alice.smith")
        assert status == 200 and len(listed["keys"]) == 1
        assert http_a.call("GET", "/gateway/v2/encryption-key/user-alice.smith", user=None)[0] == 401


# -- an external KMS: a templated OpenBao transit key deleted


def test_deleting_a_templated_key_in_openbao_shreds_one_users_records(
    tansu: TansuBroker, openbao: Any, unique_topic: Callable[..., str]
) -> None:
    env = {
        "GATEWAY_EXTERNAL_CONNECTION_VAULT_TYPE": "VAULT",
        "GATEWAY_EXTERNAL_CONNECTION_VAULT_CONFIG_URI": openbao.address,
        "GATEWAY_EXTERNAL_CONNECTION_VAULT_CONFIG_TOKEN": openbao.root_token,
    }
    prefix = "u" + uuid.uuid4().hex[:8]
    encrypt = InterceptorSpec(
        "encrypt",
        "encryption",
        config={
            "topic": "ext-shred-.*",
            "kmsConnectionName": "VAULT",  # transit keys made on first use (the root token may)
            "recordValue": {"fields": [{"fieldName": "email", "keyId": prefix + "-{{record.key}}"}]},
        },
    )
    decrypt = InterceptorSpec(
        "decrypt",
        "decryption",
        config={"kmsConnectionName": "VAULT", "kmsConfig": {"keyTtlMs": 0}, "errorPolicy": "return_encrypted"},
    )
    topic = "ext-shred-" + unique_topic()
    with inprocess_gateway(tansu, {"encryption": kanal_encryption.plugin}, [encrypt, decrypt], env=env) as gw:
        bootstrap = bootstrap_of(gw)
        _create(bootstrap, topic)
        _produce(bootstrap, topic, [(u, {"email": f"{u}@example.com"}) for u in ("alice", "bob")])
        clear = [("alice", "alice@example.com"), ("bob", "bob@example.com")]
        assert _emails(_consume(bootstrap, topic, 2)) == clear
        stored = _emails(_consume(tansu.bootstrap, topic, 2))
        assert all(_sealed(email) for _, email in stored)

        openbao.delete_transit_key(f"{prefix}-alice")
        after = _emails(_consume(bootstrap, topic, 2))
        assert after == [stored[0], clear[1]]  # alice's record: the ciphertext, as stored
        # the unwrap that found the key gone made the encryption drop its data key of that key: the
        # new record is wrapped by a new transit key (made anew on first use), not the deleted one
        _produce(bootstrap, topic, [("alice", {"email": "new@example.com"})])
        final = _emails(_consume(bootstrap, topic, 3))
        assert final == [stored[0], clear[1], ("alice", "new@example.com")]
        assert _emails(_consume(bootstrap, topic, 3))[0] == stored[0]  # for ever
