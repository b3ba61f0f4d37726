"""The in-memory KMS: keys made on first use, shared in the process, gone when deleted."""

from __future__ import annotations

import os

import pytest
import trio
from kanal_encryption.kms.base import Kms, KmsError, KmsKeyNotFound
from kanal_encryption.kms.memory import InMemoryKms


def test_round_trip_and_protocol() -> None:
    async def main() -> None:
        kms = InMemoryKms({})
        assert isinstance(kms, Kms)
        dek = os.urandom(32)
        edek = await kms.wrap("orders", dek)
        assert dek not in edek
        assert await kms.unwrap("orders", edek) == dek
        await kms.check()
        await kms.aclose()

    trio.run(main)


def test_instances_share_the_process_keys() -> None:
    """An encryption and a decryption interceptor each make their client: both see the same keys."""

    async def main() -> None:
        key = f"shared-{os.urandom(4).hex()}"
        edek = await InMemoryKms().wrap(key, b"d" * 16)
        assert await InMemoryKms().unwrap(key, edek) == b"d" * 16

    trio.run(main)


def test_unknown_and_deleted_keys_are_not_found() -> None:
    async def main() -> None:
        kms = InMemoryKms({})
        with pytest.raises(KmsKeyNotFound):
            await kms.unwrap("never", b"\x00" * 40)
        edek = await kms.wrap("tenant-1", b"d" * 16)
        kms.delete_key("tenant-1")
        with pytest.raises(KmsKeyNotFound):
            await kms.unwrap("tenant-1", edek)

    trio.run(main)


def test_edek_of_another_key_is_refused() -> None:
    async def main() -> None:
        kms = InMemoryKms({})
        edek = await kms.wrap("a", b"d" * 16)
        await kms.wrap("b", b"d" * 16)
        with pytest.raises(KmsError) as caught:
            await kms.unwrap("b", edek)
        assert not caught.value.retriable and not isinstance(caught.value, KmsKeyNotFound)

    trio.run(main)
