"""OAuth JWTs checked against a JWKS document, with keys made by the test."""

from __future__ import annotations

import json
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from kanal.identity.oauth import JwksValidator, OAuthIdentity, OAuthProblem, OAuthRefusal, token_key_id

NOW = 1_700_000_000
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
OTHER_RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwk(key: Any, kid: str, **extra: str) -> dict[str, Any]:
    algorithm = RSAAlgorithm if isinstance(key, rsa.RSAPrivateKey) else ECAlgorithm
    data: dict[str, Any] = json.loads(algorithm.to_jwk(key.public_key()))
    return data | {"kid": kid, "use": "sig"} | extra


JWKS = {"keys": [jwk(RSA_KEY, "rsa-1"), jwk(EC_KEY, "ec-1"), {"kty": "oct", "kid": "ignored", "k": "c2VjcmV0"}]}
CLAIMS = {"sub": "svc-orders", "iss": "https://idp.test", "aud": "kanal", "exp": NOW + 300, "groups": ["a", "b"]}


def token(key: Any = RSA_KEY, kid: str | None = "rsa-1", algorithm: str = "RS256", **claims: Any) -> str:
    headers = {"kid": kid} if kid is not None else {}
    payload = {k: v for k, v in (CLAIMS | claims).items() if v is not None}
    return jwt.encode(payload, key, algorithm=algorithm, headers=headers)


def validator(**settings: Any) -> JwksValidator:
    return JwksValidator(JWKS, **({"issuer": "https://idp.test", "audiences": ["kanal"]} | settings))


@pytest.mark.parametrize(
    ("key", "kid", "algorithm"), [(RSA_KEY, "rsa-1", "RS256"), (EC_KEY, "ec-1", "ES256"), (RSA_KEY, "rsa-1", "PS256")]
)
def test_a_valid_token_gives_its_subject_and_expiry(key: Any, kid: str, algorithm: str) -> None:
    result = validator().validate(token(key, kid, algorithm), now=NOW)
    assert isinstance(result, OAuthIdentity)
    assert (result.subject, result.expires_at, result.groups) == ("svc-orders", NOW + 300, ())


def test_subject_and_groups_claims_are_configurable() -> None:
    result = validator(subject_claim="client_id", groups_claim="groups").validate(token(client_id="orders"), now=NOW)
    assert isinstance(result, OAuthIdentity) and (result.subject, result.groups) == ("orders", ("a", "b"))
    scoped = validator(groups_claim="scope").validate(token(scope="read write"), now=NOW)
    assert isinstance(scoped, OAuthIdentity) and scoped.groups == ("read", "write")


@pytest.mark.parametrize(
    ("tok", "now", "problem"),
    [
        (token(), NOW + 330, OAuthProblem.EXPIRED),  # 300 s of life + 30 s of leeway
        (token(nbf=NOW + 100), NOW, OAuthProblem.NOT_YET_VALID),
        (token(OTHER_RSA_KEY), NOW, OAuthProblem.BAD_SIGNATURE),
        (token(iss="https://evil.test"), NOW, OAuthProblem.BAD_ISSUER),
        (token(aud="someone-else"), NOW, OAuthProblem.BAD_AUDIENCE),
        (token(aud=None), NOW, OAuthProblem.BAD_AUDIENCE),
        (token(exp=None), NOW, OAuthProblem.MALFORMED),
        (token(sub=None), NOW, OAuthProblem.MISSING_SUBJECT),
        (token(kid="rsa-2"), NOW, OAuthProblem.UNKNOWN_KID),
        (token(kid="ignored"), NOW, OAuthProblem.UNKNOWN_KID),  # a symmetric key in a JWKS is never used
        (token(EC_KEY, "rsa-1", "ES256"), NOW, OAuthProblem.BAD_SIGNATURE),  # key of the wrong type
        (
            jwt.encode(CLAIMS, "k" * 32, algorithm="HS256", headers={"kid": "rsa-1"}),
            NOW,
            OAuthProblem.UNSUPPORTED_ALGORITHM,
        ),
        (jwt.encode(CLAIMS, "", algorithm="none", headers={"kid": "rsa-1"}), NOW, OAuthProblem.UNSUPPORTED_ALGORITHM),
        ("garbage", NOW, OAuthProblem.MALFORMED),
    ],
)
def test_refusals(tok: str, now: int, problem: OAuthProblem) -> None:
    result = validator().validate(tok, now=now)
    assert isinstance(result, OAuthRefusal) and result.problem is problem
    assert result.needs_refresh is (problem is OAuthProblem.UNKNOWN_KID)


def test_leeway_accepts_small_clock_skew() -> None:
    assert isinstance(validator().validate(token(), now=NOW + 329), OAuthIdentity)
    assert isinstance(validator().validate(token(nbf=NOW + 20), now=NOW), OAuthIdentity)
    assert isinstance(validator(leeway_seconds=0).validate(token(), now=NOW + 300), OAuthRefusal)


def test_no_issuer_or_audience_expected() -> None:
    assert isinstance(JwksValidator(JWKS).validate(token(iss=None, aud=None), now=NOW), OAuthIdentity)


def test_unknown_kid_then_refresh() -> None:
    rotated = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    tok = token(rotated, "rsa-2")
    current = validator()
    assert token_key_id(tok) == "rsa-2" and not current.knows("rsa-2")
    refused = current.validate(tok, now=NOW)
    assert isinstance(refused, OAuthRefusal) and refused.needs_refresh and refused.kid == "rsa-2"
    refreshed = current.with_jwks({"keys": [jwk(rotated, "rsa-2")]})
    assert refreshed.key_ids == {"rsa-2"}
    assert isinstance(refreshed.validate(tok, now=NOW), OAuthIdentity)
    assert isinstance(refreshed.validate(token(aud="other"), now=NOW), OAuthRefusal)  # settings kept


def test_a_token_without_kid_uses_the_only_key() -> None:
    single = JwksValidator({"keys": [jwk(EC_KEY, "ec-1")]})
    assert isinstance(single.validate(token(EC_KEY, None, "ES256"), now=NOW), OAuthIdentity)
    result = validator().validate(token(kid=None), now=NOW)
    assert isinstance(result, OAuthRefusal) and result.problem is OAuthProblem.UNKNOWN_KID


def test_a_key_pinned_to_an_algorithm_refuses_another() -> None:
    pinned = JwksValidator({"keys": [jwk(RSA_KEY, "rsa-1", alg="RS256")]})
    result = pinned.validate(token(algorithm="PS256"), now=NOW)
    assert isinstance(result, OAuthRefusal) and result.problem is OAuthProblem.BAD_SIGNATURE


def test_a_jwks_must_be_a_key_list() -> None:
    with pytest.raises(ValueError, match="'keys' list"):
        JwksValidator({"nokeys": []})
