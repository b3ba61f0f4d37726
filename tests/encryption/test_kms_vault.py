"""Vault transit against a real OpenBao: every auth method, missing keys, outages, bad credentials."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import httpx
import pytest
import trio
from kanal_encryption.kms.base import KmsError, KmsKeyNotFound
from kanal_encryption.kms.connections import parse_kms_connections
from kanal_encryption.kms.vault import VaultTransitKms
from kanal_encryption.kms.vault_client import VaultAuth, VaultSettings

if TYPE_CHECKING:
    from conftest import OpenBao

T = TypeVar("T")


def run(fn: Callable[[], Awaitable[T]]) -> T:
    return trio.run(fn)


def kms_for(bao: OpenBao, auth: VaultAuth, **settings: object) -> VaultTransitKms:
    return VaultTransitKms(VaultSettings(uri=bao.address, auth=auth, **settings))  # type: ignore[arg-type]


async def round_trip(kms: VaultTransitKms, key: str) -> None:
    try:
        dek = os.urandom(32)
        edek = await kms.wrap(key, dek)
        assert edek.startswith(b"vault:v1:")
        assert dek not in edek
        assert await kms.unwrap(key, edek) == dek
    finally:
        await kms.aclose()


def auths(bao: OpenBao, tmp_path: Path) -> dict[str, VaultAuth]:
    jwt_file = tmp_path / "token"
    jwt_file.write_text(bao.make_jwt() + "\n")
    return {
        "token": VaultAuth(type="TOKEN", token=bao.root_token),
        "approle": VaultAuth(type="APP_ROLE", role_id=bao.approle_role_id, secret_id=bao.approle_secret_id),
        "userpass": VaultAuth(type="USERNAME_PASSWORD", username=bao.username, password=bao.password),
        "jwt": VaultAuth(type="JWT", role="kanal", jwt=bao.make_jwt()),
        # Kubernetes login sends the same {role, jwt} to its mount; no Kubernetes API server can
        # review tokens here, so it logs in through the JWT mount, reading the JWT from its file.
        "kubernetes-via-jwt-mount": VaultAuth(type="KUBERNETES", role="kanal", jwt_path=str(jwt_file), mount="jwt"),
    }


@pytest.mark.parametrize("method", ["token", "approle", "userpass", "jwt", "kubernetes-via-jwt-mount"])
def test_round_trip_with_each_auth_method(openbao: OpenBao, tmp_path: Path, method: str) -> None:
    key = openbao.create_transit_key()
    run(lambda: round_trip(kms_for(openbao, auths(openbao, tmp_path)[method]), key))


@pytest.mark.parametrize("method", ["token", "approle", "userpass"])
def test_check_passes_with_good_credentials(openbao: OpenBao, tmp_path: Path, method: str) -> None:
    async def main() -> None:
        kms = kms_for(openbao, auths(openbao, tmp_path)[method])
        try:
            await kms.check()
        finally:
            await kms.aclose()

    run(main)


def test_deleted_key_cannot_unwrap(openbao: OpenBao) -> None:
    key = openbao.create_transit_key()

    async def main() -> None:
        kms = kms_for(openbao, VaultAuth(token=openbao.root_token))
        try:
            edek = await kms.wrap(key, b"k" * 32)
            openbao.delete_transit_key(key)
            with pytest.raises(KmsKeyNotFound) as caught:
                await kms.unwrap(key, edek)
            assert not caught.value.retriable
            assert key in str(caught.value)
        finally:
            await kms.aclose()

    run(main)


def test_wrong_token_is_not_retriable_and_not_shown(openbao: OpenBao) -> None:
    key = openbao.create_transit_key()
    wrong = "s.wrong-token-0123456789"

    async def main() -> None:
        kms = kms_for(openbao, VaultAuth(token=wrong))
        try:
            with pytest.raises(KmsError) as caught:
                await kms.wrap(key, b"k" * 32)
            assert not caught.value.retriable
            assert "403" in str(caught.value)
            assert wrong not in str(caught.value) and wrong not in repr(caught.value)
            with pytest.raises(KmsError):
                await kms.check()
        finally:
            await kms.aclose()

    run(main)


def test_wrong_approle_secret_is_not_retriable_and_not_shown(openbao: OpenBao) -> None:
    secret = "not-the-secret-id-42"

    async def main() -> None:
        kms = kms_for(openbao, VaultAuth(type="APP_ROLE", role_id=openbao.approle_role_id, secret_id=secret))
        try:
            with pytest.raises(KmsError) as caught:
                await kms.wrap("anything", b"k" * 32)
            assert not caught.value.retriable
            assert secret not in str(caught.value)
            assert "login" in str(caught.value).lower()
        finally:
            await kms.aclose()

    run(main)


def test_policy_limits_a_login_token(openbao: OpenBao) -> None:
    """The AppRole token may only encrypt and decrypt: reading a key is refused, and not retried."""

    async def main() -> None:
        kms = kms_for(
            openbao, VaultAuth(type="APP_ROLE", role_id=openbao.approle_role_id, secret_id=openbao.approle_secret_id)
        )
        try:
            # transit upserts a missing key on encrypt only with "create": this policy has "update" only
            with pytest.raises(KmsError) as caught:
                await kms.wrap("never-created", b"k" * 32)
            assert not caught.value.retriable
        finally:
            await kms.aclose()

    run(main)


def test_revoked_login_token_is_replaced(openbao: OpenBao) -> None:
    key = openbao.create_transit_key()

    async def main() -> None:
        auth = VaultAuth(type="USERNAME_PASSWORD", username=openbao.username, password=openbao.password)
        kms = kms_for(openbao, auth)
        try:
            edek = await kms.wrap(key, b"d" * 32)
            token = await kms._vault.token()
            assert token is not None
            openbao.api("POST", "auth/token/revoke", {"token": token})
            assert await kms.unwrap(key, edek) == b"d" * 32  # 403, a new login, the call again
            assert await kms._vault.token() != token
        finally:
            await kms.aclose()

    run(main)


def test_stopped_vault_is_retriable(start_openbao: Callable[[], OpenBao]) -> None:
    bao = start_openbao()
    key = bao.create_transit_key()

    async def main() -> None:
        kms = kms_for(bao, VaultAuth(token=bao.root_token), timeout_ms=2000)
        try:
            edek = await kms.wrap(key, b"x" * 32)
            bao.stop()
            with pytest.raises(KmsError) as caught:
                await kms.unwrap(key, edek)
            assert caught.value.retriable
            assert bao.root_token not in str(caught.value)
            with pytest.raises(KmsError) as caught:
                await kms.check()
            assert caught.value.retriable
        finally:
            await kms.aclose()

    run(main)


def test_custom_transit_mount_and_namespace(openbao: OpenBao) -> None:
    openbao.api("POST", "sys/namespaces/team-a", {})
    headers_ns = {"X-Vault-Namespace": "team-a"}

    for path, body in (("sys/mounts/keys-engine", {"type": "transit"}), ("keys-engine/keys/orders", None)):
        response = httpx.post(
            f"{openbao.address}/v1/{path}", json=body, headers={"X-Vault-Token": openbao.root_token, **headers_ns}
        )
        assert response.status_code < 300, response.text

    async def main() -> None:
        kms = kms_for(openbao, VaultAuth(token=openbao.root_token), mount="keys-engine", namespace="team-a")
        await round_trip(kms, "orders")
        outside = kms_for(openbao, VaultAuth(token=openbao.root_token), mount="keys-engine")
        try:
            with pytest.raises(KmsError) as caught:  # the mount exists only in the namespace
                await outside.wrap("orders", b"x" * 32)
            assert not caught.value.retriable
        finally:
            await outside.aclose()

    run(main)


def test_connection_from_environment_round_trips(openbao: OpenBao) -> None:
    key = openbao.create_transit_key()
    env = {
        "GATEWAY_EXTERNAL_CONNECTION_MY_VAULT_TYPE": "VAULT",
        "GATEWAY_EXTERNAL_CONNECTION_MY_VAULT_CONFIG_URI": "${KANAL_TEST_BAO_ADDR}",
        "GATEWAY_EXTERNAL_CONNECTION_MY_VAULT_CONFIG_AUTH_TYPE": "APP_ROLE",
        "GATEWAY_EXTERNAL_CONNECTION_MY_VAULT_CONFIG_ROLE_ID": openbao.approle_role_id,
        "GATEWAY_EXTERNAL_CONNECTION_MY_VAULT_CONFIG_SECRET_ID": "${KANAL_TEST_SECRET_ID}",
        "GATEWAY_EXTERNAL_CONNECTION_MY_VAULT_CONFIG_ENGINE_MOUNT": "${KANAL_TEST_UNSET_MOUNT|transit}",
    }
    environ = {**env, "KANAL_TEST_BAO_ADDR": openbao.address, "KANAL_TEST_SECRET_ID": openbao.approle_secret_id}
    connection = parse_kms_connections(env, environ)["MY_VAULT"]
    assert connection.kind == "vault-kms"
    kms = connection.build()
    assert isinstance(kms, VaultTransitKms)
    run(lambda: round_trip(kms, key))


def test_login_token_near_its_lease_end_is_renewed(openbao: OpenBao) -> None:
    """Renewal keeps the token (no new login). The lease end is moved, not waited for."""
    key = openbao.create_transit_key()

    async def main() -> None:
        auth = VaultAuth(type="APP_ROLE", role_id=openbao.approle_role_id, secret_id=openbao.approle_secret_id)
        kms = kms_for(openbao, auth)
        try:
            edek = await kms.wrap(key, b"d" * 32)
            token = await kms._vault.token()
            kms._vault._renew_at = 0.0  # as if two thirds of the lease had passed
            assert await kms.unwrap(key, edek) == b"d" * 32
            assert await kms._vault.token() == token
            assert kms._vault._renew_at is not None and kms._vault._renew_at > 0.0
        finally:
            await kms.aclose()

    run(main)
