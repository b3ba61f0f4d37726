"""The identity provider's keys for OAUTHBEARER: fetched at startup, on schedule, and at once (rate-limited)
for a token naming a key the gateway lacks; and OAUTHBEARER logins through the gateway's own exchange.

Time is trio's mock clock where the schedule matters, so no test waits for real.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
import trio
import trio.testing
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from kio.schema.errors import ErrorCode

from kanal.config.settings import build_settings
from kanal.identity.accounts import ServiceAccounts
from kanal.identity.oauth import JwksValidator, OAuthIdentity, OAuthProblem, OAuthRefusal
from kanal.identity.scram_credentials import ScramCredentials
from kanal.net.authentication import Authentication
from kanal.net.jwks import MAX_DOCUMENT_BYTES, JwksError, JwksKeys, displayed, fetch_document
from kanal.protocol.api import ApiKey, require_request_class
from kanal.protocol.messages import decode_response, encode_request
from kanal.protocol.sasl_mechanisms import Identity
from kanal.protocol.sasl_server import Action, Authenticator

KEY_1 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
KEY_2 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
ISSUER = "https://idp.test"


def jwk(key: rsa.RSAPrivateKey, kid: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
    return data | {"kid": kid, "use": "sig", "alg": "RS256"}


def jwks(*keys: tuple[rsa.RSAPrivateKey, str]) -> bytes:
    return json.dumps({"keys": [jwk(key, kid) for key, kid in keys]}).encode()


def token(key: rsa.RSAPrivateKey = KEY_1, kid: str = "k1", **claims: Any) -> str:
    now = int(time.time())
    payload = {"sub": "svc-orders", "iss": ISSUER, "aud": "kanal", "exp": now + 300, "groups": ["readers"]} | claims
    return jwt.encode({k: v for k, v in payload.items() if v is not None}, key, algorithm="RS256", headers={"kid": kid})


TEMPLATE = JwksValidator({"keys": []}, issuer=ISSUER, audiences=["kanal"], groups_claim="groups")


class Provider:
    """A fake fetch: serves ``document`` (or raises ``failure``) and records when it was asked."""

    def __init__(self, document: bytes = b"", failure: Exception | None = None) -> None:
        self.document = document
        self.failure = failure
        self.asked: list[float] = []
        self.release: trio.Event | None = None  # when set, fetches wait for it

    async def __call__(self, url: str) -> bytes:
        self.asked.append(trio.current_time())
        if self.release is not None:
            await self.release.wait()
        if self.failure is not None:
            raise self.failure
        return self.document


def run(main: Any) -> None:
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


# -- JwksKeys ---------------------------------------------------------------------------------------


def test_no_token_is_valid_before_the_first_fetch_and_a_login_fetches_the_keys() -> None:
    provider = Provider(jwks((KEY_1, "k1")))
    keys = JwksKeys("https://idp.test/jwks", TEMPLATE, 3600, fetch=provider)

    async def main() -> None:
        good = token()
        refused = keys.validate(good)
        assert isinstance(refused, OAuthRefusal) and refused.problem is OAuthProblem.UNKNOWN_KID
        await keys.ensure(good)
        assert len(provider.asked) == 1 and keys.loaded
        valid = keys.validate(good)
        assert isinstance(valid, OAuthIdentity) and (valid.subject, valid.groups) == ("svc-orders", ("readers",))
        await keys.ensure(good)  # a known key: no fetch
        assert len(provider.asked) == 1

    run(main)


def test_a_rotated_key_is_fetched_at_once_and_unknown_key_ids_fetch_at_most_every_ten_seconds() -> None:
    provider = Provider(jwks((KEY_1, "k1")))
    keys = JwksKeys("https://idp.test/jwks", TEMPLATE, 3600, fetch=provider)

    async def main() -> None:
        await keys.refresh()  # the startup fetch does not count against the on-demand budget
        provider.document = jwks((KEY_2, "k2"))  # the provider rotates its key
        rotated = token(KEY_2, "k2")
        await keys.ensure(rotated)
        assert isinstance(keys.validate(rotated), OAuthIdentity)
        old = keys.validate(token(KEY_1, "k1"))
        assert isinstance(old, OAuthRefusal) and old.problem is OAuthProblem.UNKNOWN_KID  # the old key is gone
        assert len(provider.asked) == 2

        for kid in ("made-up-1", "made-up-2", "made-up-3"):  # within ten seconds: no more fetches
            await keys.ensure(token(KEY_2, kid))
            await trio.sleep(3)
        assert len(provider.asked) == 2
        await trio.sleep(1)  # ten seconds since the last on-demand fetch
        await keys.ensure(token(KEY_2, "made-up-4"))
        assert len(provider.asked) == 3

    run(main)


def test_a_token_without_a_key_id_fetches_nothing() -> None:
    provider = Provider(jwks((KEY_1, "k1"), (KEY_2, "k2")))
    keys = JwksKeys("https://idp.test/jwks", TEMPLATE, 3600, fetch=provider)

    async def main() -> None:
        await keys.ensure(jwt.encode({"sub": "x", "exp": 2**40}, KEY_1, algorithm="RS256"))
        await keys.ensure("not even a token")
        assert provider.asked == []

    run(main)


def test_logins_arriving_during_a_fetch_wait_for_it_instead_of_fetching_again() -> None:
    provider = Provider(jwks((KEY_1, "k1")))
    release = provider.release = trio.Event()
    keys = JwksKeys("https://idp.test/jwks", TEMPLATE, 3600, fetch=provider)
    results: list[object] = []

    async def login() -> None:
        tok = token()
        await keys.ensure(tok)
        results.append(keys.validate(tok))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(login)
            await trio.testing.wait_all_tasks_blocked()
            assert len(provider.asked) == 1 and not results
            release.set()
        assert len(results) == 5 and all(isinstance(r, OAuthIdentity) for r in results)

    run(main)


def test_a_failed_fetch_keeps_the_keys_and_is_logged_without_credentials_in_the_url(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kanal")
    provider = Provider(jwks((KEY_1, "k1")))
    keys = JwksKeys("https://user:hunter2@idp.test/jwks?key=s3cr3t", TEMPLATE, 3600, fetch=provider)

    async def main() -> None:
        assert await keys.refresh()
        provider.failure = OSError("connection refused")
        assert not await keys.refresh()
        assert isinstance(keys.validate(token()), OAuthIdentity)  # the keys fetched before still serve

    run(main)
    assert "cannot fetch the JWKS from https://idp.test/jwks (GATEWAY_OAUTH_JWKS_URL): connection refused" in (
        caplog.text
    )
    assert "keeping the keys fetched before" in caplog.text
    assert "hunter2" not in caplog.text and "s3cr3t" not in caplog.text


def test_a_provider_that_does_not_answer_is_given_up_on_after_the_fetch_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    provider = Provider(jwks((KEY_1, "k1")))
    caplog.set_level(logging.INFO, logger="kanal")
    provider.release = trio.Event()  # never set: the provider hangs
    keys = JwksKeys("https://idp.test/jwks", TEMPLATE, 3600, fetch=provider)

    async def main() -> None:
        assert not await keys.refresh()
        assert trio.current_time() == 10.0

    run(main)
    assert "no answer within 10 s" in caplog.text


@pytest.mark.parametrize(
    ("document", "why"),
    [(b"not json", "the document is not JSON"), (b'{"no": "keys"}', "'keys' list"), (b"[]", "'keys' list")],
)
def test_a_document_that_is_not_a_jwks_is_refused(document: bytes, why: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kanal")
    keys = JwksKeys("file:///jwks.json", TEMPLATE, 3600, fetch=Provider(document))

    async def main() -> None:
        assert not await keys.refresh()

    run(main)
    assert not keys.loaded and "OAUTHBEARER logins are refused until it is fetched" in caplog.text
    assert why in caplog.text


def test_the_service_fetches_at_start_retries_sooner_after_failures_then_follows_the_refresh_interval() -> None:
    provider = Provider(jwks((KEY_1, "k1")), failure=OSError("down"))
    keys = JwksKeys("https://idp.test/jwks", TEMPLATE, 60, fetch=provider)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(keys.run)
            while len(provider.asked) < 2:
                await trio.sleep(0.5)
            provider.failure = None  # the provider is back
            while len(provider.asked) < 5:
                await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
        start = provider.asked[0]
        assert [t - start for t in provider.asked] == [0, 1, 3, 63, 123]  # retries after 1 s, 2 s; then every 60 s

    run(main)
    assert keys.loaded


# -- fetching ---------------------------------------------------------------------------------------


@pytest.fixture
def http_jwks() -> Iterator[tuple[str, dict[str, Any]]]:
    """A local HTTP server answering ``state["status"]`` with ``state["body"]``."""
    state: dict[str, Any] = {"status": 200, "body": jwks((KEY_1, "k1"))}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(state["status"])
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(state["body"])))
            self.end_headers()
            self.wfile.write(state["body"])

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json", state
    finally:
        server.shutdown()
        thread.join()


def test_a_jwks_is_fetched_over_http_and_a_bad_answer_is_an_error(http_jwks: tuple[str, dict[str, Any]]) -> None:
    url, state = http_jwks

    async def main() -> None:
        assert json.loads(await fetch_document(url))["keys"][0]["kid"] == "k1"
        state["status"] = 404
        with pytest.raises(JwksError, match="HTTP 404"):
            await fetch_document(url)
        state["status"], state["body"] = 200, b" " * (MAX_DOCUMENT_BYTES + 1)
        with pytest.raises(JwksError, match="larger than"):
            await fetch_document(url)

    trio.run(main)


def test_fetching_over_http_logs_no_query_or_credentials(
    http_jwks: tuple[str, dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    url, _ = http_jwks
    caplog.set_level(logging.DEBUG)
    keys = JwksKeys(url.replace("http://", "http://user:hunter2@") + "?key=s3cr3t", TEMPLATE, 3600)

    async def main() -> None:
        assert await keys.refresh()

    trio.run(main)
    assert "signing keys (k1)" in caplog.text
    assert "s3cr3t" not in caplog.text and "hunter2" not in caplog.text


def test_a_jwks_is_read_from_a_file_url_and_other_schemes_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"
    path.write_bytes(jwks((KEY_1, "k1")))

    async def main() -> None:
        assert json.loads(await fetch_document(path.as_uri()))["keys"][0]["kid"] == "k1"
        with pytest.raises(OSError):
            await fetch_document((tmp_path / "missing.json").as_uri())
        with pytest.raises(JwksError, match="unsupported URL scheme 'ftp'"):
            await fetch_document("ftp://idp.test/jwks.json")

    trio.run(main)


def test_urls_are_logged_without_credentials() -> None:
    assert displayed("https://u:p@idp.test:8443/keys?token=x#y") == "https://idp.test:8443/keys"


# -- OAUTHBEARER logins through the gateway's exchange ---------------------------------------------


def request(api_key: int, version: int, correlation_id: int, **fields: Any) -> bytes:
    return bytes(encode_request(require_request_class(api_key, version)(**fields), correlation_id, "test-client"))


def bearer_message(tok: str) -> bytes:
    return f"n,,\x01auth=Bearer {tok}\x01\x01".encode()


async def oauth_login(auth: Authenticator, tok: str) -> tuple[Identity | None, int]:
    """Logs in with ``tok`` as librdkafka does: (identity or None, session lifetime in ms)."""
    assert auth.feed(request(ApiKey.SASL_HANDSHAKE, 1, 1, mechanism="OAUTHBEARER")).action is Action.SEND
    frame = request(ApiKey.SASL_AUTHENTICATE, 2, 2, auth_bytes=bearer_message(tok))
    assert auth.prepare_bearer is not None and auth.bearer_token(frame) == tok
    await auth.prepare_bearer(tok)
    step = auth.feed(frame)
    answer = decode_response(ApiKey.SASL_AUTHENTICATE, 2, bytes(step.response or b""))
    if step.authenticated:
        return auth.identity, answer.session_lifetime // datetime.timedelta(milliseconds=1)
    assert answer.auth_bytes == b'{"status":"invalid_token"}'  # Kafka's error challenge; the client acks it
    step = auth.feed(request(ApiKey.SASL_AUTHENTICATE, 2, 3, auth_bytes=b"\x01"))
    final = decode_response(ApiKey.SASL_AUTHENTICATE, 2, bytes(step.response or b""))
    assert (step.action, final.error_code) == (Action.CLOSE, ErrorCode.sasl_authentication_failed)
    return None, 0


@pytest.fixture
def jwks_file(tmp_path: Path) -> Path:
    path = tmp_path / "jwks.json"
    path.write_bytes(jwks((KEY_1, "k1")))
    return path


def authentication(jwks_file: Path, **env: str) -> Authentication:
    settings = build_settings(
        {
            "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9",
            "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(bytes(32)).decode(),
            "GATEWAY_OAUTH_JWKS_URL": jwks_file.as_uri(),
            "GATEWAY_OAUTH_EXPECTED_ISSUER": ISSUER,
            "GATEWAY_OAUTH_EXPECTED_AUDIENCES": "kanal,other",
            **env,
        }
    )
    return Authentication(settings, ServiceAccounts(), ScramCredentials())


def test_oauthbearer_is_offered_only_with_a_jwks_url(jwks_file: Path) -> None:
    assert authentication(jwks_file).mechanisms == ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
    without = Authentication(
        build_settings(
            {
                "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9",
                "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(bytes(32)).decode(),
            }
        ),
        ServiceAccounts(),
        ScramCredentials(),
    )
    assert without.mechanisms == ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and not without.services


def test_a_valid_token_logs_in_as_its_subject_with_its_groups_until_it_expires(jwks_file: Path) -> None:
    login = authentication(jwks_file, GATEWAY_OAUTH_SUB_CLAIM_NAME="client_id")

    async def main() -> None:
        expires = int(time.time()) + 120
        identity, lifetime = await oauth_login(login("10.0.0.1"), token(client_id="orders", exp=expires))
        assert identity == Identity("orders", groups=("readers",), expires_at_ms=expires * 1000)
        assert 0 < lifetime <= 120_000  # KIP-368: the session ends with the token

    trio.run(main)


@pytest.mark.parametrize(
    "claims",
    [
        {"exp": -120},  # seconds from now: the times are taken when the test runs, not when collected
        {"nbf": 600},
        {"iss": "https://evil.test"},
        {"aud": "someone-else"},
        {"sub": None},
    ],
    ids=["expired", "not-yet-valid", "wrong-issuer", "wrong-audience", "no-subject"],
)
def test_a_token_that_does_not_check_out_is_refused(jwks_file: Path, claims: dict[str, Any]) -> None:
    login = authentication(jwks_file)
    now = int(time.time())
    claims = {k: now + v if k in ("exp", "nbf") else v for k, v in claims.items()}

    async def main() -> None:
        assert (await oauth_login(login("10.0.0.1"), token(**claims)))[0] is None

    trio.run(main)


def test_a_token_signed_by_another_key_is_refused_even_with_a_known_key_id(jwks_file: Path) -> None:
    login = authentication(jwks_file)

    async def main() -> None:
        assert (await oauth_login(login("10.0.0.1"), token(KEY_2, "k1")))[0] is None
        assert (await oauth_login(login("10.0.0.1"), token(KEY_1, "k1")))[0] is not None

    trio.run(main)


def test_a_key_rotation_is_picked_up_by_the_next_login(jwks_file: Path) -> None:
    login = authentication(jwks_file)

    async def main() -> None:
        assert login.jwks is not None
        await login.jwks.refresh()  # the startup fetch
        assert (await oauth_login(login("10.0.0.1"), token(KEY_1, "k1")))[0] is not None
        jwks_file.write_bytes(jwks((KEY_2, "k2")))
        identity, _ = await oauth_login(login("10.0.0.1"), token(KEY_2, "k2"))
        assert identity is not None and identity.principal == "svc-orders"
        assert (await oauth_login(login("10.0.0.1"), token(KEY_1, "k1")))[0] is None  # the old key is gone

    trio.run(main)


def test_refused_tokens_count_against_the_host(jwks_file: Path) -> None:
    login = authentication(jwks_file, GATEWAY_AUTHENTICATION_MAX_FAILURES_PER_MINUTE="2")

    async def main() -> None:
        for _ in range(2):
            assert (await oauth_login(login("10.0.0.9"), token(exp=1)))[0] is None
        auth = login("10.0.0.9")  # blocked now, even with a good token
        auth.feed(request(ApiKey.SASL_HANDSHAKE, 1, 1, mechanism="OAUTHBEARER"))
        step = auth.feed(request(ApiKey.SASL_AUTHENTICATE, 2, 2, auth_bytes=bearer_message(token())))
        assert step.action is Action.CLOSE and step.failure is not None and "too many failed logins" in step.failure
        assert (await oauth_login(login("10.0.0.10"), token()))[0] is not None  # another host is not

    trio.run(main)
