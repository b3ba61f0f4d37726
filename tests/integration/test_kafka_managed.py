"""KAFKA_MANAGED: the cluster authenticates each client, the gateway learns who it is.

Each client's SASL exchange is relayed to the broker on the client's own upstream connection; once
the broker accepts it, the connection carries the user name the exchange named (so interceptors
scoped to that user apply) and the gateway never keeps the secret.

Most of these tests use a scripted SASL front (``sasl_front.py``) as the authenticating broker, in
front of a Tansu broker without authentication: Tansu 0.6.0 with ``--authentication`` cannot let
any client in. Its only storage engine (dynostore, behind ``memory://`` and ``s3://``) accepts
AlterUserScramCredentials and stores nothing, so every SCRAM user is unknown; it offers no PLAIN
(the handshake fails with NoSharedMechanism and the connection is closed), and its OAUTHBEARER
check refuses every token. What real Tansu with ``--authentication`` can show, it is used for:
its SCRAM refusal, relayed through the gateway to all three client libraries.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AIOTopicPartition
from aiokafka.errors import KafkaError as AIOKafkaError
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from inprocess import bootstrap_of, inprocess_gateway
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KPTopicPartition
from kafka.errors import KafkaError as KafkaPythonError
from sasl_front import SaslFront
from tagging import TagPlugin

from kanal.api.interceptor import InterceptorSpec, Scope
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway
from kanal.identity.accounts import AccountType, ServiceAccount
from kanal.protocol.api import require_request_class
from kanal.protocol.entities import build
from kanal.protocol.messages import decode_response, encode_request

pytestmark = pytest.mark.integration

SCRAM = "SCRAM-SHA-512"
GATEWAY_USER, GATEWAY_PASSWORD = "kanal-gateway", "gateway-" + secrets.token_hex(8)
# Passwords with the characters SCRAM escapes, and unique enough to grep the logs for.
PASSWORDS = {name: f"{name}-{secrets.token_hex(8)}=,é" for name in ("alice", "bob")}
LIBRARIES = ["confluent-kafka", "kafka-python", "aiokafka"]


class _Bootstrap:
    """What the in-process gateway needs of a broker: where to bootstrap from, and its node id."""

    def __init__(self, bootstrap: str, node_id: int) -> None:
        self.bootstrap = bootstrap
        self.node_id = node_id


def _split(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


@contextmanager
def _fronted(tmp_path: Path, mechanism: str, **front_options: Any) -> Iterator[tuple[SaslFront, _Bootstrap]]:
    """A SASL front checking ``mechanism`` logins of alice, bob and the gateway itself, in front of
    a Tansu broker that announces the front as its address."""
    front = SaslFront(mechanism, users={**PASSWORDS, GATEWAY_USER: GATEWAY_PASSWORD}, **front_options)
    broker = TansuBroker(advertised=front.address, log_path=tmp_path / "tansu.log").start()
    front.broker = _split(broker.bootstrap)
    try:
        yield front, _Bootstrap(front.address, broker.node_id)
    finally:
        front.close()
        broker.stop()


@pytest.fixture(scope="module")
def scram_front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SaslFront, _Bootstrap]]:
    with _fronted(tmp_path_factory.mktemp("front"), SCRAM) as fronted:
        yield fronted


@contextmanager
def _managed_gateway(
    upstream: _Bootstrap | TansuBroker,
    mechanism: str = SCRAM,
    interceptors: Sequence[InterceptorSpec] = (),
    *,
    own_login: bool = True,
) -> Iterator[Gateway]:
    """A KAFKA_MANAGED gateway; with ``own_login`` its own connection (metadata) logs in as the
    gateway, while each client logs in as itself. Without, the gateway has no connection of its
    own to the cluster once it has discovered it (see ``authenticating_tansu``): its audit log,
    which needs one, is off."""
    env = {"GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "GATEWAY_SECURITY_MODE": "KAFKA_MANAGED"}
    if not own_login:
        env["GATEWAY_FEATURE_FLAGS_AUDIT"] = "false"
    if own_login:
        env |= {
            "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "KAFKA_SASL_MECHANISM": mechanism,
            "KAFKA_SASL_USERNAME": GATEWAY_USER,
            "KAFKA_SASL_PASSWORD": GATEWAY_PASSWORD,
        }
    plugins = {"tag": TagPlugin()} if interceptors else {}
    with inprocess_gateway(upstream, plugins, interceptors, env=env) as gw:  # type: ignore[arg-type]
        yield gw


def _failed_logins(gw: Gateway, mechanism: str = SCRAM) -> float:
    value = gw.metrics.registry.get_sample_value("gateway_failed_authentications_total", {"mechanism": mechanism})
    return value or 0.0


# --- the three client libraries ---------------------------------------------------------------


def _confluent_config(gw: Gateway, user: str, password: str, mechanism: str = SCRAM) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap_of(gw),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def _produce(library: str, gw: Gateway, user: str, password: str, topic: str, values: Sequence[bytes]) -> None:
    """Produces ``values`` to partition 0 of ``topic`` through the gateway, logged in as ``user``."""
    if library == "confluent-kafka":
        producer = Producer({**_confluent_config(gw, user, password), "message.timeout.ms": 15000})
        errors: list[KafkaError | None] = []
        for value in values:
            producer.produce(topic, value, partition=0, on_delivery=lambda err, _msg: errors.append(err))
        assert producer.flush(20) == 0
        assert errors == [None] * len(values)
    elif library == "kafka-python":
        kp = KafkaProducer(
            bootstrap_servers=bootstrap_of(gw),
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism=SCRAM,
            sasl_plain_username=user,
            sasl_plain_password=password,
        )
        for value in values:
            kp.send(topic, value, partition=0).get(timeout=20)
        kp.close()
    else:

        async def produce() -> None:
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap_of(gw),
                security_protocol="SASL_PLAINTEXT",
                sasl_mechanism=SCRAM,
                sasl_plain_username=user,
                sasl_plain_password=password,
            )
            await producer.start()
            try:
                for value in values:
                    await producer.send_and_wait(topic, value, partition=0)
            finally:
                await producer.stop()

        asyncio.run(produce())


def _consume(library: str, gw: Gateway, user: str, password: str, topic: str, count: int) -> list[bytes]:
    """The first ``count`` values of partition 0 of ``topic``, consumed through the gateway as ``user``."""
    deadline = time.monotonic() + 30
    out: list[bytes] = []
    if library == "confluent-kafka":
        consumer = Consumer({**_confluent_config(gw, user, password), "group.id": f"g-{user}"})
        consumer.assign([TopicPartition(topic, 0, 0)])
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                out.append(msg.value() or b"")
        consumer.close()
    elif library == "kafka-python":
        kc = KafkaConsumer(
            bootstrap_servers=bootstrap_of(gw),
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism=SCRAM,
            sasl_plain_username=user,
            sasl_plain_password=password,
            enable_auto_commit=False,
        )
        kc.assign([KPTopicPartition(topic, 0)])
        kc.seek(KPTopicPartition(topic, 0), 0)
        while len(out) < count and time.monotonic() < deadline:
            for records in kc.poll(timeout_ms=500).values():
                out.extend(r.value for r in records if r.value is not None)
        kc.close()
    else:

        async def consume() -> None:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=bootstrap_of(gw),
                security_protocol="SASL_PLAINTEXT",
                sasl_mechanism=SCRAM,
                sasl_plain_username=user,
                sasl_plain_password=password,
                enable_auto_commit=False,
            )
            await consumer.start()
            try:
                consumer.assign([AIOTopicPartition(topic, 0)])
                consumer.seek(AIOTopicPartition(topic, 0), 0)
                while len(out) < count and time.monotonic() < deadline:
                    for records in (await consumer.getmany(timeout_ms=500)).values():
                        out.extend(r.value for r in records)
            finally:
                await consumer.stop()

        asyncio.run(consume())
    return out


def _refused(library: str, gw: Gateway, user: str, password: str, caplog: pytest.LogCaptureFixture) -> str:
    """Logs in with a password the cluster refuses; what the client library reports: librdkafka
    through its error callback; kafka-python and aiokafka log the failure and raise a bootstrap
    error."""
    mechanism = SCRAM
    if library == "confluent-kafka":
        errors: list[KafkaError] = []
        producer = Producer(
            {**_confluent_config(gw, user, password, mechanism), "error_cb": errors.append, "message.timeout.ms": 5000}
        )
        deadline = time.monotonic() + 15
        while not any(e.code() == KafkaError._AUTHENTICATION for e in errors) and time.monotonic() < deadline:
            producer.poll(0.2)
        failure = next((e for e in errors if e.code() == KafkaError._AUTHENTICATION), None)
        assert failure is not None, errors
        return str(failure.str())
    if library == "kafka-python":
        with pytest.raises(KafkaPythonError):
            KafkaProducer(
                bootstrap_servers=bootstrap_of(gw),
                security_protocol="SASL_PLAINTEXT",
                sasl_mechanism=mechanism,
                sasl_plain_username=user,
                sasl_plain_password=password,
                bootstrap_timeout_ms=5000,  # (it gives up on a refused bootstrap only at this timeout)
            ).send("refused", b"v").get(timeout=15)
        return _library_log(caplog, "kafka")

    async def start() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap_of(gw),
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism=mechanism,
            sasl_plain_username=user,
            sasl_plain_password=password,
        )
        try:
            await producer.start()
        finally:
            await producer.stop()

    with pytest.raises(AIOKafkaError):
        asyncio.run(start())
    return _library_log(caplog, "aiokafka")


def _library_log(caplog: pytest.LogCaptureFixture, logger: str) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name.split(".")[0] == logger)


# --- tests ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_client_logs_in_with_the_cluster_and_its_connection_carries_its_user(
    scram_front: tuple[SaslFront, _Bootstrap],
    library: str,
    unique_topic: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    front, upstream = scram_front
    caplog.set_level(logging.DEBUG, logger="kanal")
    topic = unique_topic()
    values = [f"v{i}".encode() for i in range(3)]
    scoped = InterceptorSpec(name="tag", plugin="test-tag", scope=Scope(username="alice"), config={"tag": "-alice"})
    with _managed_gateway(upstream, interceptors=[scoped]) as gw:
        _produce(library, gw, "alice", PASSWORDS["alice"], topic, values)
        assert _consume(library, gw, "alice", PASSWORDS["alice"], topic, 3) == [v + b"-alice" for v in values]
        assert _consume("confluent-kafka", gw, "bob", PASSWORDS["bob"], topic, 3) == values  # not bob's traffic
    assert "authenticated as alice (SCRAM-SHA-512)" in caplog.text
    assert "authenticated as bob (SCRAM-SHA-512)" in caplog.text
    assert "alice" in front.logins  # the broker authenticated the client itself
    for password in (*PASSWORDS.values(), GATEWAY_PASSWORD):
        assert password not in caplog.text


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_wrong_password_is_refused_by_the_cluster_counted_and_not_logged(
    scram_front: tuple[SaslFront, _Bootstrap], library: str, caplog: pytest.LogCaptureFixture
) -> None:
    front, upstream = scram_front
    caplog.set_level(logging.DEBUG, logger="kanal")
    wrong = "wrong-" + secrets.token_hex(8)
    refused_before = front.refused
    with _managed_gateway(upstream) as gw:
        before = _failed_logins(gw)
        reported = _refused(library, gw, "alice", wrong, caplog)
        assert "SaslAuthenticationFailed" in reported or "SASL authentication error" in reported, reported
        assert _failed_logins(gw) > before
        assert front.refused > refused_before
        # Other clients are unaffected.
        _produce("confluent-kafka", gw, "bob", PASSWORDS["bob"], "kafka-managed-others", [b"v"])
    assert "failed authentication with the cluster as 'alice' (SCRAM-SHA-512): Authentication failed" in caplog.text
    assert wrong not in caplog.text


def test_an_external_service_account_renames_the_clusters_user(
    scram_front: tuple[SaslFront, _Bootstrap], unique_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    _front, upstream = scram_front
    caplog.set_level(logging.INFO, logger="kanal")
    topic = unique_topic()
    scoped = InterceptorSpec(
        name="tag", plugin="test-tag", scope=Scope(username="orders-app"), config={"tag": "-orders"}
    )
    with _managed_gateway(upstream, interceptors=[scoped]) as gw:
        gw.service_accounts.replace([ServiceAccount("orders-app", None, AccountType.EXTERNAL, ("alice",))])
        _produce("confluent-kafka", gw, "alice", PASSWORDS["alice"], topic, [b"v"])
        assert _consume("confluent-kafka", gw, "alice", PASSWORDS["alice"], topic, 1) == [b"v-orders"]
        assert _consume("confluent-kafka", gw, "bob", PASSWORDS["bob"], topic, 1) == [b"v"]
    assert "authenticated as orders-app (SCRAM-SHA-512)" in caplog.text


@pytest.mark.parametrize("library", ["confluent-kafka", "kafka-python"])
def test_a_re_authentication_on_the_same_connection_is_followed(
    scram_front: tuple[SaslFront, _Bootstrap],
    library: str,
    unique_topic: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """KIP-368: the broker says the session ends; the client logs in again on the same connection,
    through the gateway, and the connection keeps (or takes) the user that exchange named."""
    front, upstream = scram_front
    caplog.set_level(logging.INFO, logger="kanal")
    topic = unique_topic()
    front.session_lifetime_ms = 1500
    try:
        with _managed_gateway(upstream) as gw:
            if library == "confluent-kafka":
                producer = Producer({**_confluent_config(gw, "alice", PASSWORDS["alice"]), "message.timeout.ms": 15000})

                def send(value: bytes) -> None:
                    producer.produce(topic, value)
                    assert producer.flush(20) == 0

                def wait() -> None:
                    producer.poll(0.2)
            else:
                kp = KafkaProducer(
                    bootstrap_servers=bootstrap_of(gw),
                    security_protocol="SASL_PLAINTEXT",
                    sasl_mechanism=SCRAM,
                    sasl_plain_username="alice",
                    sasl_plain_password=PASSWORDS["alice"],
                )

                def send(value: bytes) -> None:
                    kp.send(topic, value).get(timeout=20)

                def wait() -> None:
                    time.sleep(0.2)  # kafka-python re-authenticates on its own I/O thread

            send(b"before")
            deadline = time.monotonic() + 20
            while "re-authenticated as alice (SCRAM-SHA-512)" not in caplog.text and time.monotonic() < deadline:
                wait()
            assert "re-authenticated as alice (SCRAM-SHA-512)" in caplog.text
            send(b"after")
    finally:
        front.session_lifetime_ms = 0


def test_a_client_that_skips_authentication_gets_nothing(scram_front: tuple[SaslFront, _Bootstrap]) -> None:
    """Its requests go on a connection of its own that is not logged in: never on the gateway's."""
    _front, upstream = scram_front
    with _managed_gateway(upstream) as gw:
        plain = Producer({"bootstrap.servers": bootstrap_of(gw), "message.timeout.ms": 3000})
        with pytest.raises(KafkaException):
            plain.list_topics(timeout=3)


def test_plain_and_raw_tokens_after_a_handshake_v0(
    tmp_path: Path, unique_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """PLAIN's user name is learnt too, and a client that sends SaslHandshake v0 (then raw SASL
    tokens, without Kafka headers) is carried through: here kafka-python told to speak Kafka
    0.11's protocol, which has no SaslAuthenticate; a refused raw token closes the connection."""
    caplog.set_level(logging.DEBUG, logger="kanal")
    topic = unique_topic()
    with _fronted(tmp_path, "PLAIN") as (front, upstream), _managed_gateway(upstream, "PLAIN") as gw:
        producer = Producer(
            {**_confluent_config(gw, "alice", PASSWORDS["alice"], "PLAIN"), "message.timeout.ms": 15000}
        )
        producer.produce(topic, b"v1")
        assert producer.flush(20) == 0
        old = KafkaProducer(
            bootstrap_servers=bootstrap_of(gw),
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_plain_username="bob",
            sasl_plain_password=PASSWORDS["bob"],
            api_version=(0, 11, 0),
            enable_idempotence=False,  # (Tansu answers InitProducerId v0 with an unknown error)
        )
        old.send(topic, b"v0").get(timeout=20)
        old.close()
        # A refused raw token: a v0 exchange has no error to send, the connection is closed.
        with socket.create_connection(_split(bootstrap_of(gw))) as sock:
            sock.settimeout(15)
            handshake = encode_request(build(require_request_class(17, 0), mechanism="PLAIN"), 1, "raw-client")
            sock.sendall(_raw(handshake))
            assert int(decode_response(17, 0, _frame(sock)).error_code) == 0
            sock.sendall(_raw(b"\x00bob\x00wrong-" + PASSWORDS["bob"].encode()))
            assert sock.recv(1) == b""
        assert _failed_logins(gw, "PLAIN") == 1
    assert "authenticated as alice (PLAIN)" in caplog.text
    assert "authenticated as bob (PLAIN)" in caplog.text
    assert front.logins.count("bob") >= 1
    for password in PASSWORDS.values():
        assert password not in caplog.text


# --- real Tansu with --authentication ----------------------------------------------------------------


@pytest.fixture(scope="module")
def authenticating_tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Bootstrap]:
    """Tansu with ``--authentication``, and how the gateway finds it: no login to it can succeed
    (see the module's docstring), not even the gateway's own, so the gateway discovers the cluster
    through a second Tansu without authentication that announces the first one's address. Every
    client connection then goes to the authenticating broker."""
    path = tmp_path_factory.mktemp("tansu-auth")
    secured = TansuBroker(extra_args=["--authentication"], log_path=path / "secured.log").start()
    directory = TansuBroker(advertised=secured.bootstrap, log_path=path / "directory.log").start()
    try:
        yield _Bootstrap(directory.bootstrap, directory.node_id)
    finally:
        directory.stop()
        secured.stop()


@pytest.mark.parametrize("library", LIBRARIES)
def test_tansu_refuses_a_scram_login_relayed_through_the_gateway(
    authenticating_tansu: _Bootstrap, library: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="kanal")
    password = "pw-" + secrets.token_hex(8)
    with _managed_gateway(authenticating_tansu, own_login=False) as gw:
        before = _failed_logins(gw)
        reported = _refused(library, gw, "alice", password, caplog)
        assert "SaslAuthenticationFailed" in reported or "SASL authentication error" in reported, reported
        assert _failed_logins(gw) > before
    assert "failed authentication with the cluster as 'alice' (SCRAM-SHA-512)" in caplog.text
    assert password not in caplog.text


def test_tansu_refuses_raw_scram_tokens_and_the_gateway_closes_the_connection(
    authenticating_tansu: _Bootstrap, caplog: pytest.LogCaptureFixture
) -> None:
    """SaslHandshake v0, then SCRAM as raw tokens: Tansu's server-first comes back as a raw token,
    and its refusal of the proof closes the client's connection (v0 has no error to send)."""
    caplog.set_level(logging.INFO, logger="kanal")
    with (
        _managed_gateway(authenticating_tansu, own_login=False) as gw,
        socket.create_connection(_split(bootstrap_of(gw))) as sock,
    ):
        sock.settimeout(15)
        handshake = encode_request(build(require_request_class(17, 0), mechanism=SCRAM), 7, "raw-client")
        sock.sendall(_raw(handshake))
        answer = decode_response(17, 0, _frame(sock))
        assert int(answer.error_code) == 0 and SCRAM in answer.mechanisms
        sock.sendall(_raw(b"n,,n=alice,r=" + b"0123456789abcdef"))
        server_first = _frame(sock)
        assert server_first.startswith(b"r=0123456789abcdef") and b",s=" in server_first and b",i=" in server_first
        sock.sendall(_raw(b"c=biws,r=" + server_first.split(b",")[0][2:] + b",p=" + b"A" * 88))
        assert sock.recv(1) == b""  # closed, nothing sent
        assert _failed_logins(gw) == 1
    assert "failed authentication with the cluster as 'alice' (SCRAM-SHA-512)" in caplog.text


def test_tansu_refuses_an_unknown_scram_user_and_the_connection_is_closed_at_its_next_request(
    authenticating_tansu: _Bootstrap, caplog: pytest.LogCaptureFixture
) -> None:
    """Tansu refuses an unknown SCRAM user in its server-final message (``e=unknown-user``) with no
    error code; the client gets SASL_AUTHENTICATION_FAILED, and its next request closes the
    connection, as a broker closes a connection whose login it refused."""
    caplog.set_level(logging.INFO, logger="kanal")
    with (
        _managed_gateway(authenticating_tansu, own_login=False) as gw,
        socket.create_connection(_split(bootstrap_of(gw))) as sock,
    ):
        sock.settimeout(15)

        def call(api_key: int, version: int, **fields: Any) -> Any:
            sock.sendall(_raw(encode_request(build(require_request_class(api_key, version), **fields), 3, "raw")))
            return decode_response(api_key, version, _frame(sock))

        assert int(call(17, 1, mechanism=SCRAM).error_code) == 0
        first = call(36, 2, auth_bytes=b"n,,n=mallory,r=0123456789abcdef")
        assert int(first.error_code) == 0 and first.auth_bytes.startswith(b"r=0123456789abcdef")
        nonce = bytes(first.auth_bytes).split(b",")[0][2:]
        final = call(36, 2, auth_bytes=b"c=biws,r=" + nonce + b",p=" + b"A" * 88)
        assert int(final.error_code) == 58  # SASL_AUTHENTICATION_FAILED
        assert final.error_message == "Authentication failed: e=unknown-user"
        sock.sendall(_raw(encode_request(build(require_request_class(3, 12)), 4, "raw")))  # Metadata
        assert sock.recv(1) == b""
        assert _failed_logins(gw) == 1
    assert "failed authentication with the cluster as 'mallory' (SCRAM-SHA-512): e=unknown-user" in caplog.text


def _raw(token: bytes) -> bytes:
    return struct.pack(">i", len(token)) + token


def _frame(sock: socket.socket) -> bytes:
    head = _recv(sock, 4)
    return _recv(sock, struct.unpack(">i", head)[0])


def _recv(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "connection closed"
        data += chunk
    return data
