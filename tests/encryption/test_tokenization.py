"""Tokenization with a Transform connection: fields replaced by tokens of a role and restored, one
Transform call per role and batch, repeated values remembered. Against a local server answering
Vault's documented Transform requests and responses (OpenBao has no Transform engine)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import msgspec
import pytest
import trio
from kanal_encryption.config import EncryptionConfig
from kanal_encryption.encrypt import EncryptionFailed
from kanal_encryption.kms.connections import parse_kms_connections
from kanal_encryption.kms.factory import KmsPool
from kanal_encryption.tokenize import Tokenization, tokenization_of
from kms_fakes import FakeVaultTransform

from kanal.api import InterceptorConfigError, Record, RecordBatch, encode_batch


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
