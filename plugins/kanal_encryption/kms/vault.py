"""Vault and OpenBao transit: the KEK is a transit key, and the EDEK is Vault's ciphertext.

wrap = ``POST /v1/<mount>/encrypt/<key>`` (base64 plaintext in, ``vault:v1:...`` out); unwrap =
``POST /v1/<mount>/decrypt/<key>``. The ciphertext names the key version, so old EDEKs stay
readable after the key is rotated, as long as its old versions are kept.
"""

from __future__ import annotations

from urllib.parse import quote

from kanal_encryption.kms.base import KmsError
from kanal_encryption.kms.codec import b64, from_b64
from kanal_encryption.kms.vault_client import VaultClient, VaultSettings

__all__ = ["VaultTransitKms"]


class VaultTransitKms:
    """The :class:`~kanal_encryption.kms.base.Kms` of a Vault (or OpenBao) transit engine."""

    kind = "vault-kms"

    def __init__(self, settings: VaultSettings) -> None:
        self.settings = settings
        self._vault = VaultClient(settings)

    def _path(self, op: str, key_id: str) -> str:
        return f"{quote(self.settings.mount.strip('/'), safe='/')}/{op}/{quote(key_id, safe='')}"

    async def wrap(self, key_id: str, dek: bytes) -> bytes:
        what = f"Vault transit encrypt with key {key_id!r}"
        answer = await self._vault.call("POST", self._path("encrypt", key_id), {"plaintext": b64(dek)}, what)
        ciphertext = (answer.get("data") or {}).get("ciphertext")
        if not isinstance(ciphertext, str):
            raise KmsError(f"{what}: Vault answered without a ciphertext", retriable=False)
        return ciphertext.encode("utf-8")

    async def unwrap(self, key_id: str, edek: bytes) -> bytes:
        what = f"Vault transit decrypt with key {key_id!r}"
        try:
            ciphertext = edek.decode("ascii")
        except UnicodeDecodeError:
            raise KmsError(f"{what}: the EDEK is not a Vault ciphertext", retriable=False) from None
        answer = await self._vault.call("POST", self._path("decrypt", key_id), {"ciphertext": ciphertext}, what)
        plaintext = (answer.get("data") or {}).get("plaintext")
        if not isinstance(plaintext, str):
            raise KmsError(f"{what}: Vault answered without a plaintext", retriable=False)
        return from_b64(plaintext, what)

    async def check(self) -> None:
        await self._vault.check()

    async def aclose(self) -> None:
        await self._vault.aclose()
