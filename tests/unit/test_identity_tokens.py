"""Gateway tokens: what a client presenting one as its PLAIN password gets."""

from __future__ import annotations

import jwt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kanal.identity.tokens import TokenClaims, TokenProblem, mint, verify
from kanal.protocol.sasl_mechanisms import Identity, PlainServer, Success

SECRET = b"s" * 32
NOW = 1_700_000_000


def test_a_minted_token_verifies_until_it_expires() -> None:
    token = mint("app1", "tenant-a", 3600, SECRET, now=NOW)
    assert verify(token, SECRET, now=NOW + 3599) == TokenClaims("app1", "tenant-a", NOW + 3600)
    assert verify(token, SECRET, now=NOW + 3600) is TokenProblem.EXPIRED


def test_without_a_virtual_cluster() -> None:
    assert verify(mint("app1", None, 60, SECRET, now=NOW), SECRET, now=NOW) == TokenClaims("app1", None, NOW + 60)


def test_a_token_signed_with_another_key_or_algorithm_is_refused() -> None:
    assert verify(mint("app1", None, 60, b"x" * 32, now=NOW), SECRET, now=NOW) is TokenProblem.BAD_SIGNATURE
    unsigned = jwt.encode({"username": "app1", "exp": NOW + 60}, key="", algorithm="none")
    assert verify(unsigned, SECRET, now=NOW) is TokenProblem.BAD_SIGNATURE
    hs512 = jwt.encode({"username": "app1", "exp": NOW + 60}, SECRET + SECRET, algorithm="HS512")
    assert verify(hs512, SECRET, now=NOW) is TokenProblem.BAD_SIGNATURE


@pytest.mark.parametrize(
    "token",
    [
        "not-a-token",
        "",
        jwt.encode({"username": "app1"}, SECRET, algorithm="HS256"),  # no exp
        jwt.encode({"exp": NOW + 60}, SECRET, algorithm="HS256"),  # no username
        jwt.encode({"username": 5, "exp": NOW + 60}, SECRET, algorithm="HS256"),
        jwt.encode({"username": "a", "exp": "soon"}, SECRET, algorithm="HS256"),
    ],
)
def test_malformed_tokens(token: str) -> None:
    assert verify(token, SECRET, now=NOW) is TokenProblem.MALFORMED


@pytest.mark.parametrize("lifetime", [0, -5, 1.5, None])
def test_the_lifetime_is_mandatory_and_positive(lifetime: object) -> None:
    with pytest.raises(ValueError, match="lifetime_seconds"):
        mint("app1", None, lifetime, SECRET)  # type: ignore[arg-type]


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="256 bits"):
        mint("app1", None, 60, b"short")
    with pytest.raises(ValueError, match="256 bits"):
        verify("x", b"short")


def test_plain_with_a_token_gives_the_tokens_identity() -> None:
    def validate(username: str, password: str) -> Identity | None:
        claims = verify(password, SECRET, now=NOW)
        if not isinstance(claims, TokenClaims) or claims.username != username:
            return None
        return Identity(claims.username, vcluster=claims.vcluster, expires_at_ms=claims.expires_at * 1000)

    token = mint("app1", "tenant-a", 60, SECRET, now=NOW)
    assert PlainServer(validate).start(b"\x00app1\x00" + token.encode()) == Success(
        Identity("app1", vcluster="tenant-a", expires_at_ms=(NOW + 60) * 1000)
    )
    assert not isinstance(PlainServer(validate).start(b"\x00app2\x00" + token.encode()), Success)


def _pyjwt_verdict(token: str) -> TokenClaims | TokenProblem:
    """What PyJWT makes of a token, in this module's terms: the oracle of the hand-written check."""
    try:
        claims = jwt.decode(
            token,
            SECRET,
            algorithms=["HS256"],
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
    return TokenProblem.EXPIRED if expires <= NOW else TokenClaims(username, vcluster, expires)


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_the_check_accepts_nothing_pyjwt_refuses(data: st.DataObject) -> None:
    user, vcluster = data.draw(st.sampled_from(["app1", "a"])), data.draw(st.sampled_from([None, "vc"]))
    token = mint(user, vcluster, 60, SECRET, now=NOW)
    assert verify(token, SECRET, now=NOW) == _pyjwt_verdict(token) == TokenClaims(user, vcluster, NOW + 60)
    chars = list(token)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(chars) - 1))
        chars[at] = data.draw(st.sampled_from("._-=+/ aAzZ09é"))
    damaged = "".join(chars)
    ours = verify(damaged, SECRET, now=NOW)
    # Never more lenient than the reference: whatever passes here passes PyJWT with the same claims.
    # (The check may refuse more: it reads base64url strictly, where PyJWT skips stray characters.)
    if isinstance(ours, TokenClaims):
        assert _pyjwt_verdict(damaged) == ours, damaged


@pytest.mark.parametrize("stray", ["+", "/", "="])
def test_a_segment_outside_the_base64url_alphabet_is_malformed(stray: str) -> None:
    token = mint("app1", "vc", 60, SECRET, now=NOW)
    damaged = token[:-2] + stray + token[-1]
    assert verify(damaged, SECRET, now=NOW) is TokenProblem.MALFORMED
    assert _pyjwt_verdict(damaged) is TokenProblem.MALFORMED


def test_only_the_canonical_spelling_of_the_signature_passes() -> None:
    token = mint("app1", "vc", 60, SECRET, now=NOW)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = alphabet.index(token[-1])
    # 32 bytes in 43 characters: the last one's two low bits are spare, so three other spellings decode alike.
    for spare in (1, 2, 3):
        other = token[:-1] + alphabet[last ^ spare]
        assert verify(other, SECRET, now=NOW) is TokenProblem.BAD_SIGNATURE
        assert not isinstance(_pyjwt_verdict(other), TokenClaims)
