"""Gateway tokens: the password of SASL PLAIN in GATEWAY_MANAGED mode.

``POST /gateway/v2/token`` mints them for a service account: an HS256 JWT with claims
``username``, ``vcluster`` (optional), ``iat`` and ``exp``, signed with the gateway's user-pool
secret. Verifying needs no store lookup, which keeps a new connection cheap; the caller still
checks that the service account exists (a deleted account's tokens must stop working).

Tokens are minted with PyJWT, and checked here by hand: one HMAC and two small JSON documents.
Measured, PyJWT's ``decode`` took about 80 us of the gateway's 870 us per new authenticated
connection (bench/auth_connections.py); this check takes under 10 us. It accepts HS256 only and
agrees with PyJWT on every token (tests/unit/test_identity_tokens.py uses it as the oracle).
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import re
import time
from dataclasses import dataclass
from typing import Any

import jwt
import orjson

ALGORITHM = "HS256"
MIN_SECRET_BYTES = 32  # HS256 wants a key as long as its hash (RFC 7518 §3.2)


class TokenProblem(enum.Enum):
    """Why a token is refused (for logs and audit; the client only learns that it was)."""

    EXPIRED = "expired"
    BAD_SIGNATURE = "bad signature"
    MALFORMED = "malformed"


@dataclass(frozen=True, slots=True)
class TokenClaims:
    """What a valid token says: who, in which virtual cluster, valid until when (epoch seconds)."""

    username: str
    vcluster: str | None
    expires_at: int


def _check_secret(secret: bytes) -> None:
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"the token secret must be at least {MIN_SECRET_BYTES} bytes (256 bits), got {len(secret)}")


def mint(username: str, vcluster: str | None, lifetime_seconds: int, secret: bytes, *, now: float | None = None) -> str:
    """A token for ``username`` valid ``lifetime_seconds`` from ``now`` (mandatory and positive)."""
    _check_secret(secret)
    if isinstance(lifetime_seconds, bool) or not isinstance(lifetime_seconds, int) or lifetime_seconds <= 0:
        raise ValueError(f"lifetime_seconds must be a positive integer, got {lifetime_seconds!r}")
    if not username:
        raise ValueError("username is empty")
    issued = int(time.time() if now is None else now)
    claims: dict[str, object] = {"username": username, "iat": issued, "exp": issued + lifetime_seconds}
    if vcluster is not None:
        claims["vcluster"] = vcluster
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


_BASE64URL = re.compile(r"[A-Za-z0-9_-]*")


def _segment(text: str) -> bytes:
    """A base64url segment of a JWT, unpadded as RFC 7515 writes it.

    ``b64decode`` with ``altchars`` would also take ``+``, ``/`` and padding, which the reference
    library refuses, so the alphabet is checked first.
    """
    if not _BASE64URL.fullmatch(text):
        raise binascii.Error("not base64url")
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


def _document(text: str) -> Any:
    return orjson.loads(_segment(text))


def verify(token: str, secret: bytes, now: float | None = None) -> TokenClaims | TokenProblem:
    """The claims of a valid token, or why it is not one. Only HS256 is accepted (no ``none``)."""
    _check_secret(secret)
    signing_input, _, signature = token.rpartition(".")
    header, dot, payload = signing_input.partition(".")
    if not dot or "." in payload:
        return TokenProblem.MALFORMED
    try:
        fields = _document(header)
        if not isinstance(fields, dict):
            return TokenProblem.MALFORMED
        if fields.get("alg") != ALGORITHM:
            return TokenProblem.BAD_SIGNATURE
        _segment(signature)  # (only the alphabet matters: the text is compared, below)
        expected = hmac.new(secret, signing_input.encode("ascii"), hashlib.sha256).digest()
        # As text, so that only the canonical encoding passes (as in PyJWT): the last character of
        # 32 bytes' base64 carries two spare bits, and four spellings would otherwise decode alike.
        if not hmac.compare_digest(base64.urlsafe_b64encode(expected).rstrip(b"=").decode("ascii"), signature):
            return TokenProblem.BAD_SIGNATURE
        claims = _document(payload)
    except (ValueError, binascii.Error, UnicodeEncodeError):  # (orjson's JSONDecodeError is a ValueError)
        return TokenProblem.MALFORMED
    if not isinstance(claims, dict):
        return TokenProblem.MALFORMED
    username, vcluster, expires = claims.get("username"), claims.get("vcluster"), claims.get("exp")
    if not isinstance(username, str) or not username or not (vcluster is None or isinstance(vcluster, str)):
        return TokenProblem.MALFORMED
    if not isinstance(expires, int) or isinstance(expires, bool):
        return TokenProblem.MALFORMED
    if (time.time() if now is None else now) >= expires:
        return TokenProblem.EXPIRED
    return TokenClaims(username, vcluster, expires)
