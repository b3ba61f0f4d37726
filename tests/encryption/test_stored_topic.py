"""Ciphertext is bound to the topic as the cluster stores it: records a virtual cluster's client
encrypted read in clear through any name of that topic (the tenant's own, another tenant's alias,
the physical name in the passthrough cluster), while key templates still see the client's name."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio
from kafka_clients import (
    SECRET,
    bootstrap_of,
    consume,
    create_topic,
    direct,
    encryption_gateway,
    in_gateway,
    produce,
)
from kanal_encryption.crypto.envelope import TEXT_MAGIC
from kanal_encryption.interceptors import DecryptionInterceptor, EncryptionInterceptor

from kanal.api import Record, RecordSet, encode_batch
from kanal.api.interceptor import InterceptorSpec, Scope
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway
from kanal.identity.accounts import AccountType, ServiceAccount
from kanal.identity.tokens import mint
from kanal.tenancy.aliases import AliasTopic
from kanal.tenancy.clusters import VirtualCluster
from kanal.testing import FakeServices, FakeTopicNames, Harness

VALUE = b'{"card": "4111111111111111"}'
USERS = (("app", "enc-a."), ("app", "enc-b."), ("reader", None))
READERS = (("app", "enc-a."), ("app", "enc-b."), ("reader", None))


def _run(cls: type, config: dict[str, Any], topic: str, data: bytes, prefix: str = "", fetch: bool = False) -> bytes:
    """``data`` through one interceptor of a client whose virtual cluster stores topics under ``prefix``."""
    harness = Harness(services=FakeServices(topic_names=FakeTopicNames(prefix=prefix)))
    harness.add(cls, config)

    async def run() -> RecordSet:
        records, error = await harness.records(topic, 0, data, fetch=fetch)
        assert error is None
        return records

    return trio.run(run).to_bytes() or b""


ENCRYPT = {"kmsConfig": {}, "recordValue": {"payload": {"keySecretId": "in-memory-kms://stored-{{record.topic}}"}}}
DECRYPT = {"kmsConfig": {}}


def _value(data: bytes) -> bytes | None:
    return next(record.value for _, record in RecordSet.parse(data))


def test_the_stored_name_is_bound_and_the_clients_name_fills_templates() -> None:
    sealed = _run(
        EncryptionInterceptor,
        ENCRYPT,
        "orders",
        encode_batch([Record(value=VALUE)], base_timestamp=1),
        prefix="team-a.",
    )
    assert _value(sealed) != VALUE and b"stored-orders" in sealed  # the key id the tenant's name made

    def read(topic: str, prefix: str = "") -> bytes | None:
        return _value(_run(DecryptionInterceptor, DECRYPT, topic, sealed, prefix=prefix, fetch=True))

    assert read("orders", prefix="team-a.") == VALUE  # the tenant itself
    assert read("team-a.orders") == VALUE  # the physical name, in the passthrough cluster
    assert read("team-b-view", prefix="") != VALUE  # another topic: the associated data differs
    assert read("orders") != VALUE  # the tenant's name is not the stored one


def _encrypt(name: str, scope: Scope, topic: str) -> InterceptorSpec:
    fields = {"fields": [{"fieldName": "card", "keyId": "cards"}]}
    return InterceptorSpec(
        name, "encryption", scope=scope, config={"topic": topic, "kmsConnectionName": "VAULT", "recordValue": fields}
    )


def _decrypt(name: str, scope: Scope) -> InterceptorSpec:
    return InterceptorSpec(name, "decryption", scope=scope, config={"kmsConnectionName": "VAULT"})


@pytest.fixture
def gateway(tansu: TansuBroker, openbao: Any) -> Iterator[Gateway]:
    """Tenant ``enc-a.`` encrypts its ``orders-*`` topics, the passthrough user ``reader`` what it
    produces to ``all-*`` (its aliases of them); every reader decrypts."""
    vault = "GATEWAY_EXTERNAL_CONNECTION_VAULT_"
    env = {f"{vault}TYPE": "VAULT", f"{vault}CONFIG_URI": openbao.address, f"{vault}CONFIG_TOKEN": openbao.root_token}
    interceptors = [
        _encrypt("encrypt-a", Scope(vcluster="enc-a."), "orders-.*"),
        _encrypt("encrypt-p", Scope(username="reader"), "all-.*"),
        _decrypt("decrypt-a", Scope(vcluster="enc-a.")),
        _decrypt("decrypt-b", Scope(vcluster="enc-b.")),
        _decrypt("decrypt-p", Scope(username="reader")),
    ]
    with encryption_gateway(tansu, interceptors, env) as gw:
        in_gateway(gw, gw.virtual_clusters.replace, [VirtualCluster("enc-a."), VirtualCluster("enc-b.")])
        accounts = [ServiceAccount(name, vcluster, AccountType.LOCAL) for name, vcluster in USERS]
        in_gateway(gw, gw.service_accounts.replace, accounts)
        yield gw


def _client(gw: Gateway, user: str, vcluster: str | None) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap_of(gw),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": mint(user, vcluster, 600, SECRET),
    }


def test_a_tenants_records_read_in_clear_under_aliases_and_the_physical_name(
    gateway: Gateway, tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    topic = "orders-" + unique_topic()
    physical = "enc-a." + topic
    tenant = _client(gateway, "app", "enc-a.")
    create_topic(tenant, topic)
    documents = [{"id": i, "card": f"4111-{i}"} for i in range(3)]
    produce(tenant, topic, [(None, json.dumps(d).encode(), []) for d in documents])

    stored = [json.loads(m.value()) for m in consume(direct(tansu), physical, 3)]
    assert all(d["card"].startswith(TEXT_MAGIC) for d in stored)
    aliases = [AliasTopic("shared-orders", "enc-b.", physical), AliasTopic("all-" + topic, None, physical)]
    in_gateway(gateway, gateway.aliases.replace, aliases)

    assert [json.loads(m.value()) for m in consume(tenant, topic, 3)] == documents
    assert [json.loads(m.value()) for m in consume(_client(gateway, "app", "enc-b."), "shared-orders", 3)] == documents
    reader = _client(gateway, "reader", None)
    assert [json.loads(m.value()) for m in consume(reader, physical, 3)] == documents
    assert [json.loads(m.value()) for m in consume(reader, "all-" + topic, 3)] == documents  # a passthrough alias

    more = [{"id": i, "card": f"4111-{i}"} for i in range(3, 5)]
    produce(reader, "all-" + topic, [(None, json.dumps(d).encode(), []) for d in more])  # encrypted under the alias
    assert all(json.loads(m.value())["card"].startswith(TEXT_MAGIC) for m in consume(direct(tansu), physical, 5))
    assert [json.loads(m.value()) for m in consume(tenant, topic, 5)] == documents + more
