"""What the encryption plugin asks of a key management service: wrap and unwrap data keys.

Envelope encryption: the gateway makes a data encryption key (DEK) and encrypts records with it; the
KMS wraps the DEK under one of its key encryption keys (KEK), which never leaves it, and the wrapped
DEK (EDEK) travels with the data. Decrypting asks the KMS to unwrap the EDEK. Each KMS (Vault or
OpenBao transit, AWS KMS, Azure Key Vault, GCP KMS, in memory, the gateway's own) implements
:class:`Kms`; ``key_id`` is a key name of that KMS (the bare ``keyId`` of a connection, or the key
part of an inline ``keySecretId``).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Kms", "KmsError", "KmsKeyNotFound"]


class KmsError(Exception):
    """A KMS call failed. ``retriable``: the KMS may answer later (unreachable, throttled, 5xx), so
    a produce failing on it gets a retriable error; otherwise the request itself is wrong (no such
    key, no permission)."""

    def __init__(self, message: str, *, retriable: bool) -> None:
        super().__init__(message)
        self.retriable = retriable


class KmsKeyNotFound(KmsError):
    """The key is not (or no longer) in the KMS: what it wrapped cannot be unwrapped (crypto shredding)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)


@runtime_checkable
class Kms(Protocol):
    """One KMS, as configured (a connection or an inline ``kmsConfig`` block)."""

    #: The scheme of its inline key ids (``vault-kms``, ``aws-kms``, ...), for messages and metrics.
    kind: str

    async def wrap(self, key_id: str, dek: bytes) -> bytes:
        """The EDEK: ``dek`` encrypted under the KEK ``key_id``. Raises KmsError."""
        ...

    async def unwrap(self, key_id: str, edek: bytes) -> bytes:
        """The DEK that ``wrap(key_id, ...)`` wrapped into ``edek``. Raises KmsError
        (KmsKeyNotFound when the KEK is gone)."""
        ...

    async def check(self) -> None:
        """Reaches the KMS and authenticates (at startup, to report a KMS that cannot work).
        Raises KmsError."""
        ...

    async def aclose(self) -> None:
        """Releases its connections."""
        ...
