"""Inline kmsConfig blocks and keySecretId URIs: parsing, errors, shared clients, and real round
trips through OpenBao and moto."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest
import trio
from kanal_encryption.kms.aws import AwsKms, AwsSettings
from kanal_encryption.kms.azure import AzureKeyVaultKms
from kanal_encryption.kms.factory import KmsPool
from kanal_encryption.kms.gcp import GcpKms
from kanal_encryption.kms.inline import (
    DEFAULT_KEY_TTL_MS,
    KeySecretId,
    check_key_name,
    parse_key_secret_id,
    parse_kms_config,
    resolve_key,
)
from kanal_encryption.kms.memory import InMemoryKms
from kanal_encryption.kms.vault import VaultTransitKms
from kanal_encryption.kms.vault_transform import VaultTransform

from kanal.api import InterceptorConfigError

if TYPE_CHECKING:
    from conftest import MotoKms, OpenBao


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (
            "vault-kms://vault:8200/transit/keys/orders",
            KeySecretId("vault-kms", "orders", "vault:8200", "transit", "vault-kms://vault:8200/transit/keys/orders"),
        ),
        (
            "vault-kms://vault:8200/team/transit/keys/orders-v2",
            KeySecretId(
                "vault-kms",
                "orders-v2",
                "vault:8200",
                "team/transit",
                "vault-kms://vault:8200/team/transit/keys/orders-v2",
            ),
        ),
        (
            "vault-transform://vault:8200/transform/role/payments",
            KeySecretId(
                "vault-transform",
                "payments",
                "vault:8200",
                "transform",
                "vault-transform://vault:8200/transform/role/payments",
            ),
        ),
        (
            "aws-kms://arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
            KeySecretId(
                "aws-kms",
                "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
                uri="aws-kms://arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
            ),
        ),
        ("aws-kms://alias/orders", KeySecretId("aws-kms", "alias/orders", uri="aws-kms://alias/orders")),
        (
            "azure-kms://my-vault.vault.azure.net/keys/orders/0123abcd",
            KeySecretId(
                "azure-kms",
                "orders/0123abcd",
                "my-vault.vault.azure.net",
                uri="azure-kms://my-vault.vault.azure.net/keys/orders/0123abcd",
            ),
        ),
        (
            "gcp-kms://projects/p/locations/global/keyRings/r/cryptoKeys/k",
            KeySecretId(
                "gcp-kms",
                "projects/p/locations/global/keyRings/r/cryptoKeys/k",
                uri="gcp-kms://projects/p/locations/global/keyRings/r/cryptoKeys/k",
            ),
        ),
        ("in-memory-kms://orders", KeySecretId("in-memory-kms", "orders", uri="in-memory-kms://orders")),
    ],
)
def test_key_secret_ids(uri: str, expected: KeySecretId) -> None:
    assert parse_key_secret_id(uri) == expected
    assert parse_key_secret_id(uri, templates=False) == expected


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("orders", "not a KMS key URI"),
        ("vault://vault:8200/transit/keys/k", "did you mean vault-kms://"),
        ("vault-kms://vault:8200/keys/k", "expected vault-kms://<host:port>/<mount>/keys/<key>"),
        ("vault-kms://vault:8200/transit/key/k", "malformed"),
        ("vault-kms://vault:8200/transit/keys/1orders", "invalid key name '1orders'"),
        ("vault-kms://vault:8200/transit/keys/orders.v1", "invalid key name"),
        ("vault-transform://vault:8200/transform/roles/p", "malformed"),
        ("aws-kms://arn:aws:kms:eu-west-1:12:key/x", "malformed"),
        ("azure-kms://v.vault.azure.net/secrets/k", "malformed"),
        ("gcp-kms://projects/p/keyRings/r/cryptoKeys/k", "malformed"),
        ("in-memory-kms://a/b", "malformed"),
        ("in-memory-kms://", "malformed"),
    ],
)
def test_bad_key_secret_ids(uri: str, message: str) -> None:
    with pytest.raises(InterceptorConfigError) as caught:
        parse_key_secret_id(uri, where="recordValue.fields[0].keySecretId")
    assert isinstance(caught.value, ValueError)
    assert str(caught.value).startswith("recordValue.fields[0].keySecretId: ")
    assert message in str(caught.value)


def test_templates_accepted_at_config_time_only() -> None:
    uri = "vault-kms://vault:8200/transit/keys/{{record.topic}}-{{record.header.tenant}}"
    assert parse_key_secret_id(uri).key_id == "{{record.topic}}-{{record.header.tenant}}"
    assert parse_key_secret_id(uri).templated
    with pytest.raises(InterceptorConfigError, match="unresolved template"):
        parse_key_secret_id(uri, templates=False)
    with pytest.raises(InterceptorConfigError, match="invalid key name"):  # resolved to a bad name
        parse_key_secret_id("vault-kms://vault:8200/transit/keys/42-acme", templates=False)
    assert check_key_name("{{record.key}}") == "{{record.key}}"
    assert check_key_name("tenant_{{record.key}}") == "tenant_{{record.key}}"
    with pytest.raises(InterceptorConfigError):
        check_key_name("{{record.key}}", templates=False)
    with pytest.raises(InterceptorConfigError):
        check_key_name("9lives")


def test_kms_config_blocks() -> None:
    config = parse_kms_config(
        {
            "keyTtlMs": 60000,
            "vault": {"uri": "http://vault:8200", "type": "APP_ROLE", "roleId": "r", "secretId": "s", "version": 1},
            "aws": {"basicCredentials": {"accessKey": "a", "secretKey": "s"}, "region": "eu-west-1"},
            "azure": {"tokenCredential": {"clientId": "c", "tenantId": "t", "clientSecret": "s"}},
            "gcp": {"serviceAccountCredentialsFilePath": "sa.json"},
        }
    )
    assert config.key_ttl_ms == 60000
    assert config.vault is not None and config.vault.uri == "http://vault:8200"
    assert (config.vault.auth.type, config.vault.auth.role_id, config.vault.auth.auth_mount()) == (
        "APP_ROLE",
        "r",
        "approle",
    )
    assert config.aws == AwsSettings(region="eu-west-1", access_key="a", secret_key="s")
    assert config.azure is not None and (config.azure.client_id, config.azure.tenant_id) == ("c", "t")
    assert config.gcp is not None and config.gcp.credentials_file == "sa.json"
    session = parse_kms_config(
        {"aws": {"sessionCredentials": {"accessKey": "a", "secretKey": "s", "sessionToken": "t"}}}
    )
    assert session.aws is not None and session.aws.session_token == "t"
    empty = parse_kms_config(None)
    assert (empty.vault, empty.aws, empty.key_ttl_ms) == (None, None, DEFAULT_KEY_TTL_MS)
    userpass = parse_kms_config(
        {"vault": {"type": "USERNAME_PASSWORD", "username": "u", "password": "p", "userpassAuthMount": "up"}}
    )
    assert userpass.vault is not None and userpass.vault.auth.auth_mount() == "up"


@pytest.mark.parametrize(
    ("config", "where"),
    [
        ({"vault": {"tokne": "t"}}, "kmsConfig.vault.tokne: unknown key (did you mean token?)"),
        ({"vault": {"type": "GITHUB"}}, "kmsConfig.vault.type: unsupported auth type"),
        ({"vault": {"type": "TOKEN"}}, "kmsConfig.vault.token: required"),
        ({"vault": {"type": "APP_ROLE", "roleId": "r"}}, "kmsConfig.vault.secretId: required"),
        ({"aws": {"basicCredentials": {"accessKey": "a"}}}, "kmsConfig.aws.basicCredentials.secretKey: required"),
        (
            {"aws": {"basicCredentials": {"accessKey": "a", "secretKey": "s"}, "sessionCredentials": {}}},
            "kmsConfig.aws: give basicCredentials or sessionCredentials",
        ),
        ({"azure": {}}, "kmsConfig.azure: give tokenCredential"),
        (
            {"azure": {"tokenCredential": {"clientId": "c", "tenantId": "t"}}},
            "kmsConfig.azure.tokenCredential.clientSecret",
        ),
        ({"keyTtlMs": -1}, "kmsConfig.keyTtlMs: expected a non-negative integer"),
        ({"vault": "http://vault"}, "kmsConfig.vault: expected an object"),
        ({"valt": {}}, "kmsConfig.valt: unknown key (did you mean vault?)"),
    ],
)
def test_kms_config_errors(config: dict[str, Any], where: str) -> None:
    with pytest.raises(InterceptorConfigError) as caught:
        parse_kms_config(config)
    assert str(caught.value).startswith(where)


def test_secrets_stay_out_of_reprs() -> None:
    config = parse_kms_config(
        {
            "vault": {"token": "vault-secret-token"},
            "aws": {"basicCredentials": {"accessKey": "a", "secretKey": "aws-secret-key"}},
            "azure": {"tokenCredential": {"clientId": "c", "tenantId": "t", "clientSecret": "azure-secret"}},
        }
    )
    for secret in ("vault-secret-token", "aws-secret-key", "azure-secret"):
        assert secret not in repr(config)


def test_one_client_per_kms_and_credentials() -> None:
    config = parse_kms_config(
        {
            "vault": {"token": "t"},
            "azure": {"tokenCredential": {"clientId": "c", "tenantId": "t", "clientSecret": "s"}},
            "gcp": {"accessToken": "ya29"},
        }
    )
    other = parse_kms_config({"vault": {"token": "other"}})

    async def main() -> None:
        pool = KmsPool()
        a = resolve_key("vault-kms://vault:8200/transit/keys/a", config, pool)
        b = resolve_key("vault-kms://vault:8200/transit/keys/b", config, pool)
        c = resolve_key("vault-kms://vault:8200/transit/keys/a", other, pool)
        d = resolve_key("vault-kms://vault2:8200/transit/keys/a", config, pool)
        assert isinstance(a.kms, VaultTransitKms) and a.kms is b.kms
        assert (a.key_id, b.key_id) == ("a", "b")
        assert c.kms is not a.kms and d.kms is not a.kms
        assert a.kms.settings.uri == "https://vault:8200" and a.kms.settings.mount == "transit"
        t = resolve_key("vault-transform://vault:8200/tokens/role/payments", config, pool)
        assert isinstance(t.kms, VaultTransform) and t.kms.settings.mount == "tokens" and t.key_id == "payments"
        z = resolve_key("azure-kms://my-vault.vault.azure.net/keys/orders/v1", config, pool)
        assert isinstance(z.kms, AzureKeyVaultKms) and z.kms.settings.vault_url == "https://my-vault.vault.azure.net"
        assert z.key_id == "orders/v1"
        g = resolve_key("gcp-kms://projects/p/locations/l/keyRings/r/cryptoKeys/k", config, pool)
        assert isinstance(g.kms, GcpKms)
        m1 = resolve_key("in-memory-kms://x", config, pool)
        m2 = resolve_key("in-memory-kms://y", other, pool)
        assert isinstance(m1.kms, InMemoryKms) and m1.kms is m2.kms
        w = resolve_key("aws-kms://alias/k", other, pool)  # no aws block: the default credential chain
        assert isinstance(w.kms, AwsKms) and w.kms.settings == AwsSettings()
        assert len(pool) == 8
        await pool.aclose()
        assert len(pool) == 0

    trio.run(main)


def test_missing_block_is_an_error() -> None:
    pool = KmsPool()
    with pytest.raises(InterceptorConfigError, match=r"needs a kmsConfig\.vault block"):
        resolve_key("vault-kms://vault:8200/transit/keys/a", parse_kms_config({}), pool)
    with pytest.raises(InterceptorConfigError, match=r"needs a kmsConfig\.azure block"):
        resolve_key("azure-kms://v.vault.azure.net/keys/a", parse_kms_config({}), pool)


def test_inline_vault_round_trip(openbao: OpenBao) -> None:
    key = openbao.create_transit_key()
    host = openbao.address.removeprefix("http://")
    config = parse_kms_config({"vault": {"uri": openbao.address, "type": "TOKEN", "token": openbao.root_token}})

    async def main() -> None:
        pool = KmsPool()
        try:
            kms, key_id = resolve_key(f"vault-kms://{host}/transit/keys/{key}", config, pool)
            assert isinstance(kms, VaultTransitKms)
            edek = await kms.wrap(key_id, b"d" * 32)
            assert await kms.unwrap(key_id, edek) == b"d" * 32
        finally:
            await pool.aclose()

    trio.run(main)


def test_inline_aws_round_trip(moto_kms: MotoKms) -> None:
    _, arn = moto_kms.create_key()
    config = parse_kms_config(
        {
            "aws": {
                "basicCredentials": {"accessKey": moto_kms.access_key, "secretKey": moto_kms.secret_key},
                "endpoint": moto_kms.endpoint,
            }
        }
    )

    async def main() -> None:
        pool = KmsPool()
        try:
            kms, key_id = resolve_key(f"aws-kms://{arn}", config, pool)
            dek = os.urandom(32)
            assert await kms.unwrap(key_id, await kms.wrap(key_id, dek)) == dek  # type: ignore[union-attr]
        finally:
            await pool.aclose()

    trio.run(main)
