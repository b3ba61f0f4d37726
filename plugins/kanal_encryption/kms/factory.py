"""Making KMS clients from parsed settings, and sharing them.

A client holds a connection pool and login tokens, so every interceptor (and every key id) naming the
same KMS with the same credentials should use one: :class:`KmsPool` keeps one client per (kind,
settings), settings being frozen dataclasses that hold the endpoint and the credentials.
"""

from __future__ import annotations

from typing import TypeAlias

from kanal_encryption.kms.aws import AwsKms, AwsSettings
from kanal_encryption.kms.azure import AzureKeyVaultKms, AzureSettings
from kanal_encryption.kms.base import Kms
from kanal_encryption.kms.gcp import GcpKms, GcpSettings
from kanal_encryption.kms.memory import InMemoryKms
from kanal_encryption.kms.vault import VaultTransitKms
from kanal_encryption.kms.vault_client import VaultSettings
from kanal_encryption.kms.vault_transform import VaultTransform

__all__ = ["KINDS", "KmsClient", "KmsPool", "KmsSettings", "build"]

KmsSettings: TypeAlias = VaultSettings | AwsSettings | AzureSettings | GcpSettings | None
KmsClient: TypeAlias = Kms | VaultTransform
#: The kinds of KMS, as the schemes of their inline key ids.
KINDS = ("vault-kms", "vault-transform", "aws-kms", "azure-kms", "gcp-kms", "in-memory-kms")


def build(kind: str, settings: KmsSettings) -> KmsClient:
    """A new client of ``kind`` (one of :data:`KINDS`) with ``settings`` of the matching type."""
    if kind == "vault-kms" and isinstance(settings, VaultSettings):
        return VaultTransitKms(settings)
    if kind == "vault-transform" and isinstance(settings, VaultSettings):
        return VaultTransform(settings)
    if kind == "aws-kms" and isinstance(settings, AwsSettings):
        return AwsKms(settings)
    if kind == "azure-kms" and isinstance(settings, AzureSettings):
        return AzureKeyVaultKms(settings)
    if kind == "gcp-kms" and isinstance(settings, GcpSettings):
        return GcpKms(settings)
    if kind == "in-memory-kms":
        return InMemoryKms()
    raise ValueError(f"no {kind} KMS with {type(settings).__name__}")


class KmsPool:
    """One client per distinct (kind, settings); ``aclose`` closes them all."""

    def __init__(self) -> None:
        self._clients: dict[tuple[str, KmsSettings], KmsClient] = {}

    def get(self, kind: str, settings: KmsSettings) -> KmsClient:
        key = (kind, settings)
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = build(kind, settings)
        return client

    def __len__(self) -> int:
        return len(self._clients)

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()
