"""Tokenization with a Transform connection: fields replaced by tokens of a role and restored, one
Transform call per role and batch, repeated values remembered. Against a local server answering
Vault's documented Transform requests and responses (OpenBao has no Transform engine)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import msgspec
import pytest
import trio
from kafka_clients import consume, create_topic, direct, encryption_gateway, login, produce
from kanal_encryption.config import EncryptionConfig
from kanal_encryption.encrypt import EncryptionFailed
from kanal_encryption.kms.connections import parse_kms_connections
from kanal_encryption.kms.factory import KmsPool
from kanal_encryption.tokenize import Tokenization, tokenization_of
from kms_fakes import FakeVaultTransform

from kanal.api import InterceptorConfigError, Record, RecordBatch, encode_batch
from kanal.api.interceptor import InterceptorSpec, Scope
from kanal.embedded import TansuBroker


@pytest.fixture
def transform() -> Iterator[FakeVaultTransform]:
    with FakeVaultTransform().running() as fake:
        fake.roles.update({"cards", "emails"})
        yield fake


def _tokens(fake: FakeVaultTransform, fields: list[dict[str, str]]) -> Tokenization:
    env = {
        "GATEWAY_EXTERNAL_CONNECTION_TOKENS_TYPE": "VAULT",
        "GATEWAY_EXTERNAL_CONNECTION_TOKENS_CONFIG_URI": fake.url,
        "GATEWAY_EXTERNAL_CONNECTION_TOKENS_CONFIG_TOKEN": fake.token,
        "GATEWAY_EXTERNAL_CONNECTION_TOKENS_CONFIG_ENGINE_TYPE": "TRANSFORM",
        "GATEWAY_EXTERNAL_CONNECTION_TOKENS_CONFIG_ENGINE_MOUNT": "transform",
    }
    (connection,) = parse_kms_connections(env, env).values()
    config = msgspec.convert({"kmsConnectionName": "TOKENS", "recordValue": {"fields": fields}}, EncryptionConfig)
    tokens = tokenization_of(connection, None, KmsPool(), config.record_value, config.record_key)
    assert tokens is not None
    return tokens


def _batch(values: list[bytes]) -> RecordBatch:
    return RecordBatch.from_bytes(
        encode_batch([Record(offset_delta=i, value=v) for i, v in enumerate(values)], base_timestamp=1)
    )


def test_fields_become_tokens_and_come_back(transform: FakeVaultTransform) -> None:
    tokens = _tokens(
        transform, [{"fieldName": "card", "keyId": "cards"}, {"fieldName": "user.email", "keyId": "emails"}]
    )
    documents = [{"card": "4111", "user": {"email": f"u{i % 2}@x.io"}, "n": i} for i in range(4)]

    async def main() -> None:
        stored = await tokens.batch(_batch([json.dumps(d).encode() for d in documents]), encode=True)
        assert stored is not None
        sealed = [json.loads(r.value) for r in RecordBatch.from_bytes(stored).records()]
        assert all(
            s["card"] != "4111" and "@" not in s["user"]["email"] and s["n"] == d["n"]
            for s, d in zip(sealed, documents, strict=True)
        )
        assert len({s["card"] for s in sealed}) == 1  # one value, one token (remembered)
        calls = len(transform.requests)
        again = await tokens.batch(_batch([json.dumps(d).encode() for d in documents]), encode=True)
        assert again == stored and len(transform.requests) == calls  # remembered: no call
        restored = await _tokens(
            transform, [{"fieldName": "card", "keyId": "cards"}, {"fieldName": "user.email", "keyId": "emails"}]
        ).batch(RecordBatch.from_bytes(stored), encode=False)
        assert restored is not None
        assert [json.loads(r.value) for r in RecordBatch.from_bytes(restored).records()] == documents

    trio.run(main)
    encodes = [path for method, path, _ in transform.requests if path.endswith("/encode/cards")]
    assert len(encodes) == 1  # one call per role and batch


def test_records_without_the_fields_are_untouched_and_bad_input_is_refused(transform: FakeVaultTransform) -> None:
    tokens = _tokens(transform, [{"fieldName": "card", "keyId": "cards"}])

    async def main() -> None:
        assert await tokens.batch(_batch([b'{"other": 1}', b'{"card": null}']), encode=True) is None
        with pytest.raises(EncryptionFailed, match="not JSON"):
            await tokens.batch(_batch([b"not json"]), encode=True)

    trio.run(main)


def test_tokenization_refuses_payloads(transform: FakeVaultTransform) -> None:
    env = {
        "GATEWAY_EXTERNAL_CONNECTION_TOKENS_TYPE": "VAULT",
        "GATEWAY_EXTERNAL_CONNECTION_TOKENS_CONFIG_URI": transform.url,
        "GATEWAY_EXTERNAL_CONNECTION_TOKENS_CONFIG_TOKEN": transform.token,
        "GATEWAY_EXTERNAL_CONNECTION_TOKENS_CONFIG_ENGINE_TYPE": "TRANSFORM",
    }
    (connection,) = parse_kms_connections(env, env).values()
    config = msgspec.convert(
        {"kmsConnectionName": "TOKENS", "recordValue": {"payload": {"keyId": "cards"}}}, EncryptionConfig
    )
    with pytest.raises(InterceptorConfigError, match="tokenization replaces JSON fields"):
        tokenization_of(connection, None, KmsPool(), config.record_value, None)


def test_a_producer_stores_tokens_and_the_scoped_reader_gets_the_values_back(
    transform: FakeVaultTransform, tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    prefix = "GATEWAY_EXTERNAL_CONNECTION_TOKENS_"
    env = {
        f"{prefix}TYPE": "VAULT",
        f"{prefix}CONFIG_URI": transform.url,
        f"{prefix}CONFIG_TOKEN": transform.token,
        f"{prefix}CONFIG_ENGINE_TYPE": "TRANSFORM",
    }
    fields = {"fields": [{"fieldName": "card", "keyId": "cards"}]}
    tokenize = InterceptorSpec("tokenize", "encryption", config={"kmsConnectionName": "TOKENS", "recordValue": fields})
    restore = InterceptorSpec(
        "restore",
        "decryption",
        scope=Scope(username="reader"),
        config={"kmsConnectionName": "TOKENS", "recordValue": fields},
    )
    topic = "tokens-" + unique_topic()
    documents = [{"card": f"41111111111111{i:02d}", "n": i} for i in range(3)]
    with encryption_gateway(tansu, [tokenize, restore], env, ("writer", "reader")) as gw:
        writer = login(gw, "writer")
        create_topic(writer, topic)
        produce(writer, topic, [(None, json.dumps(d).encode(), []) for d in documents])
        stored = [json.loads(m.value()) for m in consume(direct(tansu), topic, 3)]
        assert [s["n"] for s in stored] == [0, 1, 2]
        assert all(
            s["card"] != d["card"] and transform.vault[s["card"]] == d["card"]
            for s, d in zip(stored, documents, strict=True)
        )
        assert [json.loads(m.value()) for m in consume(login(gw, "reader"), topic, 3)] == documents
        assert [json.loads(m.value()) for m in consume(writer, topic, 3)] == stored
