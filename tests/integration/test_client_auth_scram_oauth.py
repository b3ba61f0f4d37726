"""SCRAM-SHA-256/512 and OAUTHBEARER logins to a gateway that authenticates its clients itself
(GATEWAY_SECURITY_PROTOCOL=SASL_PLAINTEXT, GATEWAY_MANAGED), with confluent-kafka, kafka-python and
aiokafka, through a real gateway process in front of a real Tansu broker.

SCRAM credentials are applied as an operator does (``kanal apply`` of GatewayServiceAccount and
GatewayScramCredential manifests); OAUTHBEARER tokens are signed by keys the test makes and checked
against a JWKS the test serves over HTTP (GATEWAY_OAUTH_JWKS_URL). Every refusal must be what a client
library reports as an authentication failure, counted by mechanism, and leave nothing secret in the
gateway's output.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.abc import AbstractTokenProvider as AioTokenProvider
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from kafka import KafkaConsumer, KafkaProducer
from kafka.net.sasl.oauth import AbstractTokenProvider
from prometheus_client.parser import text_string_to_metric_families

from kanal.cli import main as kanal_main
from kanal.embedded import GatewayProcess, TansuBroker
from kanal.embedded.admin_http import AdminHttp

pytestmark = pytest.mark.integration

ADMIN_USERS = "[{username: admin, password: secret, admin: true}]"
PASSWORD = "scram-" + secrets.token_hex(12)  # unique, to look for in the gateway's output
TEMP_PASSWORD = "temp-" + secrets.token_hex(12)
ISSUER = "https://idp.kanal.test"
AUDIENCE = "kanal"
KEY_1 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
KEY_2 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
WAIT = 20.0  # seconds, the bound of any single wait

# The manifests of the operator guide's SCRAM example (with the test's password).
MANIFESTS = f"""\
apiVersion: gateway/v2
kind: GatewayServiceAccount
metadata: {{name: orders-app}}
spec: {{type: LOCAL}}
---
apiVersion: gateway/v2
kind: GatewayScramCredential
metadata: {{name: orders-app}}
spec:
  password: "{PASSWORD}"
  mechanisms: [SCRAM-SHA-256, SCRAM-SHA-512]
  iterations: 8192
"""


# -- the identity provider --------------------------------------------------------------------------


def jwks(*keys: tuple[rsa.RSAPrivateKey, str]) -> bytes:
    """A JWKS document publishing the public halves of ``keys`` under their key ids."""
    published = [json.loads(RSAAlgorithm.to_jwk(key.public_key())) | {"kid": kid, "use": "sig"} for key, kid in keys]
    return json.dumps({"keys": published}).encode()


def token(key: rsa.RSAPrivateKey = KEY_1, kid: str = "k1", **claims: Any) -> str:
    now = int(time.time())
    payload = {"sub": "svc-orders", "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 300} | claims
    return jwt.encode(payload, key, algorithm="RS256", headers={"kid": kid})


@dataclass
class IdentityProvider:
    url: str
    document: bytes


@pytest.fixture(scope="module")
def idp() -> Iterator[IdentityProvider]:
    """The provider's JWKS endpoint, over HTTP; a test changes ``document`` to rotate keys."""
    provider = IdentityProvider("", jwks((KEY_1, "k1")))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = provider.document
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    provider.url = f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield provider
    finally:
        server.shutdown()
        thread.join()


# -- the gateway ------------------------------------------------------------------------------------


@dataclass
class Node:
    process: GatewayProcess
    http: AdminHttp

    @property
    def bootstrap(self) -> str:
        return self.process.bootstrap

    def failed(self, mechanism: str) -> float:
        """gateway_failed_authentications_total for ``mechanism``."""
        status, text = self.http.get("/metrics", user=None)
        assert status == 200
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "gateway_failed_authentications_total" and sample.labels == {"mechanism": mechanism}:
                    return sample.value
        return 0.0

    def wait_for_new(self, text: str, before: int) -> bool:
        """Whether ``text`` appears in the output more often than ``before`` times, within WAIT."""
        deadline = time.monotonic() + WAIT
        while self.process.output.count(text) <= before:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True


def kanal(node: Node, *args: str) -> str:
    """What ``kanal <args>`` prints, run against the node's admin API (it must succeed)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = kanal_main([*args, "--url", node.http.base, "--user", "admin", "--password", "secret"])
    assert code == 0, err.getvalue()
    return out.getvalue()


def apply(node: Node, manifests: str, tmp_path: Path) -> str:
    (tmp_path / "manifests.yaml").write_text(manifests)
    return kanal(node, "apply", "-f", str(tmp_path / "manifests.yaml"))


@pytest.fixture(scope="module")
def node(tansu: TansuBroker, idp: IdentityProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    env = {
        **tansu.gateway_settings(),
        "GATEWAY_ADMIN_API_USERS": ADMIN_USERS,
        "GATEWAY_CLUSTER_ID": f"scram-oauth-{uuid.uuid4().hex[:8]}",
        "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(secrets.token_bytes(32)).decode(),
        "GATEWAY_OAUTH_JWKS_URL": idp.url,
        "GATEWAY_OAUTH_EXPECTED_ISSUER": ISSUER,
        "GATEWAY_OAUTH_EXPECTED_AUDIENCES": AUDIENCE,
        # Refused clients reconnect and fail again while a test looks at them: no brute-force guard
        # here, so that one test's refusals never block the next test's good logins.
        "GATEWAY_AUTHENTICATION_MAX_FAILURES_PER_MINUTE": "0",
    }
    workdir = tmp_path_factory.mktemp("scram-oauth")
    process = GatewayProcess(env, log_path=workdir / "gateway.log").start(timeout=30)
    node = Node(process, AdminHttp(env["GATEWAY_HTTP_PORT"]))
    try:
        assert process.wait_for_output("signing keys (k1)", timeout=WAIT), process.tail()  # the startup fetch
        applied = apply(node, MANIFESTS, workdir)
        assert "GatewayScramCredential/orders-app: CREATED [Ready]" in applied, applied
        yield node
    finally:
        code = process.stop(timeout=15)
        assert code == 0, f"gateway exited with {code}:\n{process.tail()}"
        assert PASSWORD not in process.output and TEMP_PASSWORD not in process.output  # nothing secret logged


# -- clients ----------------------------------------------------------------------------------------


def scram_config(node: Node, mechanism: str, username: str, password: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": node.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": username,
        "sasl.password": password,
    }


def oauth_config(node: Node, tok: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": node.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "OAUTHBEARER",
        "oauth_cb": lambda _config: (tok, time.time() + 300),
    }


def round_trip(config: dict[str, Any], topic: str) -> None:
    """Produces one record with confluent-kafka, then consumes it back, both logged in with ``config``."""
    producer = Producer({**config, "message.timeout.ms": int(WAIT * 1000)})
    outcome: list[KafkaError | None] = []
    producer.produce(topic, b"through the gateway", partition=0, on_delivery=lambda err, _msg: outcome.append(err))
    producer.flush(WAIT)
    assert outcome == [None]
    consumer = Consumer({**config, "group.id": f"g-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + WAIT
    while not values and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and not message.error():
            values.append(message.value() or b"")
    consumer.close()
    assert values == [b"through the gateway"]


def auth_error(config: dict[str, Any]) -> KafkaError:
    """The error librdkafka reports when the gateway refuses its login."""
    errors: list[KafkaError] = []
    producer = Producer({**config, "error_cb": errors.append, "message.timeout.ms": 5000})
    deadline = time.monotonic() + WAIT
    while not any(e.code() == KafkaError._AUTHENTICATION for e in errors) and time.monotonic() < deadline:
        producer.poll(0.2)
    assert errors, "no error reported"
    return next((e for e in errors if e.code() == KafkaError._AUTHENTICATION), errors[0])


# -- SCRAM ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256"])
def test_confluent_kafka_logs_in_with_scram_produces_and_consumes_as_the_account(
    node: Node, mechanism: str, unique_topic: Callable[..., str]
) -> None:
    line = f"authenticated as orders-app ({mechanism})"
    before = node.process.output.count(line)
    round_trip(scram_config(node, mechanism, "orders-app", PASSWORD), unique_topic())
    assert node.wait_for_new(line, before)  # the connection carries the account's principal


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256"])
def test_kafka_python_logs_in_with_scram(node: Node, mechanism: str, unique_topic: Callable[..., str]) -> None:
    topic = unique_topic()
    login = {
        "bootstrap_servers": node.bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "orders-app",
        "sasl_plain_password": PASSWORD,
    }
    producer = KafkaProducer(**login)
    producer.send(topic, b"from kafka-python", partition=0).get(timeout=WAIT)
    producer.close()
    consumer = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=int(WAIT * 1000), **login)
    assert next(iter(consumer)).value == b"from kafka-python"
    consumer.close()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256"])
def test_aiokafka_logs_in_with_scram(node: Node, mechanism: str, unique_topic: Callable[..., str]) -> None:
    topic = unique_topic()
    login = {
        "bootstrap_servers": node.bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "orders-app",
        "sasl_plain_password": PASSWORD,
    }

    async def scenario() -> bytes:
        producer = AIOKafkaProducer(**login)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"from aiokafka", partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, auto_offset_reset="earliest", **login)
        await consumer.start()
        try:
            message = await asyncio.wait_for(consumer.getone(), WAIT)
        finally:
            await consumer.stop()
        return bytes(message.value or b"")

    assert asyncio.run(scenario()) == b"from aiokafka"


@pytest.mark.parametrize(
    ("username", "password"),
    [("orders-app", "not-the-password"), ("nobody", PASSWORD)],
    ids=["wrong-password", "unknown-user"],
)
def test_a_bad_scram_login_is_refused_as_an_authentication_failure_and_counted(
    node: Node, username: str, password: str, unique_topic: Callable[..., str]
) -> None:
    before = node.failed("SCRAM-SHA-512")
    error = auth_error(scram_config(node, "SCRAM-SHA-512", username, password))
    assert error.code() == KafkaError._AUTHENTICATION, error
    assert "Authentication failed" in error.str(), error  # SASL_AUTHENTICATION_FAILED, saying no more
    assert node.failed("SCRAM-SHA-512") > before
    round_trip(scram_config(node, "SCRAM-SHA-512", "orders-app", PASSWORD), unique_topic())  # others unaffected


def test_a_deleted_credential_no_longer_logs_in(node: Node, tmp_path: Path, unique_topic: Callable[..., str]) -> None:
    applied = apply(
        node,
        f"""\
apiVersion: gateway/v2
kind: GatewayServiceAccount
metadata: {{name: temp-app}}
spec: {{type: LOCAL}}
---
apiVersion: gateway/v2
kind: GatewayScramCredential
metadata: {{name: temp-app}}
spec: {{password: "{TEMP_PASSWORD}", mechanisms: [SCRAM-SHA-512]}}
""",
        tmp_path,
    )
    assert "GatewayScramCredential/temp-app: CREATED [Ready]" in applied
    config = scram_config(node, "SCRAM-SHA-512", "temp-app", TEMP_PASSWORD)
    round_trip(config, unique_topic())

    listed = kanal(node, "get", "scram-credentials")
    assert "temp-app" in listed and '["SCRAM-SHA-512"]' in listed and "4096" in listed, listed
    shown = kanal(node, "get", "scram-credential", "temp-app", "-o", "yaml")
    assert "mechanisms" in shown and TEMP_PASSWORD not in shown and "storedKey" not in shown
    assert "DELETED" in kanal(node, "delete", "scram-credential", "temp-app")
    before = node.failed("SCRAM-SHA-512")
    assert auth_error(config).code() == KafkaError._AUTHENTICATION
    assert node.failed("SCRAM-SHA-512") > before


# -- OAUTHBEARER ------------------------------------------------------------------------------------


def test_confluent_kafka_logs_in_with_a_token_as_its_subject(node: Node, unique_topic: Callable[..., str]) -> None:
    subject = f"svc-{uuid.uuid4().hex[:8]}"
    round_trip(oauth_config(node, token(sub=subject)), unique_topic())
    assert node.wait_for_new(f"authenticated as {subject} (OAUTHBEARER)", 0)


def test_an_external_service_account_names_a_token_subject(
    node: Node, tmp_path: Path, unique_topic: Callable[..., str]
) -> None:
    applied = apply(
        node,
        """\
apiVersion: gateway/v2
kind: GatewayServiceAccount
metadata: {name: partner-app}
spec: {type: EXTERNAL, externalNames: [svc-partner-0oa1]}
""",
        tmp_path,
    )
    assert "GatewayServiceAccount/partner-app: CREATED [Ready]" in applied
    round_trip(oauth_config(node, token(sub="svc-partner-0oa1")), unique_topic())
    assert node.wait_for_new("authenticated as partner-app (OAUTHBEARER)", 0)


class StaticTokens(AbstractTokenProvider):  # type: ignore[misc]
    def __init__(self, tok: str) -> None:
        self._token = tok

    def token(self) -> str:
        return self._token


def test_kafka_python_logs_in_with_a_token(node: Node, unique_topic: Callable[..., str]) -> None:
    subject = f"svc-{uuid.uuid4().hex[:8]}"
    topic = unique_topic()
    login = {
        "bootstrap_servers": node.bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "OAUTHBEARER",
        "sasl_oauth_token_provider": StaticTokens(token(sub=subject)),
    }
    producer = KafkaProducer(**login)
    producer.send(topic, b"from kafka-python", partition=0).get(timeout=WAIT)
    producer.close()
    consumer = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=int(WAIT * 1000), **login)
    assert next(iter(consumer)).value == b"from kafka-python"
    consumer.close()
    assert node.wait_for_new(f"authenticated as {subject} (OAUTHBEARER)", 0)


class AioStaticTokens(AioTokenProvider):  # type: ignore[misc]
    def __init__(self, tok: str) -> None:
        self._token = tok

    async def token(self) -> str:
        return self._token


def test_aiokafka_logs_in_with_a_token(node: Node, unique_topic: Callable[..., str]) -> None:
    subject = f"svc-{uuid.uuid4().hex[:8]}"
    topic = unique_topic()
    login = {
        "bootstrap_servers": node.bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "OAUTHBEARER",
        "sasl_oauth_token_provider": AioStaticTokens(token(sub=subject)),
    }

    async def scenario() -> bytes:
        producer = AIOKafkaProducer(**login)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"from aiokafka", partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, auto_offset_reset="earliest", **login)
        await consumer.start()
        try:
            message = await asyncio.wait_for(consumer.getone(), WAIT)
        finally:
            await consumer.stop()
        return bytes(message.value or b"")

    assert asyncio.run(scenario()) == b"from aiokafka"
    assert node.wait_for_new(f"authenticated as {subject} (OAUTHBEARER)", 0)


@pytest.mark.parametrize(
    "make_token",
    [  # made when the test runs (times relative to then, not to collection)
        lambda: token(exp=int(time.time()) - 600),
        lambda: token(nbf=int(time.time()) + 3600),
        lambda: token(KEY_2, "k1"),  # signed by a key that is not the one the provider publishes as k1
        lambda: token(iss="https://elsewhere.test"),
        lambda: token(aud="another-service"),
    ],
    ids=["expired", "not-yet-valid", "wrong-key", "wrong-issuer", "wrong-audience"],
)
def test_a_bad_token_is_refused_as_an_authentication_failure_and_counted(
    node: Node, make_token: Callable[[], str], unique_topic: Callable[..., str]
) -> None:
    tok = make_token()
    before = node.failed("OAUTHBEARER")
    error = auth_error(oauth_config(node, tok))
    assert error.code() == KafkaError._AUTHENTICATION, error
    assert node.failed("OAUTHBEARER") > before
    assert tok not in node.process.output
    round_trip(oauth_config(node, token()), unique_topic())  # a good token still works


def test_a_rotated_key_is_picked_up_without_a_restart(
    node: Node, idp: IdentityProvider, unique_topic: Callable[..., str]
) -> None:
    rotated = token(KEY_2, "k2", sub="svc-rotated")
    idp.document = jwks((KEY_1, "k1"), (KEY_2, "k2"))  # the provider publishes a new key
    round_trip(oauth_config(node, rotated), unique_topic())
    assert node.wait_for_new("a token names key id 'k2', which the gateway lacks", 0)
    assert node.wait_for_new("authenticated as svc-rotated (OAUTHBEARER)", 0)
    round_trip(oauth_config(node, token()), unique_topic())  # tokens of the older key still work
