"""AWS KMS against a real moto server: signed JSON calls, every key id form, errors."""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

import pytest
import trio
from kanal_encryption.kms.aws import AwsKms, AwsSettings
from kanal_encryption.kms.base import KmsError, KmsKeyNotFound
from kanal_encryption.kms.connections import parse_kms_connections

if TYPE_CHECKING:
    from conftest import MotoKms


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def kms_for(moto: MotoKms, **overrides: object) -> AwsKms:
    settings = {
        "region": moto.region,
        "access_key": moto.access_key,
        "secret_key": moto.secret_key,
        "endpoint": moto.endpoint,
        **overrides,
    }
    return AwsKms(AwsSettings(**settings))  # type: ignore[arg-type]


async def round_trip(kms: AwsKms, key_id: str) -> bytes:
    dek = os.urandom(32)
    edek = await kms.wrap(key_id, dek)
    assert dek not in edek
    assert await kms.unwrap(key_id, edek) == dek
    return edek


@pytest.mark.parametrize("form", ["key id", "key ARN", "alias name", "alias ARN"])
def test_round_trip_with_each_key_id_form(moto_kms: MotoKms, form: str) -> None:
    alias = f"alias/kanal-{os.urandom(4).hex()}"
    key_id, arn = moto_kms.create_key(alias)
    account = arn.split(":")[4]
    key = {
        "key id": key_id,
        "key ARN": arn,
        "alias name": alias,
        "alias ARN": f"arn:aws:kms:{moto_kms.region}:{account}:{alias}",
    }[form]

    async def main() -> None:
        kms = kms_for(moto_kms)
        try:
            await round_trip(kms, key)
        finally:
            await kms.aclose()

    trio.run(main)


def test_region_comes_from_the_arn(moto_kms: MotoKms) -> None:
    """Without a configured region, a key ARN says where the key is."""
    _, arn = moto_kms.create_key()

    async def main() -> None:
        kms = kms_for(moto_kms, region=None)
        try:
            await round_trip(kms, arn)
            with pytest.raises(KmsError) as caught:  # a bare key id has no region
                await kms.wrap("0b1c2d3e-aaaa-bbbb-cccc-0123456789ab", b"x" * 32)
            assert "region" in str(caught.value) and not caught.value.retriable
        finally:
            await kms.aclose()

    trio.run(main)


def test_session_credentials_are_sent(moto_kms: MotoKms) -> None:
    key_id, _ = moto_kms.create_key()

    async def main() -> None:
        kms = kms_for(moto_kms, session_token="session-token-value")
        try:
            await round_trip(kms, key_id)
        finally:
            await kms.aclose()

    trio.run(main)


def test_unknown_key_is_key_not_found(moto_kms: MotoKms) -> None:
    async def main() -> None:
        kms = kms_for(moto_kms)
        try:
            with pytest.raises(KmsKeyNotFound) as caught:
                await kms.wrap("alias/never-created", b"x" * 32)
            assert "NotFoundException" in str(caught.value)
            assert moto_kms.secret_key not in str(caught.value)
        finally:
            await kms.aclose()

    trio.run(main)


def test_check_passes(moto_kms: MotoKms) -> None:
    async def main() -> None:
        kms = kms_for(moto_kms)
        try:
            await kms.check()
        finally:
            await kms.aclose()

    trio.run(main)


def test_unreachable_endpoint_is_retriable(moto_kms: MotoKms) -> None:
    async def main() -> None:
        kms = kms_for(moto_kms, endpoint=f"http://127.0.0.1:{free_port()}", timeout_ms=2000)
        try:
            with pytest.raises(KmsError) as caught:
                await kms.wrap("alias/any", b"x" * 32)
            assert caught.value.retriable
            assert moto_kms.secret_key not in str(caught.value)
        finally:
            await kms.aclose()

    trio.run(main)


def test_default_credential_chain(moto_kms: MotoKms, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ACCESS_KEY and SECRET_KEY, botocore's chain (here its environment variables) is used."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_kms.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_kms.secret_key)
    key_id, _ = moto_kms.create_key()

    async def main() -> None:
        kms = kms_for(moto_kms, access_key=None, secret_key=None)
        try:
            await round_trip(kms, key_id)
        finally:
            await kms.aclose()

    trio.run(main)


def test_connection_from_environment_round_trips(moto_kms: MotoKms) -> None:
    key_id, _ = moto_kms.create_key()
    prefix = "GATEWAY_EXTERNAL_CONNECTION_AWS_"
    env = {
        f"{prefix}TYPE": "AWS_KMS",
        f"{prefix}CONFIG_REGION": moto_kms.region,
        f"{prefix}CONFIG_ACCESS_KEY": moto_kms.access_key,
        f"{prefix}CONFIG_SECRET_KEY": "${KANAL_TEST_AWS_SECRET}",
        f"{prefix}CONFIG_ENDPOINT": moto_kms.endpoint,
    }
    connection = parse_kms_connections(env, {**env, "KANAL_TEST_AWS_SECRET": moto_kms.secret_key})["AWS"]
    assert connection.kind == "aws-kms"
    kms = connection.build()
    assert isinstance(kms, AwsKms)

    async def main() -> None:
        try:
            await round_trip(kms, key_id)
        finally:
            await kms.aclose()

    trio.run(main)
