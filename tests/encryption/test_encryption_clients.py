"""Encryption on produce and decryption on fetch, with real clients, a real broker and a real KMS
(OpenBao's transit engine): what is stored is ciphertext, the principal the decryption interceptor
is scoped to reads clear text, everyone else reads ciphertext."""

from __future__ import annotations

import base64
import json
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kanal_encryption.plugin
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kanal_encryption.crypto.envelope import TEXT_MAGIC, is_envelope

from kanal.api.interceptor import InterceptorSpec, Scope
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway
from kanal.identity.accounts import AccountType, ServiceAccount
from kanal.identity.tokens import mint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from inprocess import bootstrap_of, in_gateway, inprocess_gateway

SECRET = secrets.token_bytes(32)
CARD = "4111111111111111"


@pytest.fixture
def gateway(tansu: TansuBroker, openbao: Any) -> Iterator[Gateway]:
    env = {
        "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(SECRET).decode(),
        "GATEWAY_EXTERNAL_CONNECTION_VAULT_TYPE": "VAULT",
        "GATEWAY_EXTERNAL_CONNECTION_VAULT_CONFIG_URI": openbao.address,
        "GATEWAY_EXTERNAL_CONNECTION_VAULT_CONFIG_TOKEN": openbao.root_token,
    }
    fields = InterceptorSpec(
        "encrypt-fields",
        "encryption",
        config={
            "topic": "enc-fields-.*",
            "kmsConnectionName": "VAULT",
            "recordValue": {
                "fields": [
                    {"fieldName": "card.number", "keyId": "cards", "algorithm": "AES256_GCM"},
                    {"fieldName": "user.email", "keyId": "users-{{record.topic}}", "algorithm": "XCHACHA20_POLY1305"},
                ]
            },
        },
    )
    payload = InterceptorSpec(
        "encrypt-payload",
        "encryption",
        config={
            "topic": "enc-payload-.*",
            "kmsConnectionName": "VAULT",
            "compressionType": "zstd",
            "recordValue": {"payload": {"keyId": "payloads", "algorithm": "CHACHA20_POLY1305"}},
            "recordHeader": {"fields": [{"fieldName": "tenant", "keyId": "headers"}]},
        },
    )
    decrypt = InterceptorSpec(
        "decrypt", "decryption", scope=Scope(username="reader"), config={"kmsConnectionName": "VAULT"}
    )
    with inprocess_gateway(tansu, {"encryption": kanal_encryption.plugin}, [fields, payload, decrypt], env=env) as gw:
        accounts = [ServiceAccount(name, None, AccountType.LOCAL) for name in ("writer", "reader")]
        in_gateway(gw, gw.service_accounts.replace, accounts)
        yield gw


def _config(gw: Gateway, user: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap_of(gw),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": mint(user, None, 600, SECRET),
    }


def _create(config: dict[str, Any], topic: str) -> None:
    admin = AdminClient(config)
    for future in admin.create_topics([NewTopic(topic, 1)], request_timeout=10).values():
        future.result()


def _produce(config: dict[str, Any], topic: str, records: list[tuple[bytes | None, bytes, list[Any]]]) -> None:
    producer = Producer(config)
    errors: list[Any] = []
    for key, value, headers in records:
        producer.produce(topic, value, key, headers=headers, on_delivery=lambda error, message: errors.append(error))
    assert producer.flush(15) == 0 and errors == [None] * len(records)


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


def _direct(tansu: TansuBroker) -> dict[str, Any]:
    return {"bootstrap.servers": tansu.bootstrap}


def test_json_fields_are_stored_encrypted_and_read_in_clear_by_the_scoped_principal(
    gateway: Gateway, tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    topic = "enc-fields-" + unique_topic()
    writer = _config(gateway, "writer")
    _create(writer, topic)
    documents = [
        {"id": i, "card": {"number": CARD, "expiry": "12/30"}, "user": {"email": f"u{i}@example.com"}} for i in range(5)
    ]
    _produce(writer, topic, [(b"k%d" % i, json.dumps(d).encode(), []) for i, d in enumerate(documents)])

    stored = [json.loads(m.value()) for m in _consume(_direct(tansu), topic, 5)]
    for document, original in zip(stored, documents, strict=True):
        assert document["id"] == original["id"] and document["card"]["expiry"] == "12/30"  # the rest is clear
        for sealed in (document["card"]["number"], document["user"]["email"]):
            assert sealed.startswith(TEXT_MAGIC) and is_envelope(base64.b64decode(sealed))
    assert CARD.encode() not in b"".join(json.dumps(d).encode() for d in stored)

    assert [json.loads(m.value()) for m in _consume(_config(gateway, "reader"), topic, 5)] == documents
    others = [json.loads(m.value()) for m in _consume(_config(gateway, "writer"), topic, 5)]
    assert others == stored  # out of the decryption's scope: ciphertext


def test_payloads_and_headers_are_stored_encrypted_and_read_in_clear_by_the_scoped_principal(
    gateway: Gateway, tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    topic = "enc-payload-" + unique_topic()
    writer = _config(gateway, "writer")
    _create(writer, topic)
    values = [bytes([65 + i]) * 1024 for i in range(4)] + [b""]
    _produce(writer, topic, [(b"key", v, [("tenant", b"blue"), ("trace", b"t1")]) for v in values])

    stored = _consume(_direct(tansu), topic, 5)
    assert all(is_envelope(m.value()) for m in stored) and all(m.key() == b"key" for m in stored)
    assert [dict(m.headers())["trace"] for m in stored] == [b"t1"] * 5
    assert all(is_envelope(dict(m.headers())["tenant"]) for m in stored)
    assert len(stored[0].value()) < 1024  # compressed before encryption

    clear = _consume(_config(gateway, "reader"), topic, 5)
    assert [m.value() for m in clear] == values
    assert [m.headers() for m in clear] == [[("tenant", b"blue"), ("trace", b"t1")]] * 5
    assert [m.value() for m in _consume(_config(gateway, "writer"), topic, 5)] == [m.value() for m in stored]


def _failures(gw: Gateway) -> float:
    labels = {"interceptor": "encryption", "operation": "encrypt"}
    return gw.metrics.registry.get_sample_value("gateway_encryption_failures_total", labels) or 0.0


def test_a_stopped_kms_fails_produce_retriably_stores_nothing_in_clear_and_recovers(
    tansu: TansuBroker, start_openbao: Callable[..., Any], unique_topic: Callable[..., str]
) -> None:
    bao = start_openbao()
    env = {
        "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(SECRET).decode(),
        "GATEWAY_EXTERNAL_CONNECTION_KMS_TYPE": "VAULT",
        "GATEWAY_EXTERNAL_CONNECTION_KMS_CONFIG_URI": bao.address,
        "GATEWAY_EXTERNAL_CONNECTION_KMS_CONFIG_TOKEN": bao.root_token,
    }
    spec = InterceptorSpec(
        "encrypt",
        "encryption",
        config={
            "kmsConnectionName": "KMS",
            "kmsConfig": {"keyTtlMs": 0},  # a data key per batch: every produce needs the KMS
            "recordValue": {"payload": {"keyId": "down"}},
        },
    )
    topic = "enc-down-" + unique_topic()
    with inprocess_gateway(tansu, {"encryption": kanal_encryption.plugin}, [spec], env=env) as gw:
        in_gateway(gw, gw.service_accounts.replace, [ServiceAccount("writer", None, AccountType.LOCAL)])
        writer = _config(gw, "writer")
        _create(writer, topic)
        _produce(writer, topic, [(None, b"before", [])])

        bao.stop()
        producer = Producer({**writer, "message.timeout.ms": 60_000})
        delivered: list[Any] = []
        producer.produce(topic, b"while the KMS is away", on_delivery=lambda error, message: delivered.append(error))
        deadline = time.monotonic() + 30
        while _failures(gw) < 1 and time.monotonic() < deadline:
            producer.poll(0.2)  # the gateway refuses the partition (retriable): the client retries
        assert _failures(gw) >= 1
        assert len(_consume(_direct(tansu), topic, 1)) == 1  # nothing of it was stored

        start_openbao(port=int(bao.address.rsplit(":", 1)[1]), token=bao.root_token)  # the KMS is back
        assert producer.flush(60) == 0 and delivered == [None]  # the retried produce goes through

    stored = [m.value() for m in _consume(_direct(tansu), topic, 2)]
    assert all(is_envelope(v) for v in stored) and not any(b"KMS is away" in v or b"before" in v for v in stored)
