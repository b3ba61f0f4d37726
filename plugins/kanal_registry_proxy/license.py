"""Licenses: Ed25519-signed tokens with a licensee, a plan and an optional expiry.

A token is ``kanal1.<payload>.<signature>``: ``payload`` is the base64url (unpadded) JSON object
``{"licensee": str, "plan": "gateway"|"scale", "issuedAt": unix seconds, "expiresAt": unix seconds or
null}``, ``signature`` the base64url Ed25519 signature of the ASCII text ``kanal1.<payload>``.

``kanal license keygen`` writes a key pair, ``kanal license issue`` signs a token with the private key,
and the proxy verifies ``VENDOR_LICENSE`` against ``VENDOR_LICENSE_PUBLIC_KEY`` once, at startup: a
missing, invalid or expired license refuses the start; a running proxy keeps serving after expiry.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import time
from dataclasses import dataclass

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PREFIX = "kanal1"
PLANS = ("gateway", "scale")


class LicenseError(ValueError):
    """The license is missing, malformed, wrongly signed, for another product, or expired."""


@dataclass(frozen=True)
class License:
    licensee: str
    plan: str
    issued_at: int
    expires_at: int | None

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (time.time() if now is None else now) >= self.expires_at

    def describe(self) -> str:
        until = (
            "no expiry"
            if self.expires_at is None
            else "expires " + datetime.datetime.fromtimestamp(self.expires_at, datetime.UTC).isoformat()
        )
        return f"{self.plan} license for {self.licensee!r} ({until})"


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def generate_keypair() -> tuple[bytes, bytes]:
    """(private key PEM, public key PEM) of a new Ed25519 key pair."""
    private = Ed25519PrivateKey.generate()
    private_pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private_pem, public_pem


def issue(private_pem: bytes, licensee: str, expires_at: int | None = None, plan: str = "gateway") -> str:
    """A signed license token."""
    if plan not in PLANS:
        raise LicenseError(f"plan must be one of {', '.join(PLANS)}, got {plan!r}")
    key = serialization.load_pem_private_key(private_pem, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise LicenseError("the private key is not an Ed25519 key")
    payload = {"licensee": licensee, "plan": plan, "issuedAt": int(time.time()), "expiresAt": expires_at}
    signed = f"{PREFIX}.{_b64encode(orjson.dumps(payload))}"
    return f"{signed}.{_b64encode(key.sign(signed.encode('ascii')))}"


def verify(token: str, public_pem: bytes) -> License:
    """The license a token carries, if its signature is valid (expiry is not checked here)."""
    try:
        key = serialization.load_pem_public_key(public_pem)
    except ValueError as exc:
        raise LicenseError(f"the license public key is not a PEM public key: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise LicenseError("the license public key is not an Ed25519 key")
    parts = token.strip().split(".")
    if len(parts) != 3 or parts[0] != PREFIX:
        raise LicenseError(f"not a license token (expected {PREFIX}.<payload>.<signature>)")
    try:
        signature = _b64decode(parts[2])
        key.verify(signature, f"{parts[0]}.{parts[1]}".encode("ascii"))
    except (InvalidSignature, binascii.Error, ValueError, UnicodeEncodeError):
        raise LicenseError("the license signature is invalid") from None
    try:
        payload = orjson.loads(_b64decode(parts[1]))
    except (orjson.JSONDecodeError, binascii.Error, ValueError):
        raise LicenseError("the license payload is not valid") from None
    if not isinstance(payload, dict):
        raise LicenseError("the license payload is not valid")
    licensee, plan = payload.get("licensee"), payload.get("plan")
    issued, expires = payload.get("issuedAt"), payload.get("expiresAt")
    if not isinstance(licensee, str) or not isinstance(plan, str) or not isinstance(issued, int):
        raise LicenseError("the license payload lacks licensee, plan or issuedAt")
    if expires is not None and not isinstance(expires, int):
        raise LicenseError("the license expiresAt is not a timestamp")
    if plan not in PLANS:
        raise LicenseError(f"a {plan!r} license does not cover the schema registry proxy (needs gateway or scale)")
    return License(licensee, plan, issued, expires)


def check_license(token: str, public_pem: bytes, now: float | None = None) -> License:
    """The startup check: a valid, unexpired license, or LicenseError."""
    found = verify(token, public_pem)
    if found.expired(now):
        raise LicenseError(f"the license expired: {found.describe()}")
    return found


def parse_expiry(text: str) -> int:
    """Unix seconds from ``YYYY-MM-DD`` (end of that day, UTC) or an ISO 8601 date-time."""
    try:
        if len(text) == 10:
            day = datetime.date.fromisoformat(text)
            moment = datetime.datetime.combine(day, datetime.time(23, 59, 59), datetime.UTC)
        else:
            moment = datetime.datetime.fromisoformat(text)
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=datetime.UTC)
    except ValueError:
        raise LicenseError(f"expected YYYY-MM-DD or an ISO 8601 date-time, got {text!r}") from None
    return int(moment.timestamp())
