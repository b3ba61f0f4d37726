"""Google Cloud KMS against a local fake following the documented REST requests and answers (no
Cloud KMS can run here): service account JWT bearer grant, encrypt/decrypt, errors."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from kanal_encryption.kms.base import KmsError, KmsKeyNotFound
from kanal_encryption.kms.connections import parse_kms_connections
from kanal_encryption.kms.gcp import GcpKms, GcpSettings
from kms_fakes import FakeGcp

RING = "projects/p1/locations/europe-west1/keyRings/kanal"


@pytest.fixture
def gcp() -> Iterator[FakeGcp]:
    with FakeGcp().running() as fake:
        yield fake


async def round_trip(kms: GcpKms, key_id: str) -> None:
    try:
        dek = os.urandom(32)
        edek = await kms.wrap(key_id, dek)
        assert dek not in edek
        assert await kms.unwrap(key_id, edek) == dek
    finally:
        await kms.aclose()


def test_round_trip_with_a_service_account_key_file(gcp: FakeGcp, tmp_path: Path) -> None:
    name = gcp.create_key(f"{RING}/cryptoKeys/orders")
    key_file = gcp.write_key_file(tmp_path / "sa.json")
    kms = GcpKms(GcpSettings(credentials_file=str(key_file), endpoint=gcp.url))
    trio.run(lambda: round_trip(kms, name))


def test_round_trip_with_an_access_token_and_a_key_ring(gcp: FakeGcp) -> None:
    gcp.create_key(f"{RING}/cryptoKeys/orders")
    kms = GcpKms(GcpSettings(access_token=gcp.issue_token(), endpoint=gcp.url, key_ring=RING))
    trio.run(lambda: round_trip(kms, "orders"))


def test_destroyed_and_missing_keys_are_not_found(gcp: FakeGcp, tmp_path: Path) -> None:
    name = gcp.create_key(f"{RING}/cryptoKeys/tenant-1")
    key_file = gcp.write_key_file(tmp_path / "sa.json")

    async def main() -> None:
        kms = GcpKms(GcpSettings(credentials_file=str(key_file), endpoint=gcp.url))
        try:
            edek = await kms.wrap(name, b"d" * 32)
            gcp.destroy_key(name)
            with pytest.raises(KmsKeyNotFound):
                await kms.unwrap(name, edek)
            with pytest.raises(KmsKeyNotFound):
                await kms.wrap(f"{RING}/cryptoKeys/never", b"d" * 32)
        finally:
            await kms.aclose()

    trio.run(main)


def test_refused_access_token_is_not_retriable_and_not_shown(gcp: FakeGcp) -> None:
    name = gcp.create_key(f"{RING}/cryptoKeys/orders")
    wrong = "ya29.not-a-valid-token"

    async def main() -> None:
        kms = GcpKms(GcpSettings(access_token=wrong, endpoint=gcp.url))
        try:
            with pytest.raises(KmsError) as caught:
                await kms.wrap(name, b"d" * 32)
            assert not caught.value.retriable
            assert wrong not in str(caught.value)
        finally:
            await kms.aclose()

    trio.run(main)


def test_key_file_of_another_account_is_refused(gcp: FakeGcp, tmp_path: Path) -> None:
    with FakeGcp().running() as other:
        key_file = other.write_key_file(tmp_path / "other.json")
    text = key_file.read_text().replace(other.url, gcp.url)  # the right endpoint, the wrong key
    key_file.write_text(text)

    async def main() -> None:
        kms = GcpKms(GcpSettings(credentials_file=str(key_file), endpoint=gcp.url))
        try:
            with pytest.raises(KmsError) as caught:
                await kms.check()
            assert not caught.value.retriable
            assert "invalid_grant" in str(caught.value)
            assert "PRIVATE KEY" not in str(caught.value)
        finally:
            await kms.aclose()

    trio.run(main)


def test_connection_from_environment(gcp: FakeGcp, tmp_path: Path) -> None:
    gcp.create_key(f"{RING}/cryptoKeys/orders")
    key_file = gcp.write_key_file(tmp_path / "sa.json")
    prefix = "GATEWAY_EXTERNAL_CONNECTION_GCP_"
    env = {
        f"{prefix}TYPE": "GCP_KMS",
        f"{prefix}CONFIG_CREDENTIALS_FILE": str(key_file),
        f"{prefix}CONFIG_ENDPOINT": gcp.url,
        f"{prefix}CONFIG_KEY_RING": RING,
    }
    kms = parse_kms_connections(env, env)["GCP"].build()
    assert isinstance(kms, GcpKms)
    trio.run(lambda: round_trip(kms, "orders"))
