"""Azure Key Vault against a local fake following the documented REST requests and answers
(no Key Vault can run here): wrap/unwrap, versions, tokens, errors."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import trio
from kanal_encryption.kms.azure import AzureKeyVaultKms, AzureSettings
from kanal_encryption.kms.base import KmsError, KmsKeyNotFound
from kanal_encryption.kms.connections import parse_kms_connections
from kms_fakes import FakeAzure


@pytest.fixture
def azure() -> Iterator[FakeAzure]:
    with FakeAzure().running() as fake:
        yield fake


def kms_for(fake: FakeAzure, **overrides: object) -> AzureKeyVaultKms:
    settings = {
        "vault_url": fake.url,
        "tenant_id": fake.tenant,
        "client_id": fake.client_id,
        "client_secret": fake.client_secret,
        "authority_host": fake.url,
        **overrides,
    }
    return AzureKeyVaultKms(AzureSettings(**settings))  # type: ignore[arg-type]


def test_round_trip_survives_key_rotation(azure: FakeAzure) -> None:
    azure.create_key("orders")

    async def main() -> None:
        kms = kms_for(azure)
        try:
            dek = os.urandom(32)
            edek = await kms.wrap("orders", dek)
            azure.create_key("orders")  # a new current version: the EDEK names the old one
            assert await kms.unwrap("orders", edek) == dek
            edek2 = await kms.wrap("orders", dek)
            assert await kms.unwrap("orders", edek2) == dek
        finally:
            await kms.aclose()

    trio.run(main)


def test_explicit_version_and_password_grant(azure: FakeAzure) -> None:
    version = azure.create_key("payments")

    async def main() -> None:
        kms = kms_for(azure, client_secret=None, username=azure.username, password=azure.password)
        try:
            edek = await kms.wrap(f"payments/{version}", b"d" * 32)
            assert await kms.unwrap(f"payments/{version}", edek) == b"d" * 32
            await kms.check()
        finally:
            await kms.aclose()

    trio.run(main)


def test_expired_token_is_requested_again(azure: FakeAzure) -> None:
    azure.create_key("orders")

    async def main() -> None:
        kms = kms_for(azure)
        try:
            edek = await kms.wrap("orders", b"d" * 32)
            azure.revoke_tokens()
            assert await kms.unwrap("orders", edek) == b"d" * 32
        finally:
            await kms.aclose()

    trio.run(main)


def test_deleted_key_is_not_found(azure: FakeAzure) -> None:
    azure.create_key("tenant-7")

    async def main() -> None:
        kms = kms_for(azure)
        try:
            edek = await kms.wrap("tenant-7", b"d" * 32)
            azure.delete_key("tenant-7")
            with pytest.raises(KmsKeyNotFound) as caught:
                await kms.unwrap("tenant-7", edek)
            assert "KeyNotFound" in str(caught.value)
        finally:
            await kms.aclose()

    trio.run(main)


def test_wrong_client_secret_is_not_retriable_and_not_shown(azure: FakeAzure) -> None:
    wrong = "definitely-wrong-secret"

    async def main() -> None:
        kms = kms_for(azure, client_secret=wrong)
        try:
            with pytest.raises(KmsError) as caught:
                await kms.check()
            assert not caught.value.retriable
            assert wrong not in str(caught.value)
            assert "invalid_client" in str(caught.value)
        finally:
            await kms.aclose()

    trio.run(main)


def test_connection_from_environment(azure: FakeAzure) -> None:
    azure.create_key("orders")
    prefix = "GATEWAY_EXTERNAL_CONNECTION_VAULT_AZ_"
    env = {
        f"{prefix}TYPE": "AZURE_KEY_VAULT",
        f"{prefix}CONFIG_VAULT_URL": azure.url,
        f"{prefix}CONFIG_TENANT_ID": azure.tenant,
        f"{prefix}CONFIG_CLIENT_ID": azure.client_id,
        f"{prefix}CONFIG_CLIENT_SECRET": azure.client_secret,
        f"{prefix}CONFIG_AUTHORITY_HOST": azure.url,
    }
    kms = parse_kms_connections(env, env)["VAULT_AZ"].build()
    assert isinstance(kms, AzureKeyVaultKms)

    async def main() -> None:
        try:
            edek = await kms.wrap("orders", b"d" * 32)
            assert await kms.unwrap("orders", edek) == b"d" * 32
        finally:
            await kms.aclose()

    trio.run(main)
