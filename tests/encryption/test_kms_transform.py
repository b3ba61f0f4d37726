"""Vault Transform (tokenization) against a local fake following Vault's documented Transform API:
OpenBao, the real server of the other Vault tests, has no Transform engine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio
from kanal_encryption.kms.base import KmsError
from kanal_encryption.kms.connections import parse_kms_connections
from kanal_encryption.kms.vault_client import VaultAuth, VaultSettings
from kanal_encryption.kms.vault_transform import VaultTransform
from kms_fakes import FakeVaultTransform


@pytest.fixture
def transform() -> Iterator[FakeVaultTransform]:
    with FakeVaultTransform().running() as fake:
        fake.roles.add("payments")
        yield fake


def client_for(fake: FakeVaultTransform, token: str | None = None) -> VaultTransform:
    auth = VaultAuth(token=token or fake.token)
    return VaultTransform(VaultSettings(uri=fake.url, auth=auth, mount="transform"))


def test_encode_decode_one_and_batches(transform: FakeVaultTransform) -> None:
    async def main() -> None:
        client = client_for(transform)
        try:
            token = await client.encode("payments", "4111-1111-1111-1111", transformation="ccn")
            assert token != "4111-1111-1111-1111"
            assert await client.decode("payments", token) == "4111-1111-1111-1111"
            values = ["a@example.com", "b@example.com"]
            tokens = await client.encode_batch("payments", values)
            assert len(tokens) == 2 and tokens[0] != values[0]
            assert await client.decode_batch("payments", tokens) == values
            assert await client.encode_batch("payments", []) == []
            await client.check()
        finally:
            await client.aclose()

    trio.run(main)
    body_paths = [path for method, path, _ in transform.requests if method == "POST"]
    assert "/v1/transform/encode/payments" in body_paths and "/v1/transform/decode/payments" in body_paths


def test_failures(transform: FakeVaultTransform) -> None:
    async def main() -> None:
        client = client_for(transform)
        try:
            with pytest.raises(KmsError) as caught:
                await client.encode("no-such-role", "x")
            assert not caught.value.retriable
            with pytest.raises(KmsError) as caught:
                await client.decode_batch("payments", ["not-a-token"])
            assert "item 0" in str(caught.value) and "not-a-token" not in str(caught.value)
        finally:
            await client.aclose()
        wrong = client_for(transform, token="wrong-token-value")
        try:
            with pytest.raises(KmsError) as caught:
                await wrong.encode("payments", "x")
            assert not caught.value.retriable and "wrong-token-value" not in str(caught.value)
        finally:
            await wrong.aclose()

    trio.run(main)


def test_transform_connection(transform: FakeVaultTransform) -> None:
    prefix = "GATEWAY_EXTERNAL_CONNECTION_TOKENS_"
    env = {
        f"{prefix}TYPE": "VAULT",
        f"{prefix}CONFIG_URI": transform.url,
        f"{prefix}CONFIG_TOKEN": transform.token,
        f"{prefix}CONFIG_ENGINE_TYPE": "TRANSFORM",
    }
    connection = parse_kms_connections(env, env)["TOKENS"]
    assert connection.kind == "vault-transform"
    client = connection.build()
    assert isinstance(client, VaultTransform)
    assert client.settings.mount == "transform"

    async def main() -> None:
        try:
            token = await client.encode("payments", "secret")
            assert await client.decode("payments", token) == "secret"
        finally:
            await client.aclose()

    trio.run(main)
