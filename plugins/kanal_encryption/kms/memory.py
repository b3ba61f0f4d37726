"""A KMS inside the gateway process, for development and tests.

Keys are made on first use and kept in memory only: they are lost when the process stops (what they
wrapped can then never be read again) and differ between gateway nodes. KEKs are AES-256 keys; an
EDEK is a 12-byte nonce and the AES-GCM ciphertext of the DEK, authenticated with the key id.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from kanal_encryption.kms.base import KmsError, KmsKeyNotFound

__all__ = ["InMemoryKms"]

#: The process's keys: every InMemoryKms shares them unless given its own store, so an encryption
#: and a decryption interceptor of one gateway see the same keys.
_SHARED: dict[str, bytes] = {}
_NONCE = 12


class InMemoryKms:
    """The :class:`~kanal_encryption.kms.base.Kms` of ``in-memory-kms://`` keys."""

    kind = "in-memory-kms"

    def __init__(self, store: MutableMapping[str, bytes] | None = None) -> None:
        self._keys = _SHARED if store is None else store

    def _key(self, key_id: str, *, create: bool) -> AESGCM:
        key = self._keys.get(key_id)
        if key is None:
            if not create:
                raise KmsKeyNotFound(f"in-memory KMS: no key {key_id!r} (keys are lost when the gateway restarts)")
            key = self._keys.setdefault(key_id, AESGCM.generate_key(bit_length=256))
        return AESGCM(key)

    async def wrap(self, key_id: str, dek: bytes) -> bytes:
        nonce = os.urandom(_NONCE)
        return nonce + self._key(key_id, create=True).encrypt(nonce, dek, key_id.encode("utf-8"))

    async def unwrap(self, key_id: str, edek: bytes) -> bytes:
        aead = self._key(key_id, create=False)
        try:
            return aead.decrypt(edek[:_NONCE], edek[_NONCE:], key_id.encode("utf-8"))
        except (InvalidTag, ValueError):
            raise KmsError(f"in-memory KMS: the EDEK was not wrapped by key {key_id!r}", retriable=False) from None

    def delete_key(self, key_id: str) -> None:
        """Forgets a key (crypto shredding): what it wrapped can no longer be unwrapped."""
        self._keys.pop(key_id, None)

    async def check(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
