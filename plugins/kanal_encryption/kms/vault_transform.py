"""Vault's Transform engine: tokenization (format-preserving encryption, masking, tokens) by role.

Not a :class:`~kanal_encryption.kms.base.Kms`: there is no data key; the value itself goes to Vault
and comes back transformed. Requests and answers follow Vault's Transform API: ``POST
/v1/<mount>/encode/<role>`` with ``{"value", "transformation", "tweak"}`` -> ``{"data":
{"encoded_value"}}``, or ``{"batch_input": [{"value", ...}]}`` -> ``{"data": {"batch_results":
[{"encoded_value"}]}}``; ``decode`` likewise with ``decoded_value``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from kanal_encryption.kms.base import KmsError
from kanal_encryption.kms.vault_client import VaultClient, VaultSettings

__all__ = ["VaultTransform"]


class VaultTransform:
    """Encodes and decodes values with the roles of one Transform mount."""

    kind = "vault-transform"

    def __init__(self, settings: VaultSettings) -> None:
        self.settings = settings
        self._vault = VaultClient(settings)

    def _path(self, op: str, role: str) -> str:
        return f"{quote(self.settings.mount.strip('/'), safe='/')}/{op}/{quote(role, safe='')}"

    @staticmethod
    def _item(value: str, transformation: str | None, tweak: str | None) -> dict[str, str]:
        item = {"value": value}
        if transformation:
            item["transformation"] = transformation
        if tweak:
            item["tweak"] = tweak
        return item

    async def _one(self, op: str, role: str, value: str, transformation: str | None, tweak: str | None) -> str:
        what = f"Vault transform {op} with role {role!r}"
        answer = await self._vault.call("POST", self._path(op, role), self._item(value, transformation, tweak), what)
        out = (answer.get("data") or {}).get(f"{op}d_value")
        if not isinstance(out, str):
            raise KmsError(f"{what}: Vault answered without a {op}d_value", retriable=False)
        return out

    async def _batch(self, op: str, role: str, values: Sequence[str], transformation: str | None) -> list[str]:
        what = f"Vault transform {op} with role {role!r}"
        if not values:
            return []
        body = {"batch_input": [self._item(v, transformation, None) for v in values]}
        answer = await self._vault.call("POST", self._path(op, role), body, what)
        results: Any = (answer.get("data") or {}).get("batch_results")
        if not isinstance(results, list) or len(results) != len(values):
            raise KmsError(
                f"{what}: Vault answered {len(results or [])} results for {len(values)} values", retriable=False
            )
        out = []
        for i, result in enumerate(results):
            value = result.get(f"{op}d_value") if isinstance(result, dict) else None
            if not isinstance(value, str):  # Vault's item error may quote the value: not repeated here
                raise KmsError(f"{what}: item {i} of the batch failed", retriable=False)
            out.append(value)
        return out

    async def encode(
        self, role: str, value: str, *, transformation: str | None = None, tweak: str | None = None
    ) -> str:
        """The token (or masked/FPE value) of ``value``."""
        return await self._one("encode", role, value, transformation, tweak)

    async def decode(
        self, role: str, value: str, *, transformation: str | None = None, tweak: str | None = None
    ) -> str:
        """The original value of an encoded one (masking transformations cannot be decoded)."""
        return await self._one("decode", role, value, transformation, tweak)

    async def encode_batch(self, role: str, values: Sequence[str], *, transformation: str | None = None) -> list[str]:
        """Encodes several values in one call, in order."""
        return await self._batch("encode", role, values, transformation)

    async def decode_batch(self, role: str, values: Sequence[str], *, transformation: str | None = None) -> list[str]:
        return await self._batch("decode", role, values, transformation)

    async def check(self) -> None:
        await self._vault.check()

    async def aclose(self) -> None:
        await self._vault.aclose()
