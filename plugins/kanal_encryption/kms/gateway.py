"""The gateway KMS (``gateway-kms://<key id>``): one key per key id, made by the gateway, for crypto
shredding.

An external KMS holds a handful of keys; shredding one user's data needs a key per user (per record
key, per template value). The gateway KMS makes those keys itself: per key id a key encryption key
(KEK, 32 random bytes) wrapped by a master key and kept in the keys topic
(:mod:`kanal_encryption.kms.keystore`). The master is any other KMS's key: a key of a KMS connection
(``gateway.masterKeyId`` beside ``kmsConnectionName``) or an inline key URI
(``kmsConfig.gateway.masterKeyId``); :class:`kanal_encryption.keys.Locator` builds either, and this
class does not tell them apart (``master_ref``, what the keys topic records, names the master).
``wrap`` encrypts a DEK with the key id's KEK (AES-256-GCM); the EDEK names the KEK by its uuid::

    0x01 | KEK uuid (16 bytes) | nonce (12 bytes) | AES-256-GCM(DEK, aad = key id 0x00 uuid)

``unwrap`` finds the KEK by uuid (unwrapping it with the master key once, then from memory, at most
``max_keys`` per interceptor) and raises :class:`KmsKeyNotFound` when the key id was deleted: what it
encrypted can never be read again. A key id used again after its deletion gets a new KEK.
"""

from __future__ import annotations

import os
import uuid as uuidlib
from collections import OrderedDict
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .base import Kms, KmsError, KmsKeyNotFound
from .keystore import KeyStore, StoredKey

__all__ = ["GatewayKms"]

_VERSION: Final = 1
_UUID: Final = 16
_NONCE: Final = 12
_HEADER: Final = 1 + _UUID + _NONCE
ALGORITHM: Final = "AES256_GCM"


class GatewayKms:
    """The :class:`~kanal_encryption.kms.base.Kms` of ``gateway-kms://`` keys, over one master key."""

    kind = "gateway-kms"

    def __init__(
        self, store: KeyStore, master: Kms, master_key_id: str, *, master_ref: str, max_keys: int = 1_000_000
    ) -> None:
        if max_keys < 1:
            raise ValueError("gateway.maxKeys must be >= 1")
        self.store = store
        self.master = master
        self.master_key_id = master_key_id
        self.master_ref = master_ref
        self.max_keys = max_keys
        self._keks: OrderedDict[str, tuple[str, AESGCM]] = OrderedDict()  # uuid -> (key id, KEK)
        self._by_key: dict[str, set[str]] = {}  # key id -> the uuids cached

    async def wrap(self, key_id: str, dek: bytes) -> bytes:
        for _ in range(3):
            entry = await self.store.current_or_new(key_id, self._make, ALGORITHM)
            kek = await self._kek(entry)
            if self.store.live(entry):  # (not deleted while the master unwrapped it)
                break
        else:
            raise KmsError(f"gateway KMS: key {key_id!r} is being deleted, try again", retriable=True)
        nonce = os.urandom(_NONCE)
        uuid = uuidlib.UUID(entry.uuid).bytes
        return bytes([_VERSION]) + uuid + nonce + kek.encrypt(nonce, dek, _aad(key_id, uuid))

    async def unwrap(self, key_id: str, edek: bytes) -> bytes:
        if len(edek) <= _HEADER or edek[0] != _VERSION:
            raise KmsError(f"gateway KMS: the EDEK of {key_id!r} is not a gateway KMS one", retriable=False)
        uuid_bytes = edek[1 : 1 + _UUID]
        uuid = str(uuidlib.UUID(bytes=uuid_bytes))
        entry = self.store.entry(key_id, uuid)
        if entry is None:
            await self.store.sync()  # made on another node a moment ago?
            entry = self.store.entry(key_id, uuid)
        if entry is None:
            self.forget(key_id)
            raise KmsKeyNotFound(f"gateway KMS: key {key_id!r} was deleted (crypto shredding) or never existed")
        kek = await self._kek(entry)
        if not self.store.live(entry):
            self.forget(key_id)
            raise KmsKeyNotFound(f"gateway KMS: key {key_id!r} was deleted (crypto shredding)")
        try:
            return kek.decrypt(edek[1 + _UUID : _HEADER], edek[_HEADER:], _aad(key_id, uuid_bytes))
        except InvalidTag:
            raise KmsError(f"gateway KMS: the EDEK was not wrapped by key {key_id!r}", retriable=False) from None

    async def _make(self, key_id: str, uuid: str) -> tuple[bytes, str]:
        """A new KEK for ``key_id``: wrapped by the master key (and kept unwrapped here)."""
        kek = AESGCM.generate_key(bit_length=256)
        wrapped = await self.master.wrap(self.master_key_id, kek)
        self._remember(uuid, key_id, AESGCM(kek))
        return wrapped, self.master_ref

    async def _kek(self, entry: StoredKey) -> AESGCM:
        found = self._keks.get(entry.uuid)
        if found is not None:
            self._keks.move_to_end(entry.uuid)
            return found[1]
        raw = await self.master.unwrap(self.master_key_id, entry.wrapped)
        if not isinstance(raw, bytes) or len(raw) != 32:
            raise KmsError(f"gateway KMS: the master key unwrapped no 32-byte key of {entry.key_id!r}", retriable=False)
        kek = AESGCM(raw)
        self._remember(entry.uuid, entry.key_id, kek)
        return kek

    def _remember(self, uuid: str, key_id: str, kek: AESGCM) -> None:
        self._keks[uuid] = (key_id, kek)
        self._by_key.setdefault(key_id, set()).add(uuid)
        while len(self._keks) > self.max_keys:
            old, (old_key, _) = self._keks.popitem(last=False)
            self._drop_index(old_key, old)

    def _drop_index(self, key_id: str, uuid: str) -> None:
        uuids = self._by_key.get(key_id)
        if uuids is not None:
            uuids.discard(uuid)
            if not uuids:
                del self._by_key[key_id]

    def forget(self, key_id: str) -> None:
        """Drops the unwrapped KEKs of ``key_id`` (it was deleted)."""
        for uuid in self._by_key.pop(key_id, ()):
            self._keks.pop(uuid, None)

    @property
    def cached_keys(self) -> int:
        return len(self._keks)

    async def check(self) -> None:
        await self.master.check()

    async def aclose(self) -> None:
        return None  # the master belongs to the interceptor's pool, which closes it


def _aad(key_id: str, uuid: bytes) -> bytes:
    return key_id.encode("utf-8") + b"\x00" + uuid
