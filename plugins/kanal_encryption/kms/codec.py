"""Base64 as the KMS APIs write it: standard (Vault, AWS, GCP) and URL-safe without padding (Azure)."""

from __future__ import annotations

import base64
import binascii

from kanal_encryption.kms.base import KmsError

__all__ = ["b64", "b64url", "from_b64", "from_b64url"]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def from_b64(text: str, what: str) -> bytes:
    """Decodes a KMS answer; a malformed one is the KMS's fault, not retriable."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise KmsError(f"{what}: the KMS answered malformed base64", retriable=False) from None


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def from_b64url(text: str, what: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError, TypeError):
        raise KmsError(f"{what}: the KMS answered malformed base64url", retriable=False) from None
