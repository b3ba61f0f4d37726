"""Encryption on produce and decryption on fetch, with real clients, a real broker and a real KMS
(OpenBao's transit engine): what is stored is ciphertext, the principal the decryption interceptor
is scoped to reads clear text, everyone else reads ciphertext."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka_clients import consume, create_topic, direct, encryption_gateway, login, produce
from kanal_encryption.crypto.envelope import TEXT_MAGIC, is_envelope

from kanal.api.interceptor import InterceptorSpec, Scope
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway

CARD = "4111111111111111"


def _vault(name: str, bao: Any) -> dict[str, str]:
    prefix = f"GATEWAY_EXTERNAL_CONNECTION_{name}_"
    return {f"{prefix}TYPE": "VAULT", f"{prefix}CONFIG_URI": bao.address, f"{prefix}CONFIG_TOKEN": bao.root_token}


@pytest.fixture
def gateway(tansu: TansuBroker, openbao: Any) -> Iterator[Gateway]:
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
    with encryption_gateway(tansu, [fields, payload, decrypt], _vault("VAULT", openbao), ("writer", "reader")) as gw:
        yield gw


def test_json_fields_are_stored_encrypted_and_read_in_clear_by_the_scoped_principal(
    gateway: Gateway, tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    topic = "enc-fields-" + unique_topic()
    writer = login(gateway, "writer")
    create_topic(writer, topic)
    documents = [
        {"id": i, "card": {"number": CARD, "expiry": "12/30"}, "user": {"email": f"u{i}@example.com"}} for i in range(5)
    ]
    produce(writer, topic, [(b"k%d" % i, json.dumps(d).encode(), []) for i, d in enumerate(documents)])

    stored = [json.loads(m.value()) for m in consume(direct(tansu), topic, 5)]
    for document, original in zip(stored, documents, strict=True):
        assert document["id"] == original["id"] and document["card"]["expiry"] == "12/30"  # the rest is clear
        for sealed in (document["card"]["number"], document["user"]["email"]):
            assert sealed.startswith(TEXT_MAGIC) and is_envelope(base64.b64decode(sealed))
    assert CARD.encode() not in b"".join(json.dumps(d).encode() for d in stored)

    assert [json.loads(m.value()) for m in consume(login(gateway, "reader"), topic, 5)] == documents
    others = [json.loads(m.value()) for m in consume(login(gateway, "writer"), topic, 5)]
    assert others == stored  # out of the decryption's scope: ciphertext


def test_payloads_and_headers_are_stored_encrypted_and_read_in_clear_by_the_scoped_principal(
    gateway: Gateway, tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    topic = "enc-payload-" + unique_topic()
    writer = login(gateway, "writer")
    create_topic(writer, topic)
    values = [bytes([65 + i]) * 1024 for i in range(4)] + [b""]
    produce(writer, topic, [(b"key", v, [("tenant", b"blue"), ("trace", b"t1")]) for v in values])

    stored = consume(direct(tansu), topic, 5)
    assert all(is_envelope(m.value()) for m in stored) and all(m.key() == b"key" for m in stored)
    assert [dict(m.headers())["trace"] for m in stored] == [b"t1"] * 5
    assert all(is_envelope(dict(m.headers())["tenant"]) for m in stored)
    assert len(stored[0].value()) < 1024  # compressed before encryption

    clear = consume(login(gateway, "reader"), topic, 5)
    assert [m.value() for m in clear] == values
    assert [m.headers() for m in clear] == [[("tenant", b"blue"), ("trace", b"t1")]] * 5
    assert [m.value() for m in consume(login(gateway, "writer"), topic, 5)] == [m.value() for m in stored]


def _failures(gw: Gateway) -> float:
    labels = {"interceptor": "encryption", "operation": "encrypt"}
    return gw.metrics.registry.get_sample_value("gateway_encryption_failures_total", labels) or 0.0


def test_a_stopped_kms_fails_produce_retriably_stores_nothing_in_clear_and_recovers(
    tansu: TansuBroker, start_openbao: Callable[..., Any], unique_topic: Callable[..., str]
) -> None:
    bao = start_openbao()
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
    with encryption_gateway(tansu, [spec], _vault("KMS", bao), ("writer",)) as gw:
        writer = login(gw, "writer")
        create_topic(writer, topic)
        produce(writer, topic, [(None, b"before", [])])

        bao.stop()
        producer = Producer({**writer, "message.timeout.ms": 60_000})
        delivered: list[Any] = []
        producer.produce(topic, b"while the KMS is away", on_delivery=lambda error, message: delivered.append(error))
        deadline = time.monotonic() + 30
        while _failures(gw) < 1 and time.monotonic() < deadline:
            producer.poll(0.2)  # the gateway refuses the partition (retriable): the client retries
        assert _failures(gw) >= 1
        assert len(consume(direct(tansu), topic, 1)) == 1  # nothing of it was stored

        start_openbao(port=int(bao.address.rsplit(":", 1)[1]), token=bao.root_token)  # the KMS is back
        assert producer.flush(60) == 0 and delivered == [None]  # the retried produce goes through

    stored = [m.value() for m in consume(direct(tansu), topic, 2)]
    assert all(is_envelope(v) for v in stored) and not any(b"KMS is away" in v or b"before" in v for v in stored)


def test_kafka_python_and_aiokafka_read_what_their_principal_may(
    gateway: Gateway, tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioPartition
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    topic = "enc-payload-" + unique_topic()
    create_topic(login(gateway, "writer"), topic)
    writer = login(gateway, "writer")
    producer = KafkaProducer(
        bootstrap_servers=writer["bootstrap.servers"],
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="writer",
        sasl_plain_password=writer["sasl.password"],
    )
    values = [b"secret-%d" % i for i in range(3)]
    for value in values:
        producer.send(topic, value, partition=0).get(timeout=15)
    producer.close()
    assert all(is_envelope(m.value()) for m in consume(direct(tansu), topic, 3))

    reader = login(gateway, "reader")
    consumer = KafkaConsumer(
        bootstrap_servers=reader["bootstrap.servers"],
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="reader",
        sasl_plain_password=reader["sasl.password"],
        enable_auto_commit=False,
    )
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < 3 and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=500).values():
            got.extend(record.value for record in batch)
    consumer.close()
    assert got == values

    async def other() -> list[bytes]:  # out of the decryption's scope: ciphertext
        writer = login(gateway, "writer")
        aio = AIOKafkaConsumer(
            bootstrap_servers=writer["bootstrap.servers"],
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_plain_username="writer",
            sasl_plain_password=writer["sasl.password"],
            enable_auto_commit=False,
        )
        await aio.start()
        try:
            aio.assign([AioPartition(topic, 0)])
            await aio.seek_to_beginning(AioPartition(topic, 0))
            values: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(values) < 3 and time.monotonic() < deadline:
                fetched = await aio.getmany(timeout_ms=500)
                values.extend(record.value for records in fetched.values() for record in records)
            return values
        finally:
            await aio.stop()

    stored = asyncio.run(other())
    assert len(stored) == 3 and all(is_envelope(v) for v in stored)


def test_fetch_responses_are_decrypted_on_their_frame_without_decoding_them(
    gateway: Gateway, tansu: TansuBroker, unique_topic: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kanal.net import connection

    decoded: list[int] = []
    real = connection._decoded

    def counting(pending: Any, frame: bytearray) -> Any:
        decoded.append(pending.api_key)
        return real(pending, frame)

    monkeypatch.setattr(connection, "_decoded", counting)
    topic = "enc-payload-" + unique_topic()
    writer = login(gateway, "writer")
    create_topic(writer, topic)
    values = [b"v%d" % i * 100 for i in range(20)]
    produce(writer, topic, [(None, v, []) for v in values])
    assert [m.value() for m in consume(login(gateway, "reader"), topic, 20)] == values
    assert 1 not in decoded  # (librdkafka fetches with v12+: the record sets were replaced in the frame)
