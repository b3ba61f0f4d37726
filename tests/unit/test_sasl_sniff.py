"""Following a client's SASL exchange with the broker (KAFKA_MANAGED), on bytes.

The broker here is the gateway's own sans-I/O SASL server (:class:`Authenticator`), which answers as
a Kafka broker does (KIP-43, KIP-152, KIP-368, handshake v0 raw tokens): each client frame goes
through the sniffer to it, each of its answers back through the sniffer, as the connection does.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from kanal.identity.scram_credentials import derive
from kanal.protocol.api import ApiKey, require_request_class
from kanal.protocol.entities import build
from kanal.protocol.headers import peek_request
from kanal.protocol.messages import decode_request, decode_response, encode_request, encode_response, response_type
from kanal.protocol.sasl import PlainMechanism, ScramMechanism
from kanal.protocol.sasl_mechanisms import Identity, OAuthBearerServer, PlainServer, ScramServer
from kanal.protocol.sasl_server import Authenticator
from kanal.protocol.sasl_sniff import (
    Reply,
    SaslSniffer,
    UnrelayableExchange,
    bearer_principal,
    mechanism_label,
    plain_principal,
    principal_of,
    scram_principal,
)

NOW = 1_700_000_000.0
PASSWORDS = {"alice": "alice-Secret-1", "bob,=x": "bob-Secret-2"}
SCRAM = "SCRAM-SHA-512"
STORE = {user: derive(password, SCRAM) for user, password in PASSWORDS.items()}


def _jwt(claims: dict[str, Any]) -> str:
    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2lnbmF0dXJl"


GOOD_TOKEN = _jwt({"sub": "carol", "uid": "u-17"})


def _bearer(token: str, authzid: str = "") -> bytes:
    return f"n,{'a=' + authzid if authzid else ''},\x01auth=Bearer {token}\x01\x01".encode()


def _plain_check(user: str, password: str) -> Identity | None:
    return Identity(user) if PASSWORDS.get(user) == password else None


def broker(max_reauth_ms: int = 0) -> Authenticator:
    """A broker's SASL server: PLAIN and SCRAM-SHA-512 for PASSWORDS, OAUTHBEARER for GOOD_TOKEN."""
    return Authenticator(
        {
            "PLAIN": lambda: PlainServer(_plain_check),
            SCRAM: lambda: ScramServer(SCRAM, STORE.get, fake_salt_key=b"k" * 32),
            "OAUTHBEARER": lambda: OAuthBearerServer(lambda t: Identity("carol") if t == GOOD_TOKEN else None),
        },
        max_reauth_ms=max_reauth_ms,
        clock=lambda: NOW,
    )


class Wire:
    """A client connection through the sniffer to ``broker``, as the gateway relays it."""

    def __init__(self, server: Authenticator, sub_claim: str = "sub") -> None:
        self.sniffer = SaslSniffer(sub_claim, clock=lambda: NOW)
        self.broker = server
        self.logins: list[Any] = []

    def send(self, frame: bytes) -> Reply:
        """One client frame (a Kafka request, or a raw token when one is expected) and its answer."""
        sniffer = self.sniffer
        if sniffer.expects_raw_token:
            frame = bytes(sniffer.wrap(frame, "test-client"))
        api_key, version, _ = peek_request(frame)
        forwarded = sniffer.request(bytearray(frame))
        step = self.broker.feed(bytes(forwarded))
        assert step.response is not None, step
        reply = sniffer.response(api_key, version, bytearray(step.response))
        if reply.login is not None:
            self.logins.append(reply.login)
        return reply

    def handshake(self, mechanism: str, version: int = 1) -> Any:
        reply = self.send(_request(ApiKey.SASL_HANDSHAKE, version, mechanism=mechanism))
        return decode_response(ApiKey.SASL_HANDSHAKE, version, reply.frame)

    def authenticate(self, data: bytes, version: int = 2) -> tuple[Any, Reply]:
        reply = self.send(_request(ApiKey.SASL_AUTHENTICATE, version, auth_bytes=data))
        return decode_response(ApiKey.SASL_AUTHENTICATE, version, reply.frame), reply

    def scram(self, user: str, password: str) -> Any:
        client = ScramMechanism(SCRAM, user, password)
        assert self.handshake(SCRAM).error_code == ErrorCode.none
        first, reply = self.authenticate(client.start())
        assert first.error_code == ErrorCode.none and reply.login is None  # not over yet
        final = client.step(bytes(first.auth_bytes))
        assert final is not None
        response, _ = self.authenticate(final)
        return response


def _request(api_key: int, version: int, **fields: Any) -> bytes:
    return bytes(encode_request(build(require_request_class(api_key, version), **fields), 5, "test-client"))


def _strings(obj: object, seen: set[int] | None = None) -> Iterator[str | bytes]:
    """Every str and bytes reachable from ``obj`` (attributes, slots, containers)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, str | bytes | bytearray):
        yield obj if isinstance(obj, str) else bytes(obj)
        return
    if isinstance(obj, dict):
        children: list[object] = [*obj.keys(), *obj.values()]
    elif isinstance(obj, list | tuple | set | frozenset | deque):
        children = list(obj)
    elif dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__") or hasattr(type(obj), "__slots__"):
        names = list(getattr(obj, "__dict__", {}))
        for cls in type(obj).__mro__:
            names += list(getattr(cls, "__slots__", ()))
        children = [getattr(obj, name) for name in names if hasattr(obj, name)]
    else:
        return
    for child in children:
        yield from _strings(child, seen)


def _keeps(sniffer: SaslSniffer, secret: str) -> bool:
    return any(secret in s if isinstance(s, str) else secret.encode() in s for s in _strings(sniffer))


# --- user names -----------------------------------------------------------------------------------


def test_plain_names_the_authzid_when_given_else_the_authcid() -> None:
    assert plain_principal(b"\x00alice\x00pw") == "alice"
    assert plain_principal(b"admin\x00alice\x00pw") == "admin"
    assert plain_principal(b"alice\x00pw") is None
    assert plain_principal(b"\x00\x00pw") is None
    assert plain_principal(b"\x00\xff\x00pw") is None


def test_scram_names_the_unescaped_user_of_the_client_first_message() -> None:
    assert scram_principal(b"n,,n=alice,r=abc") == "alice"
    assert scram_principal(b"n,,n=b=2Cc=3Dd,r=abc") == "b,c=d"
    assert scram_principal(b"y,a=alice,n=alice,r=abc") == "alice"
    assert scram_principal(b"n,,n=bad=escape,r=abc") is None
    assert scram_principal(b"p=tls-unique,,n=alice,r=abc") is None
    assert scram_principal(b"n,,r=abc,n=alice") is None
    assert scram_principal(b"n,,n=,r=abc") is None


def test_oauthbearer_names_the_tokens_claim_without_checking_it() -> None:
    assert bearer_principal(_bearer(GOOD_TOKEN)) == "carol"
    assert bearer_principal(_bearer(GOOD_TOKEN), "uid") == "u-17"
    assert bearer_principal(_bearer(GOOD_TOKEN), "missing") is None
    assert bearer_principal(_bearer(_jwt({"sub": 7}))) is None
    assert bearer_principal(_bearer("not-a-jwt")) is None
    assert bearer_principal(_bearer("a.!!!.c")) is None
    assert bearer_principal(b"auth=Bearer x") is None


@given(st.text(min_size=1).filter(lambda s: "\x00" not in s), st.text(min_size=1).filter(lambda s: "\x00" not in s))
def test_plain_and_scram_names_survive_any_user_name(user: str, password: str) -> None:
    assert plain_principal(PlainMechanism(user, password).start()) == user
    assert scram_principal(ScramMechanism(SCRAM, user, password).start()) == user


@given(st.sampled_from(["PLAIN", SCRAM, "SCRAM-SHA-256", "OAUTHBEARER", "GSSAPI"]), st.binary())
def test_any_first_message_gives_a_name_or_none(mechanism: str, message: bytes) -> None:
    assert principal_of(mechanism, message) is None or isinstance(principal_of(mechanism, message), str)


def test_metric_labels_are_kafkas_mechanism_names_or_other() -> None:
    assert [mechanism_label(m) for m in ("PLAIN", SCRAM, "GSSAPI", "X-CUSTOM-42", None)] == [
        "PLAIN",
        SCRAM,
        "GSSAPI",
        "other",
        "other",
    ]


# --- exchanges ------------------------------------------------------------------------------------


def test_a_plain_login_the_broker_accepts_gives_the_user_and_the_session_end() -> None:
    wire = Wire(broker(max_reauth_ms=60_000))
    assert wire.handshake("PLAIN").error_code == ErrorCode.none
    response, reply = wire.authenticate(PlainMechanism("alice", PASSWORDS["alice"]).start())
    assert response.error_code == ErrorCode.none and not reply.raw and not reply.close
    assert reply.login is not None
    assert reply.login.identity == Identity("alice", expires_at_ms=int(NOW * 1000) + 60_000)
    assert (reply.login.mechanism, reply.login.failure) == ("PLAIN", None)
    assert wire.sniffer.authenticated and not wire.sniffer.failed
    assert not _keeps(wire.sniffer, PASSWORDS["alice"])


def test_a_session_that_does_not_end_has_no_expiry() -> None:
    wire = Wire(broker())
    wire.handshake("PLAIN")
    _, reply = wire.authenticate(PlainMechanism("alice", PASSWORDS["alice"]).start())
    assert reply.login is not None and reply.login.identity == Identity("alice")


@pytest.mark.parametrize("version", [0, 1, 2])
def test_scram_is_over_at_the_server_final_message_at_any_saslauthenticate_version(version: int) -> None:
    wire = Wire(broker())
    client = ScramMechanism(SCRAM, "bob,=x", PASSWORDS["bob,=x"])
    wire.handshake(SCRAM)
    first, reply = wire.authenticate(client.start(), version)
    assert reply.login is None and first.auth_bytes.startswith(b"r=")
    assert _keeps(wire.sniffer, "bob,=x") and not _keeps(wire.sniffer, PASSWORDS["bob,=x"])  # the name only
    final = client.step(bytes(first.auth_bytes))
    assert final is not None
    response, reply = wire.authenticate(final, version)
    assert response.error_code == ErrorCode.none
    assert client.step(bytes(response.auth_bytes)) is None  # the broker's signature verifies: untouched
    assert reply.login is not None and reply.login.identity == Identity("bob,=x")
    assert not _keeps(wire.sniffer, PASSWORDS["bob,=x"]) and not _keeps(wire.sniffer, final.decode())


def test_a_wrong_password_is_the_brokers_refusal_with_its_message() -> None:
    wire = Wire(broker())
    response = wire.scram("alice", "wrong-password")
    assert response.error_code == ErrorCode.sasl_authentication_failed
    [login] = wire.logins
    assert login.identity is None and login.user == "alice" and login.mechanism == SCRAM
    assert login.failure == response.error_message and "invalid credentials" in login.failure
    assert wire.sniffer.failed and not wire.sniffer.authenticated
    assert not _keeps(wire.sniffer, "wrong-password")


def test_an_unknown_user_is_refused_like_a_wrong_password() -> None:
    wire = Wire(broker())
    assert wire.scram("mallory", "guess").error_code == ErrorCode.sasl_authentication_failed
    assert [(login.user, login.identity) for login in wire.logins] == [("mallory", None)]


def test_a_scram_error_in_the_server_final_message_becomes_an_authentication_failure() -> None:
    """Some brokers refuse with ``e=...`` in the server-final message and no error code: the client
    gets SASL_AUTHENTICATION_FAILED, which every client library reports as such."""
    sniffer = SaslSniffer(clock=lambda: NOW)
    handshake = bytearray(_request(ApiKey.SASL_HANDSHAKE, 1, mechanism=SCRAM))
    sniffer.request(handshake)
    accepted = build(response_type(ApiKey.SASL_HANDSHAKE, 1), error_code=ErrorCode.none, mechanisms=(SCRAM,))
    sniffer.response(ApiKey.SASL_HANDSHAKE, 1, encode_response(accepted, 5))
    for message, answer in ((b"n,,n=alice,r=abc", b"r=abcdef,s=c2FsdA==,i=4096"), (b"c=biws,r=abcdef,p=cA==", b"")):
        sniffer.request(bytearray(_request(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=message)))
        body = build(
            response_type(ApiKey.SASL_AUTHENTICATE, 2),
            error_code=ErrorCode.none,
            auth_bytes=answer or b"e=unknown-user",
            session_lifetime=datetime.timedelta(seconds=60),
        )
        reply = sniffer.response(ApiKey.SASL_AUTHENTICATE, 2, encode_response(body, 5))
    assert reply.login is not None and reply.login.failure == "e=unknown-user" and reply.login.identity is None
    response = decode_response(ApiKey.SASL_AUTHENTICATE, 2, reply.frame)
    assert response.error_code == ErrorCode.sasl_authentication_failed
    assert response.error_message == "Authentication failed: e=unknown-user"
    assert sniffer.failed


def test_an_unsupported_mechanism_is_a_failed_login_labelled_other() -> None:
    wire = Wire(broker())
    response = wire.handshake("X-CUSTOM")
    assert response.error_code == ErrorCode.unsupported_sasl_mechanism
    [login] = wire.logins
    assert login.mechanism == "other" and login.failure is not None and "unsupported_sasl_mechanism" in login.failure
    assert wire.sniffer.failed


def test_oauthbearer_names_the_tokens_subject_once_the_broker_accepts_it() -> None:
    wire = Wire(broker())
    wire.handshake("OAUTHBEARER")
    response, reply = wire.authenticate(_bearer(GOOD_TOKEN))
    assert response.error_code == ErrorCode.none
    assert reply.login is not None and reply.login.identity == Identity("carol")
    assert not _keeps(wire.sniffer, GOOD_TOKEN)


def test_a_refused_oauthbearer_token_goes_through_the_error_challenge_then_fails() -> None:
    wire = Wire(broker())
    wire.handshake("OAUTHBEARER")
    bad = _jwt({"sub": "carol", "forged": True})
    challenge, reply = wire.authenticate(_bearer(bad))
    assert challenge.error_code == ErrorCode.none and challenge.auth_bytes and reply.login is None
    response, reply = wire.authenticate(b"\x01")
    assert response.error_code == ErrorCode.sasl_authentication_failed
    assert reply.login is not None and reply.login.user == "carol" and reply.login.identity is None
    assert not _keeps(wire.sniffer, bad)


def test_a_re_authentication_gives_the_connection_the_new_exchanges_identity() -> None:
    wire = Wire(broker(max_reauth_ms=1000))
    wire.handshake("PLAIN")
    wire.authenticate(PlainMechanism("alice", PASSWORDS["alice"]).start())
    wire.handshake("PLAIN")
    wire.authenticate(PlainMechanism("alice", PASSWORDS["alice"]).start())
    assert [login.identity.principal for login in wire.logins] == ["alice", "alice"]
    assert wire.sniffer.authenticated and not wire.sniffer.failed


def test_a_re_authentication_the_broker_refuses_fails_the_connection() -> None:
    wire = Wire(broker(max_reauth_ms=1000))
    wire.handshake("PLAIN")
    wire.authenticate(PlainMechanism("alice", PASSWORDS["alice"]).start())
    wire.handshake("PLAIN")
    response, reply = wire.authenticate(PlainMechanism("bob,=x", PASSWORDS["bob,=x"]).start())
    assert response.error_code == ErrorCode.sasl_authentication_failed  # KIP-368: same principal only
    assert reply.login is not None and reply.login.failure == "Cannot change principals during re-authentication"
    assert wire.sniffer.failed


def test_a_broker_that_lets_another_principal_re_authenticate_is_followed() -> None:
    """Kafka refuses a change of principal on re-authentication; a broker that allows it is
    followed: the connection is whoever the last accepted exchange named."""
    sniffer = SaslSniffer(clock=lambda: NOW)
    users = []
    for user in ("alice", "bob"):
        sniffer.request(bytearray(_request(ApiKey.SASL_HANDSHAKE, 1, mechanism="PLAIN")))
        ok = build(response_type(ApiKey.SASL_HANDSHAKE, 1), error_code=ErrorCode.none, mechanisms=("PLAIN",))
        sniffer.response(ApiKey.SASL_HANDSHAKE, 1, encode_response(ok, 5))
        sniffer.request(bytearray(_request(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=f"\0{user}\0pw".encode())))
        body = build(response_type(ApiKey.SASL_AUTHENTICATE, 2), error_code=ErrorCode.none)
        login = sniffer.response(ApiKey.SASL_AUTHENTICATE, 2, encode_response(body, 5)).login
        assert login is not None and login.identity is not None
        users.append(login.identity.principal)
    assert users == ["alice", "bob"]


def test_a_mechanism_whose_name_cannot_be_read_is_relayed_and_only_its_failure_is_known() -> None:
    sniffer = SaslSniffer(clock=lambda: NOW)
    sniffer.request(bytearray(_request(ApiKey.SASL_HANDSHAKE, 1, mechanism="GSSAPI")))
    ok = build(response_type(ApiKey.SASL_HANDSHAKE, 1), error_code=ErrorCode.none, mechanisms=("GSSAPI",))
    sniffer.response(ApiKey.SASL_HANDSHAKE, 1, encode_response(ok, 5))
    for code in (ErrorCode.none, ErrorCode.sasl_authentication_failed):
        sniffer.request(bytearray(_request(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=b"kerberos")))
        body = build(response_type(ApiKey.SASL_AUTHENTICATE, 2), error_code=code, error_message="nope")
        reply = sniffer.response(ApiKey.SASL_AUTHENTICATE, 2, encode_response(body, 5))
    assert reply.login is not None and (reply.login.mechanism, reply.login.failure) == ("GSSAPI", "nope")


# --- handshake v0: raw tokens ---------------------------------------------------------------------


def test_a_handshake_v0_goes_on_as_v1_and_raw_tokens_are_carried_wrapped() -> None:
    wire = Wire(broker(max_reauth_ms=5000))
    frame = bytearray(_request(ApiKey.SASL_HANDSHAKE, 0, mechanism=SCRAM))
    sniffer = SaslSniffer(clock=lambda: NOW)
    forwarded = sniffer.request(frame)
    header, body = decode_request(bytes(forwarded))
    assert (header.api_version, body.mechanism) == (1, SCRAM)  # the broker will expect SaslAuthenticate

    assert wire.handshake(SCRAM, version=0).error_code == ErrorCode.none
    assert wire.sniffer.expects_raw_token
    client = ScramMechanism(SCRAM, "alice", PASSWORDS["alice"])
    first = wire.send(client.start())
    assert first.raw and first.frame.startswith(b"r=") and first.login is None  # the raw server-first
    final = client.step(bytes(first.frame))
    assert final is not None
    last = wire.send(final)
    assert last.raw and last.frame.startswith(b"v=")
    assert client.step(bytes(last.frame)) is None
    # (SaslAuthenticate v0 carries no session lifetime: the broker ends the session, unannounced)
    assert last.login is not None and last.login.identity == Identity("alice")
    assert not wire.sniffer.expects_raw_token  # Kafka requests from here on


def test_a_raw_token_the_broker_refuses_closes_the_connection() -> None:
    wire = Wire(broker())
    wire.handshake("PLAIN", version=0)
    reply = wire.send(PlainMechanism("alice", "wrong").start())
    assert reply.close and reply.login is not None and reply.login.failure is not None
    assert not wire.sniffer.expects_raw_token and wire.sniffer.failed


def test_a_refused_handshake_v0_is_answered_before_the_connection_closes() -> None:
    wire = Wire(broker())
    reply = wire.send(_request(ApiKey.SASL_HANDSHAKE, 0, mechanism="SCRAM-SHA-256"))  # not offered
    assert not reply.close and decode_response(ApiKey.SASL_HANDSHAKE, 0, reply.frame).error_code != ErrorCode.none
    assert not wire.sniffer.expects_raw_token and wire.sniffer.failed


def test_raw_tokens_of_a_mechanism_whose_last_message_is_unknown_are_refused() -> None:
    with pytest.raises(UnrelayableExchange, match="GSSAPI"):
        SaslSniffer().request(bytearray(_request(ApiKey.SASL_HANDSHAKE, 0, mechanism="GSSAPI")))


def test_a_malformed_sasl_request_cannot_be_relayed() -> None:
    with pytest.raises(UnrelayableExchange, match="malformed"):
        SaslSniffer().request(bytearray(_request(ApiKey.SASL_HANDSHAKE, 1, mechanism="PLAIN")[:-3]))


# --- robustness -----------------------------------------------------------------------------------


@given(st.sampled_from(["PLAIN", SCRAM, "OAUTHBEARER", "GSSAPI"]), st.binary(), st.binary())
def test_whatever_the_client_and_the_broker_send_the_sniffer_answers(
    mechanism: str, message: bytes, answer: bytes
) -> None:
    sniffer = SaslSniffer(clock=lambda: NOW)
    sniffer.request(bytearray(_request(ApiKey.SASL_HANDSHAKE, 1, mechanism=mechanism)))
    ok = build(response_type(ApiKey.SASL_HANDSHAKE, 1), error_code=ErrorCode.none, mechanisms=(mechanism,))
    sniffer.response(ApiKey.SASL_HANDSHAKE, 1, encode_response(ok, 5))
    sniffer.request(bytearray(_request(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=message)))
    reply = sniffer.response(ApiKey.SASL_AUTHENTICATE, 2, bytearray(answer))
    assert isinstance(reply, Reply)  # (and nothing raised)


def test_an_answer_the_sniffer_did_not_expect_goes_through_untouched() -> None:
    sniffer = SaslSniffer(clock=lambda: NOW)
    body = build(response_type(ApiKey.SASL_AUTHENTICATE, 2), error_code=ErrorCode.illegal_sasl_state)
    frame = encode_response(body, 5)
    reply = sniffer.response(ApiKey.SASL_AUTHENTICATE, 2, frame)
    assert reply.frame is frame and reply.login is None and not sniffer.failed
