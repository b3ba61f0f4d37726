"""OAuth 2 bearer tokens (OAUTHBEARER): a JWT checked against the identity provider's JWKS.

No network here: the I/O layer fetches the JWKS document, builds a :class:`JwksValidator` from it
and swaps in a new one (:meth:`JwksValidator.with_jwks`) when it refreshes. A token signed by a
key the document lacks is refused with :attr:`OAuthProblem.UNKNOWN_KID`, for which
:attr:`OAuthRefusal.needs_refresh` is true: the provider may have rotated its keys, so the caller
fetches the document again (rate-limited) and retries once. :func:`token_key_id` gives a token's
key id before validation, to refresh first.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jwt

# Asymmetric algorithms only: a JWKS holds public keys, and accepting HS* would let a public key
# serve as an HMAC secret (algorithm confusion).
DEFAULT_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
DEFAULT_LEEWAY_SECONDS = 30.0  # Kafka's default clock skew for OAUTHBEARER (sasl.oauthbearer.clock.skew.seconds)


class OAuthProblem(enum.Enum):
    """Why a token is refused (for logs and audit; the client is told only ``invalid_token``)."""

    MALFORMED = "malformed"
    UNSUPPORTED_ALGORITHM = "unsupported algorithm"
    UNKNOWN_KID = "unknown key id"
    BAD_SIGNATURE = "bad signature"
    EXPIRED = "expired"
    NOT_YET_VALID = "not yet valid"
    BAD_ISSUER = "unexpected issuer"
    BAD_AUDIENCE = "unexpected audience"
    MISSING_SUBJECT = "no subject claim"


@dataclass(frozen=True, slots=True)
class OAuthRefusal:
    problem: OAuthProblem
    kid: str | None = None

    @property
    def needs_refresh(self) -> bool:
        """True when fetching the JWKS again might make the token valid (an unknown key id)."""
        return self.problem is OAuthProblem.UNKNOWN_KID


@dataclass(frozen=True, slots=True)
class OAuthIdentity:
    """A valid token's subject, groups (from the configured claim) and expiry (epoch seconds)."""

    subject: str
    expires_at: float
    groups: tuple[str, ...] = ()
    claims: Mapping[str, Any] = field(default_factory=dict)


def token_key_id(token: str) -> str | None:
    """The ``kid`` of a token's header, unverified (None when absent or unreadable)."""
    try:
        kid = jwt.get_unverified_header(token).get("kid")
    except jwt.InvalidTokenError:
        return None
    return kid if isinstance(kid, str) else None


def _signing_keys(jwks: Mapping[str, Any]) -> dict[str | None, dict[str, Any]]:
    keys = jwks.get("keys") if isinstance(jwks, Mapping) else None
    if not isinstance(keys, list):
        raise ValueError("a JWKS document is an object with a 'keys' list")
    usable: dict[str | None, dict[str, Any]] = {}
    for key in keys:
        if not isinstance(key, dict) or key.get("kty") not in ("RSA", "EC") or key.get("use", "sig") != "sig":
            continue
        kid = key.get("kid")
        usable[kid if isinstance(kid, str) else None] = key
    return usable


class JwksValidator:
    """Checks JWTs against one JWKS document: signature, ``exp`` (required) and ``nbf`` with
    ``leeway_seconds``, the issuer and audiences when given, and the subject claim."""

    def __init__(
        self,
        jwks: Mapping[str, Any],
        *,
        issuer: str | None = None,
        audiences: Sequence[str] = (),
        subject_claim: str = "sub",
        groups_claim: str | None = None,
        leeway_seconds: float = DEFAULT_LEEWAY_SECONDS,
        algorithms: Iterable[str] = DEFAULT_ALGORITHMS,
    ) -> None:
        if leeway_seconds < 0:
            raise ValueError("leeway_seconds must not be negative")
        self._keys = _signing_keys(jwks)
        self._settings: dict[str, Any] = {
            "issuer": issuer,
            "audiences": tuple(audiences),
            "subject_claim": subject_claim,
            "groups_claim": groups_claim,
            "leeway_seconds": leeway_seconds,
            "algorithms": tuple(algorithms),
        }
        self._issuer = issuer
        self._audiences = tuple(audiences)
        self._subject_claim = subject_claim
        self._groups_claim = groups_claim
        self._leeway = leeway_seconds
        self._algorithms = frozenset(algorithms)
        self._cache: dict[tuple[str | None, str], jwt.PyJWK | None] = {}

    def with_jwks(self, jwks: Mapping[str, Any]) -> JwksValidator:
        """A validator with the same settings and a refreshed key set."""
        return JwksValidator(jwks, **self._settings)

    @property
    def key_ids(self) -> frozenset[str]:
        return frozenset(k for k in self._keys if k is not None)

    def knows(self, kid: str | None) -> bool:
        """Whether a token with this key id can be checked without a refresh."""
        return kid in self._keys or (kid is None and len(self._keys) == 1)

    def _key(self, kid: str | None, algorithm: str) -> jwt.PyJWK | None:
        if (kid, algorithm) in self._cache:
            return self._cache[(kid, algorithm)]
        data = self._keys[kid] if kid in self._keys else next(iter(self._keys.values()))
        key: jwt.PyJWK | None
        if data.get("alg", algorithm) != algorithm:
            key = None
        else:
            try:
                key = jwt.PyJWK.from_dict(data, algorithm)
            except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError):
                key = None
        self._cache[(kid, algorithm)] = key
        return key

    def validate(self, token: str, now: float | None = None) -> OAuthIdentity | OAuthRefusal:
        """The identity a valid token gives, or why it is refused."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            return OAuthRefusal(OAuthProblem.MALFORMED)
        algorithm, kid = header.get("alg"), header.get("kid")
        kid = kid if isinstance(kid, str) else None
        if not isinstance(algorithm, str) or algorithm not in self._algorithms:
            return OAuthRefusal(OAuthProblem.UNSUPPORTED_ALGORITHM, kid)
        if not self.knows(kid):
            return OAuthRefusal(OAuthProblem.UNKNOWN_KID, kid)
        key = self._key(kid, algorithm)
        if key is None:  # the key is not one for this algorithm
            return OAuthRefusal(OAuthProblem.BAD_SIGNATURE, kid)
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience=self._audiences or None,
                issuer=self._issuer,
                options={
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                    "verify_aud": bool(self._audiences),
                    "require": ["exp"],
                },
            )
        except jwt.InvalidSignatureError:
            return OAuthRefusal(OAuthProblem.BAD_SIGNATURE, kid)
        except jwt.InvalidIssuerError:
            return OAuthRefusal(OAuthProblem.BAD_ISSUER, kid)
        except jwt.InvalidAudienceError:
            return OAuthRefusal(OAuthProblem.BAD_AUDIENCE, kid)
        except jwt.MissingRequiredClaimError as exc:
            problem = {"aud": OAuthProblem.BAD_AUDIENCE, "iss": OAuthProblem.BAD_ISSUER}.get(exc.claim)
            return OAuthRefusal(problem or OAuthProblem.MALFORMED, kid)
        except (jwt.InvalidTokenError, ValueError, TypeError):
            return OAuthRefusal(OAuthProblem.MALFORMED, kid)
        return self._check_claims(claims, kid, time.time() if now is None else now)

    def _check_claims(self, claims: dict[str, Any], kid: str | None, now: float) -> OAuthIdentity | OAuthRefusal:
        expires, not_before = claims.get("exp"), claims.get("nbf")
        if not isinstance(expires, int | float) or isinstance(expires, bool):
            return OAuthRefusal(OAuthProblem.MALFORMED, kid)
        if not_before is not None and (not isinstance(not_before, int | float) or isinstance(not_before, bool)):
            return OAuthRefusal(OAuthProblem.MALFORMED, kid)
        if now - self._leeway >= expires:
            return OAuthRefusal(OAuthProblem.EXPIRED, kid)
        if not_before is not None and now + self._leeway < not_before:
            return OAuthRefusal(OAuthProblem.NOT_YET_VALID, kid)
        subject = claims.get(self._subject_claim)
        if not isinstance(subject, str) or not subject:
            return OAuthRefusal(OAuthProblem.MISSING_SUBJECT, kid)
        return OAuthIdentity(subject, float(expires), self._groups(claims), claims)

    def _groups(self, claims: Mapping[str, Any]) -> tuple[str, ...]:
        if self._groups_claim is None:
            return ()
        value = claims.get(self._groups_claim)
        if isinstance(value, str):
            return tuple(value.split())
        if isinstance(value, list):
            return tuple(g for g in value if isinstance(g, str))
        return ()
