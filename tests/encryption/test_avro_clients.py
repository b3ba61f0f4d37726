"""Avro field encryption with real clients: a producer writes Confluent-framed Avro through the
gateway, the schema registry is the repository's test registry (basic auth on), the KMS OpenBao's
transit engine. Records stay Avro and decode with the registry; the scoped principal reads them in
clear, everyone else (and the broker) the stored form."""

from __future__ import annotations

import base64
import io
import json
import secrets
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fastavro
import kanal_encryption.plugin
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kanal_encryption.crypto.envelope import TEXT_MAGIC, is_envelope
from kanal_registry_proxy.testing import TestRegistry

from kanal.api.interceptor import InterceptorSpec, Scope
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway
from kanal.identity.accounts import AccountType, ServiceAccount
from kanal.identity.tokens import mint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from inprocess import bootstrap_of, in_gateway, inprocess_gateway

SECRET = secrets.token_bytes(32)
AUTH = "Basic " + base64.b64encode(b"gw:pw").decode()
SCHEMA = {
    "type": "record",
    "name": "Payment",
    "namespace": "test.avro",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "card", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "country", "type": "string"},
    ],
}


@pytest.fixture(scope="module")
def registry() -> Iterator[TestRegistry]:
    permissions = [{"username": "gw", "operation": "Write", "resource": ".*"}]
    with TestRegistry(users={"gw": "pw"}, permissions=permissions) as running:
        yield running


@pytest.fixture
def gateway(tansu: TansuBroker, openbao: Any, registry: TestRegistry) -> Iterator[Gateway]:
    env = {
        "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(SECRET).decode(),
        "GATEWAY_EXTERNAL_CONNECTION_VAULT_TYPE": "VAULT",
        "GATEWAY_EXTERNAL_CONNECTION_VAULT_CONFIG_URI": openbao.address,
        "GATEWAY_EXTERNAL_CONNECTION_VAULT_CONFIG_TOKEN": openbao.root_token,
        "GATEWAY_EXTERNAL_CONNECTION_PAYMENTS_SR_CONFIG_URL": registry.url,
        "GATEWAY_EXTERNAL_CONNECTION_PAYMENTS_SR_CONFIG_BASIC_AUTH_USERNAME": "gw",
        "GATEWAY_EXTERNAL_CONNECTION_PAYMENTS_SR_CONFIG_BASIC_AUTH_PASSWORD": "pw",
    }
    encrypt = InterceptorSpec(
        "encrypt-avro",
        "encryption",
        config={
            "topic": "enc-avro-.*",
            "kmsConnectionName": "VAULT",
            "schemaRegistryConnectionName": "payments-sr",
            "recordValue": {
                "fields": [
                    {"fieldName": "card", "keyId": "avro-cards", "algorithm": "AES256_GCM"},
                    {"fieldName": "amount", "keyId": "avro-amounts"},
                ]
            },
        },
    )
    decrypt = InterceptorSpec(
        "decrypt-avro",
        "decryption",
        scope=Scope(username="reader"),
        config={
            "topic": "enc-avro-.*",
            "kmsConnectionName": "VAULT",
            "schemaRegistryConfig": {"host": registry.url, "basicAuthUsername": "gw", "basicAuthPassword": "pw"},
        },
    )
    with inprocess_gateway(tansu, {"encryption": kanal_encryption.plugin}, [encrypt, decrypt], env=env) as gw:
        accounts = [ServiceAccount(name, None, AccountType.LOCAL) for name in ("writer", "reader")]
        in_gateway(gw, gw.service_accounts.replace, accounts)
        yield gw


def _registry_call(url: str, path: str, body: Any = None) -> Any:
    request = urllib.request.Request(
        url + path,
        data=None if body is None else json.dumps(body).encode(),
        method="GET" if body is None else "POST",
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json", "Authorization": AUTH},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _framed(schema_id: int, value: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(SCHEMA), value)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


def _decode(url: str, data: bytes) -> dict[str, Any]:
    """A record decoded as a registry-aware consumer does: the schema of the id in its frame."""
    assert data[0] == 0
    schema_id = int.from_bytes(data[1:5], "big")
    schema = fastavro.parse_schema(json.loads(_registry_call(url, f"/schemas/ids/{schema_id}")["schema"]))
    decoded: dict[str, Any] = fastavro.schemaless_reader(io.BytesIO(data[5:]), schema, None)  # type: ignore[assignment]
    return decoded


def _config(gw: Gateway, user: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap_of(gw),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": mint(user, None, 600, SECRET),
    }


def _consume(config: dict[str, Any], topic: str, count: int) -> list[Any]:
    consumer = Consumer({**config, "group.id": "g", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    messages: list[Any] = []
    deadline = time.monotonic() + 30
    while len(messages) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None:
            assert message.error() is None, message.error()
            messages.append(message)
    consumer.close()
    assert len(messages) == count
    return messages


def test_avro_records_stay_avro_and_decode_with_the_registry(
    gateway: Gateway, tansu: TansuBroker, registry: TestRegistry, unique_topic: Callable[..., str]
) -> None:
    topic = "enc-avro-" + unique_topic()
    writer = _config(gateway, "writer")
    admin = AdminClient(writer)
    for future in admin.create_topics([NewTopic(topic, 1)], request_timeout=10).values():
        future.result()
    schema_id = int(
        _registry_call(registry.url, f"/subjects/{topic}-value/versions", {"schema": json.dumps(SCHEMA)})["id"]
    )
    payments = [
        {"id": i, "card": f"4111-1111-1111-{i:04d}", "amount": 10.25 * (i + 1), "country": "FR"} for i in range(5)
    ]
    produced = [_framed(schema_id, p) for p in payments]
    producer = Producer(writer)
    errors: list[Any] = []
    for i, value in enumerate(produced):
        producer.produce(topic, value, b"k%d" % i, on_delivery=lambda error, message: errors.append(error))
    assert producer.flush(15) == 0 and errors == [None] * len(produced)

    stored = _consume({"bootstrap.servers": tansu.bootstrap}, topic, 5)  # the broker, directly
    for message, payment in zip(stored, payments, strict=True):
        assert message.value()[1:5] == schema_id.to_bytes(4, "big")  # the same schema id
        record = _decode(registry.url, message.value())  # still Avro of that schema
        assert record["id"] == payment["id"] and record["country"] == "FR"
        assert record["card"].startswith(TEXT_MAGIC) and is_envelope(base64.b64decode(record["card"]))
        assert record["amount"] == 4.9e-324  # a double's placeholder ...
        assert is_envelope(dict(message.headers())["kanal.enc.value.amount"])  # ... its envelope in a header
        assert payment["card"].encode() not in message.value()

    clear = _consume(_config(gateway, "reader"), topic, 5)
    assert [m.value() for m in clear] == produced
    assert [_decode(registry.url, m.value()) for m in clear] == payments
    assert all(not m.headers() for m in clear)  # the envelope headers are dropped

    others = _consume(_config(gateway, "writer"), topic, 5)  # out of the decryption's scope
    assert [(m.value(), m.headers()) for m in others] == [(m.value(), m.headers()) for m in stored]
