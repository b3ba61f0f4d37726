"""The gateway's server side of Kafka's SASL exchange, seen as a client sees it: response frames."""

from __future__ import annotations

import base64
import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from kanal.identity.scram_credentials import derive
from kanal.protocol.api import ApiKey, require_request_class
from kanal.protocol.entities import build
from kanal.protocol.messages import decode_response, encode_request
from kanal.protocol.sasl import PlainMechanism, ScramMechanism
from kanal.protocol.sasl_mechanisms import (
    INVALID_TOKEN,
    Challenge,
    Failure,
    Identity,
    OAuthBearerServer,
    PlainServer,
    ScramCredential,
    ScramServer,
    Success,
)
from kanal.protocol.sasl_server import Action, Authenticator, State

GENERIC = "Authentication failed during authentication due to invalid credentials with SASL mechanism {}"
NOW = 1_700_000_000.0
USERS = {"alice": "alice-secret", "bob": "bob-secret"}
FAKE_SALT_KEY = b"k" * 32


def plain_validator(username: str, password: str) -> Identity | None:
    return Identity(username, vcluster="tenant") if USERS.get(username) == password else None


def scram_store(mechanism: str) -> dict[str, ScramCredential]:
    return {user: derive(password, mechanism) for user, password in USERS.items()}


STORES = {m: scram_store(m) for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")}
TOKENS = {"good-token": Identity("carol", groups=("readers",), expires_at_ms=int(NOW * 1000) + 60_000)}


def scram_server(mechanism: str) -> ScramServer:
    return ScramServer(mechanism, STORES[mechanism].get, fake_salt_key=FAKE_SALT_KEY)


def authenticator(max_reauth_ms: int = 0, clock: list[float] | None = None) -> Authenticator:
    now = clock if clock is not None else [NOW]
    return Authenticator(
        {
            "PLAIN": lambda: PlainServer(plain_validator),
            "SCRAM-SHA-256": lambda: ScramServer(
                "SCRAM-SHA-256", STORES["SCRAM-SHA-256"].get, fake_salt_key=FAKE_SALT_KEY
            ),
            "SCRAM-SHA-512": lambda: ScramServer(
                "SCRAM-SHA-512", STORES["SCRAM-SHA-512"].get, fake_salt_key=FAKE_SALT_KEY
            ),
            "OAUTHBEARER": lambda: OAuthBearerServer(TOKENS.get),
        },
        max_reauth_ms=max_reauth_ms,
        clock=lambda: now[0],
    )


def request(api_key: int, version: int, correlation_id: int = 7, **fields: Any) -> bytes:
    return bytes(encode_request(require_request_class(api_key, version)(**fields), correlation_id, "test-client"))


METADATA = bytes(encode_request(build(require_request_class(ApiKey.METADATA, 12)), 9, "test-client"))


def handshake(auth: Authenticator, mechanism: str, version: int = 1) -> tuple[Action, Any]:
    step = auth.feed(request(ApiKey.SASL_HANDSHAKE, version, mechanism=mechanism))
    assert step.response is not None
    return step.action, decode_response(ApiKey.SASL_HANDSHAKE, version, bytes(step.response))


def authenticate(auth: Authenticator, data: bytes, version: int = 2) -> tuple[Action, Any, bool]:
    step = auth.feed(request(ApiKey.SASL_AUTHENTICATE, version, correlation_id=8, auth_bytes=data))
    assert step.response is not None
    return step.action, decode_response(ApiKey.SASL_AUTHENTICATE, version, bytes(step.response)), step.authenticated


def plain_login(auth: Authenticator, user: str, password: str, version: int = 2) -> tuple[Action, Any, bool]:
    action, response = handshake(auth, "PLAIN")
    assert (action, response.error_code) == (Action.SEND, ErrorCode.none)
    return authenticate(auth, PlainMechanism(user, password).start(), version)


def scram_login(auth: Authenticator, mechanism: str, user: str, password: str) -> tuple[Action, Any, ScramMechanism]:
    client = ScramMechanism(mechanism, user, password)
    handshake(auth, mechanism)
    action, first, _ = authenticate(auth, client.start())
    assert (action, first.error_code) == (Action.SEND, ErrorCode.none)
    final = client.step(first.auth_bytes)
    assert final is not None
    action, response, _ = authenticate(auth, final)
    return action, response, client


def test_plain_login_gives_the_principal_and_lets_traffic_through() -> None:
    auth = authenticator()
    assert auth.feed(request(ApiKey.API_VERSIONS, 3, client_software_name="t", client_software_version="1")).action is (
        Action.API_VERSIONS
    )
    action, response = handshake(auth, "PLAIN")
    assert response.mechanisms == ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
    action, response, done = authenticate(auth, PlainMechanism("alice", "alice-secret").start())
    assert (action, response.error_code, response.error_message, done) == (Action.SEND, ErrorCode.none, None, True)
    assert response.session_lifetime == datetime.timedelta(0)
    assert auth.identity == Identity("alice", vcluster="tenant") and auth.state is State.AUTHENTICATED
    assert auth.feed(METADATA).action is Action.FORWARD


def test_wrong_password_and_unknown_user_get_the_same_answer_and_close() -> None:
    answers = []
    for user, password in (("alice", "wrong"), ("mallory", "whatever")):
        auth = authenticator()
        action, response, done = plain_login(auth, user, password)
        answers.append((action, response.error_code, response.error_message, done))
        assert auth.feed(METADATA).action is Action.CLOSE
    assert (
        answers[0] == answers[1] == (Action.CLOSE, ErrorCode.sasl_authentication_failed, GENERIC.format("PLAIN"), False)
    )


def test_an_unsupported_mechanism_is_answered_with_the_list_and_closed() -> None:
    auth = authenticator()
    action, response = handshake(auth, "GSSAPI")
    assert action is Action.CLOSE and response.error_code == ErrorCode.unsupported_sasl_mechanism
    assert response.mechanisms == ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


@pytest.mark.parametrize("api_key", [ApiKey.METADATA, ApiKey.SASL_AUTHENTICATE])
def test_a_request_before_the_handshake_closes_without_an_answer(api_key: int) -> None:
    frame = METADATA if api_key == ApiKey.METADATA else request(api_key, 2, auth_bytes=b"\x00alice\x00alice-secret")
    step = authenticator().feed(frame)
    assert (step.action, step.response) == (Action.CLOSE, None)


def test_a_request_during_the_exchange_closes() -> None:
    auth = authenticator()
    handshake(auth, "PLAIN")
    step = auth.feed(METADATA)
    assert step.action is Action.CLOSE and auth.identity is None


@pytest.mark.parametrize("version", [0, 1, 2])
def test_sasl_authenticate_versions(version: int) -> None:
    auth = authenticator(max_reauth_ms=5000)
    action, response, done = plain_login(auth, "bob", "bob-secret", version)
    assert (action, response.error_code, done) == (Action.SEND, ErrorCode.none, True)
    if version >= 1:
        assert response.session_lifetime == datetime.timedelta(milliseconds=5000)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_login_with_the_gateways_client(mechanism: str) -> None:
    auth = authenticator()
    action, response, client = scram_login(auth, mechanism, "alice", "alice-secret")
    assert (action, response.error_code) == (Action.SEND, ErrorCode.none)
    assert client.step(response.auth_bytes) is None  # the client checked the server's signature
    assert auth.identity == Identity("alice") and auth.mechanism == mechanism


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_wrong_password_and_unknown_user_look_alike(mechanism: str) -> None:
    seen = []
    for user, password in (("alice", "wrong"), ("mallory", "x"), ("mallory", "y")):
        auth = authenticator()
        client = ScramMechanism(mechanism, user, password, nonce="fixednonce")
        handshake(auth, mechanism)
        _, first, _ = authenticate(auth, client.start())
        fields = dict(part.split("=", 1) for part in first.auth_bytes.decode().split(","))
        action, response, done = authenticate(auth, client.step(first.auth_bytes) or b"")
        seen.append((user, fields["s"], fields["i"], action, response.error_code, response.error_message))
        assert not done
    (_, _, i1, *answer1), (_, salt2, i2, *answer2), (_, salt3, _, *answer3) = seen
    assert (
        answer1 == answer2 == answer3 == [Action.CLOSE, ErrorCode.sasl_authentication_failed, GENERIC.format(mechanism)]
    )
    assert i1 == i2 == "4096"
    assert salt2 == salt3  # the fake salt of an unknown user does not change between attempts
    assert len(base64.b64decode(salt2)) == 16


def test_scram_sha256_server_matches_rfc7677_vector() -> None:
    credential = derive("pencil", "SCRAM-SHA-256", salt=base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="))
    server = ScramServer(
        "SCRAM-SHA-256",
        {"user": credential}.get,
        fake_salt_key=FAKE_SALT_KEY,
        nonce_factory=lambda: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
    )
    first = server.start(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first == Challenge(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    final = server.step(
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert final == Success(Identity("user"), b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")


SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
NONCE = b"rOprNGfwEbeRWgbNEkqO" + SERVER_NONCE.encode()
PROOF = b"dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="


@pytest.mark.parametrize(
    ("client_final", "why"),
    [
        (b"c=biws,r=rOprNGfwEbeRWgbNEkqOTAMPERED,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=", "nonce"),
        (
            b"c=eSws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
            "binding",
        ),
        (
            b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=AAAAZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
            "proof",
        ),
    ],
)
def test_scram_refuses_a_tampered_client_final(client_final: bytes, why: str) -> None:
    credential = derive("pencil", "SCRAM-SHA-256", salt=base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="))
    server = ScramServer(
        "SCRAM-SHA-256",
        {"user": credential}.get,
        fake_salt_key=FAKE_SALT_KEY,
        nonce_factory=lambda: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
    )
    server.start(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    outcome = server.step(client_final)
    assert isinstance(outcome, Failure) and outcome.message is None, why


def test_scram_authzid_must_be_the_user() -> None:
    server = ScramServer("SCRAM-SHA-512", STORES["SCRAM-SHA-512"].get, fake_salt_key=FAKE_SALT_KEY)
    outcome = server.start(b"n,a=bob,n=alice,r=abc")
    assert isinstance(outcome, Failure) and outcome.message is not None and "authorization id" in outcome.message
    ok = ScramServer("SCRAM-SHA-512", STORES["SCRAM-SHA-512"].get, fake_salt_key=FAKE_SALT_KEY)
    assert isinstance(ok.start(b"n,a=alice,n=alice,r=abc"), Challenge)


def bearer(token: str, authzid: str = "", extra: str = "") -> bytes:
    return f"n,{'a=' + authzid if authzid else ''},\x01auth=Bearer {token}\x01{extra}\x01".encode()


def test_oauthbearer_login_gives_a_session_bounded_by_the_token() -> None:
    auth = authenticator(max_reauth_ms=3_600_000)
    handshake(auth, "OAUTHBEARER")
    frame = request(ApiKey.SASL_AUTHENTICATE, 2, correlation_id=8, auth_bytes=bearer("good-token", extra="ext=1\x01"))
    assert auth.bearer_token(frame) == "good-token"
    step = auth.feed(frame)
    response = decode_response(ApiKey.SASL_AUTHENTICATE, 2, bytes(step.response or b""))
    assert (step.action, response.error_code, step.authenticated) == (Action.SEND, ErrorCode.none, True)
    assert response.session_lifetime == datetime.timedelta(milliseconds=60_000)
    assert auth.identity == TOKENS["good-token"]


def test_oauthbearer_refused_token_is_answered_as_kafka_does() -> None:
    auth = authenticator()
    handshake(auth, "OAUTHBEARER")
    action, challenge, _ = authenticate(auth, bearer("forged-token"))
    assert (action, challenge.error_code, challenge.auth_bytes) == (
        Action.SEND,
        ErrorCode.none,
        b'{"status":"invalid_token"}',
    )
    action, response, done = authenticate(auth, b"\x01")
    assert (action, response.error_code, response.error_message, done) == (
        Action.CLOSE,
        ErrorCode.sasl_authentication_failed,
        INVALID_TOKEN,
        False,
    )


def test_oauthbearer_garbage_and_authzid_mismatch_fail() -> None:
    for message in (
        b"n,,\x01auth=Basic abc\x01\x01",
        b"y,,\x01auth=Bearer good-token\x01\x01",
        bearer("good-token", "dave"),
    ):
        auth = authenticator()
        handshake(auth, "OAUTHBEARER")
        action, response, _ = authenticate(auth, message)
        assert (action, response.error_code) == (Action.CLOSE, ErrorCode.sasl_authentication_failed)


def test_session_lifetime_is_zero_without_limits_and_the_minimum_otherwise() -> None:
    auth = authenticator()
    handshake(auth, "OAUTHBEARER")
    assert authenticate(auth, bearer("good-token"))[1].session_lifetime == datetime.timedelta(milliseconds=60_000)
    auth = authenticator(max_reauth_ms=1000)
    handshake(auth, "OAUTHBEARER")
    assert authenticate(auth, bearer("good-token"))[1].session_lifetime == datetime.timedelta(milliseconds=1000)


def test_reauthentication_keeps_the_principal_and_renews_the_session() -> None:
    clock = [NOW]
    auth = authenticator(max_reauth_ms=1000, clock=clock)
    plain_login(auth, "alice", "alice-secret")
    clock[0] += 0.9
    action, response = handshake(auth, "PLAIN")
    assert (action, response.error_code, auth.state) == (Action.SEND, ErrorCode.none, State.REAUTHENTICATING)
    action, response, done = authenticate(auth, PlainMechanism("alice", "alice-secret").start())
    assert (action, response.error_code, done) == (Action.SEND, ErrorCode.none, True)
    clock[0] += 0.9  # past the first session's end, within the second
    assert auth.feed(METADATA).action is Action.FORWARD


def test_reauthentication_as_someone_else_fails_and_closes() -> None:
    auth = authenticator(max_reauth_ms=1000)
    plain_login(auth, "alice", "alice-secret")
    handshake(auth, "PLAIN")
    action, response, done = authenticate(auth, PlainMechanism("bob", "bob-secret").start())
    assert (action, response.error_code, done) == (Action.CLOSE, ErrorCode.sasl_authentication_failed, False)
    assert "bob" not in (response.error_message or "")


def test_reauthentication_with_another_mechanism_is_refused() -> None:
    auth = authenticator(max_reauth_ms=1000)
    plain_login(auth, "alice", "alice-secret")
    action, response = handshake(auth, "SCRAM-SHA-512")
    assert (action, response.error_code, response.mechanisms) == (
        Action.CLOSE,
        ErrorCode.unsupported_sasl_mechanism,
        ("PLAIN",),
    )


def test_a_request_after_the_session_ended_closes_but_reauthentication_may_start() -> None:
    clock = [NOW]
    auth = authenticator(max_reauth_ms=1000, clock=clock)
    plain_login(auth, "alice", "alice-secret")
    clock[0] += 1.0
    assert auth.session_expired()
    assert handshake(auth, "PLAIN")[0] is Action.SEND
    other = authenticator(max_reauth_ms=1000, clock=clock)
    plain_login(other, "alice", "alice-secret")
    clock[0] += 1.0
    assert other.feed(METADATA).action is Action.CLOSE


def test_sasl_authenticate_after_success_without_handshake_is_an_illegal_state() -> None:
    auth = authenticator()
    plain_login(auth, "alice", "alice-secret")
    action, response, done = authenticate(auth, b"\x00alice\x00alice-secret")
    assert (action, response.error_code, done) == (Action.SEND, ErrorCode.illegal_sasl_state, False)
    assert auth.identity == Identity("alice", vcluster="tenant")


def test_handshake_v0_exchanges_raw_tokens() -> None:
    auth = authenticator()
    action, response = handshake(auth, "PLAIN", version=0)
    assert (action, response.error_code) == (Action.SEND, ErrorCode.none) and auth.expects_raw_token
    step = auth.feed(b"\x00alice\x00alice-secret")
    assert (step.action, step.response, step.authenticated) == (Action.SEND, b"", True)
    assert auth.feed(METADATA).action is Action.FORWARD


def test_handshake_v0_scram_and_a_raw_failure_closes_silently() -> None:
    auth = authenticator()
    handshake(auth, "SCRAM-SHA-512", version=0)
    client = ScramMechanism("SCRAM-SHA-512", "alice", "alice-secret")
    first = auth.feed(client.start())
    final = auth.feed(client.step(bytes(first.response or b"")) or b"")
    assert final.authenticated and client.step(bytes(final.response or b"")) is None
    bad = authenticator()
    handshake(bad, "PLAIN", version=0)
    step = bad.feed(b"\x00alice\x00wrong")
    assert (step.action, step.response) == (Action.CLOSE, None)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_frames_never_raise(frame: bytes) -> None:
    auth = authenticator()
    step = auth.feed(frame)
    assert step.action in (Action.SEND, Action.CLOSE, Action.API_VERSIONS)
    assert not step.authenticated


MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(MECHANISMS), st.lists(st.binary(max_size=300), min_size=1, max_size=4), st.sampled_from([0, 1]))
def test_garbage_sasl_messages_fail_cleanly(mechanism: str, messages: list[bytes], handshake_version: int) -> None:
    auth = authenticator()
    handshake(auth, mechanism, handshake_version)
    for message in messages:
        if handshake_version == 0:
            step = auth.feed(message)
        else:
            step = auth.feed(request(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=message))
            if step.response is not None:
                response = decode_response(ApiKey.SASL_AUTHENTICATE, 2, bytes(step.response))
                assert response.error_code in (ErrorCode.none, ErrorCode.sasl_authentication_failed)
        assert not step.authenticated
        if step.action is Action.CLOSE:
            break


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=120), st.text(max_size=120))
def test_scram_text_garbage_fails_cleanly(first: str, final: str) -> None:
    server = ScramServer("SCRAM-SHA-512", STORES["SCRAM-SHA-512"].get, fake_salt_key=FAKE_SALT_KEY)
    outcome = server.start(("n,,n=alice,r=" + first).encode())
    if isinstance(outcome, Challenge):
        nonce = outcome.data.decode().split(",")[0][2:]
        assert not isinstance(server.step(f"c=biws,r={nonce},p={final}".encode()), Success)


def test_a_refused_login_keeps_the_user_name_the_client_claimed_for_the_record() -> None:
    auth = authenticator()
    assert auth.claimed_user is None
    action, response, _ = plain_login(auth, "alice", "not-her-password")
    assert (action, response.error_code) == (Action.CLOSE, ErrorCode.sasl_authentication_failed)
    assert auth.claimed_user == "alice"
    auth = authenticator()
    action, response, _ = scram_login(auth, "SCRAM-SHA-512", "nobody", "x")
    assert action is Action.CLOSE and auth.claimed_user == "nobody"
