"""Gateway tokens: the password of SASL PLAIN in GATEWAY_MANAGED mode.

``POST /gateway/v2/token`` mints them for a service account: an HS256 JWT with claims
``username``, ``vcluster`` (optional), ``iat`` and ``exp``, signed with the gateway's user-pool
secret. Verifying needs no store lookup, which keeps a new connection cheap; the caller still
checks that the service account exists (a deleted account's tokens must stop working).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

import jwt

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


def verify(token: str, secret: bytes, now: float | None = None) -> TokenClaims | TokenProblem:
    """The claims of a valid token, or why it is not one. Only HS256 is accepted (no ``none``)."""
    _check_secret(secret)
    try:
        claims = jwt.decode(
            token,
            secret,
            algorithms=[ALGORITHM],
            options={"verify_exp": False, "verify_iat": False, "verify_nbf": False, "require": ["exp", "username"]},
        )
    except (jwt.InvalidSignatureError, jwt.InvalidAlgorithmError):
        return TokenProblem.BAD_SIGNATURE
    except jwt.InvalidTokenError:
        return TokenProblem.MALFORMED
    username, vcluster, expires = claims.get("username"), claims.get("vcluster"), claims.get("exp")
    if not isinstance(username, str) or not username or not (vcluster is None or isinstance(vcluster, str)):
        return TokenProblem.MALFORMED
    if not isinstance(expires, int) or isinstance(expires, bool):
        return TokenProblem.MALFORMED
    if (time.time() if now is None else now) >= expires:
        return TokenProblem.EXPIRED
    return TokenClaims(username, vcluster, expires)
