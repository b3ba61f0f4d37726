"""Clients authenticating to the gateway itself (GATEWAY_SECURITY_PROTOCOL=SASL_PLAINTEXT,
GATEWAY_MANAGED): SASL PLAIN with a gateway token as the password, with real client libraries."""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from inprocess import bootstrap_of, inprocess_gateway
from kafka import KafkaProducer
from kafka.errors import KafkaError as KafkaPythonError
from tagging import TagPlugin
from wire import WireClient, metadata_request

from kanal.api.interceptor import InterceptorSpec, Scope
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway
from kanal.identity.accounts import AccountType, ServiceAccount
from kanal.identity.tokens import mint
from kanal.protocol.api import ApiKey, require_request_class
from kanal.protocol.entities import build
from kanal.protocol.headers import response_correlation_id
from kanal.protocol.messages import decode_response, encode_request

SECRET = secrets.token_bytes(32)


@contextmanager
def _sasl_gateway(tansu: TansuBroker, interceptors: Sequence[InterceptorSpec] = (), **extra: str) -> Iterator[Gateway]:
    env = {
        "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(SECRET).decode(),
        **extra,
    }
    plugins = {"tag": TagPlugin()} if interceptors else {}
    with inprocess_gateway(tansu, plugins, interceptors, env=env) as gw:
        gw.service_accounts.replace(
            [
                ServiceAccount("orders-app", None, AccountType.LOCAL),
                ServiceAccount("billing-app", None, AccountType.LOCAL),
                ServiceAccount("partner", None, AccountType.EXTERNAL, ("CN=partner",)),
            ]
        )
        yield gw


@pytest.fixture
def gateway(tansu: TansuBroker) -> Iterator[Gateway]:
    with _sasl_gateway(tansu) as gw:
        yield gw


def _confluent(gw: Gateway, username: str, password: str, errors: list[KafkaError] | None = None) -> Producer:
    config: dict[str, object] = {
        "bootstrap.servers": bootstrap_of(gw),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": username,
        "sasl.password": password,
        "message.timeout.ms": 10000,
    }
    if errors is not None:
        config["error_cb"] = errors.append
    return Producer(config)


def _delivered(producer: Producer, topic: str) -> KafkaError | None:
    outcome: list[KafkaError | None] = []
    producer.produce(topic, b"v", on_delivery=lambda err, _msg: outcome.append(err))
    producer.flush(15)
    assert outcome, "no delivery report"
    return outcome[0]


def _auth_error(gw: Gateway, username: str, password: str) -> KafkaError:
    """The error the client library reports when the gateway refuses its login."""
    errors: list[KafkaError] = []
    producer = _confluent(gw, username, password, errors)
    deadline = time.monotonic() + 15
    while not any(e.code() == KafkaError._AUTHENTICATION for e in errors) and time.monotonic() < deadline:
        producer.poll(0.2)
    assert errors, "no error reported"
    return next((e for e in errors if e.code() == KafkaError._AUTHENTICATION), errors[0])


def test_a_token_for_a_local_account_logs_in_and_the_connection_gets_its_principal(
    gateway: Gateway, unique_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    token = mint("orders-app", None, 600, SECRET)
    caplog.set_level(logging.INFO, logger="kanal")
    producer = _confluent(gateway, "orders-app", token)
    assert _delivered(producer, unique_topic()) is None
    assert "authenticated as orders-app (PLAIN)" in caplog.text
    assert token not in caplog.text and base64.b64encode(SECRET).decode() not in caplog.text


@pytest.mark.parametrize(
    ("username", "password"),
    [
        ("orders-app", "not-a-token"),  # garbage
        ("orders-app", mint("orders-app", None, 600, secrets.token_bytes(32))),  # forged: another key
        ("orders-app", mint("orders-app", None, 1, SECRET, now=0)),  # expired
        ("someone-else", mint("orders-app", None, 600, SECRET)),  # issued to another user
        ("ghost", mint("ghost", None, 600, SECRET)),  # no such account
        ("partner", mint("partner", None, 600, SECRET)),  # not a LOCAL account
    ],
    ids=["garbage", "forged", "expired", "other-user", "unknown-account", "external-account"],
)
def test_bad_credentials_are_refused_as_an_authentication_failure_and_nothing_secret_is_logged(
    gateway: Gateway, username: str, password: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="kanal")
    before = gateway.metrics.registry.get_sample_value("gateway_failed_authentications_total", {"mechanism": "PLAIN"})
    error = _auth_error(gateway, username, password)
    assert error.code() == KafkaError._AUTHENTICATION, error
    assert "Authentication failed" in error.str(), error  # SASL_AUTHENTICATION_FAILED, saying no more
    after = gateway.metrics.registry.get_sample_value("gateway_failed_authentications_total", {"mechanism": "PLAIN"})
    assert (after or 0) > (before or 0)
    assert password not in caplog.text
    # Other clients are unaffected.
    assert _delivered(_confluent(gateway, "orders-app", mint("orders-app", None, 600, SECRET)), "auth-others") is None


def test_a_client_that_does_not_authenticate_gets_nothing(gateway: Gateway) -> None:
    plain = Producer({"bootstrap.servers": bootstrap_of(gateway), "message.timeout.ms": 3000})
    with pytest.raises(KafkaException):
        plain.list_topics(timeout=3)


def test_before_a_login_api_versions_is_answered_as_just_before_without_an_upstream_connection(
    gateway: Gateway,
) -> None:
    request = build(
        require_request_class(ApiKey.API_VERSIONS, 3), client_software_name="wire", client_software_version="1"
    )
    registry = gateway.metrics.registry
    first = WireClient(bootstrap_of(gateway))
    answer = first.call(request, 7)  # the first goes upstream
    assert answer.error_code == 0 and answer.api_keys
    links = registry.get_sample_value("gateway_upstream_connections_active")
    second = WireClient(bootstrap_of(gateway))
    assert second.call(request, 8) == answer  # answered by the gateway, with the client's correlation id
    assert registry.get_sample_value("gateway_upstream_connections_active") == links
    # Anything else before the login still closes the connection.
    second.send(build(require_request_class(ApiKey.METADATA, 12), topics=None), 9)
    assert second.closed_by_peer()


def _frame(body: object, correlation_id: int) -> bytes:
    frame = encode_request(body, correlation_id, "wire-test")
    return struct.pack(">i", len(frame)) + frame


def test_a_login_and_a_first_request_sent_in_one_write_are_all_answered_in_order(
    gateway: Gateway, unique_topic: Callable[..., str]
) -> None:
    """The exchange is served before the connection's reader and writer start (see ``_log_in``);
    what arrives with the last step of the login goes on to them, in order."""
    versions = build(
        require_request_class(ApiKey.API_VERSIONS, 3), client_software_name="wire", client_software_version="1"
    )
    WireClient(bootstrap_of(gateway)).call(versions, 1)  # now the gateway knows the broker's answer
    token = mint("orders-app", None, 60, SECRET)
    topic = unique_topic()
    requests = [
        (ApiKey.API_VERSIONS, 3, versions),
        (ApiKey.SASL_HANDSHAKE, 1, build(require_request_class(ApiKey.SASL_HANDSHAKE, 1), mechanism="PLAIN")),
        (
            ApiKey.SASL_AUTHENTICATE,
            2,
            build(require_request_class(ApiKey.SASL_AUTHENTICATE, 2), auth_bytes=f"\0orders-app\0{token}".encode()),
        ),
        (ApiKey.METADATA, 12, metadata_request([topic])),
    ]
    client = WireClient(bootstrap_of(gateway))
    client.send_raw(b"".join(_frame(body, 10 + at) for at, (_, _, body) in enumerate(requests)))
    answers = []
    for at, (api_key, version, _) in enumerate(requests):
        frame = client.receive()
        assert response_correlation_id(frame) == 10 + at
        answers.append(decode_response(api_key, version, frame))
    assert [answer.error_code for answer in answers[:3]] == [0, 0, 0]
    assert [t.name for t in answers[3].topics] == [topic]
    client.close()


def test_a_client_that_never_logs_in_is_closed_once_idle(tansu: TansuBroker) -> None:
    with _sasl_gateway(tansu, GATEWAY_IDLE_CONNECTION_TIMEOUT_MS="300") as gw:
        silent = WireClient(bootstrap_of(gw))
        assert silent.closed_by_peer(timeout=5)
        silent.close()


def test_kafka_python_logs_in_with_a_token_and_is_refused_with_a_bad_one(
    gateway: Gateway, unique_topic: Callable[..., str]
) -> None:
    def producer(password: str) -> KafkaProducer:
        return KafkaProducer(
            bootstrap_servers=bootstrap_of(gateway),
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_plain_username="orders-app",
            sasl_plain_password=password,
        )

    good = producer(mint("orders-app", None, 600, SECRET))
    good.send(unique_topic(), b"v").get(timeout=15)
    good.close()
    with pytest.raises(KafkaPythonError):  # refused at bootstrap (or at the first send)
        producer("wrong").send(unique_topic(), b"v").get(timeout=15)


def test_aiokafka_logs_in_with_a_token(gateway: Gateway, unique_topic: Callable[..., str]) -> None:
    async def produce() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap_of(gateway),
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_plain_username="orders-app",
            sasl_plain_password=mint("orders-app", None, 600, SECRET),
        )
        await producer.start()
        try:
            await producer.send_and_wait(unique_topic(), b"v")
        finally:
            await producer.stop()

    asyncio.run(produce())


def test_sessions_end_and_clients_re_authenticate_in_time(
    tansu: TansuBroker, unique_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """KIP-368: with GATEWAY_AUTHENTICATION_CONNECTION_MAX_REAUTH_MS the gateway tells the client how
    long its session lasts; librdkafka logs in again on the same connection before then."""
    caplog.set_level(logging.INFO, logger="kanal")
    with _sasl_gateway(tansu, GATEWAY_AUTHENTICATION_CONNECTION_MAX_REAUTH_MS="1000") as gw:
        producer = _confluent(gw, "orders-app", mint("orders-app", None, 600, SECRET))
        topic = unique_topic()
        assert _delivered(producer, topic) is None
        deadline = time.monotonic() + 20
        while "re-authenticated as orders-app" not in caplog.text and time.monotonic() < deadline:
            producer.poll(0.2)
        assert "re-authenticated as orders-app" in caplog.text
        assert _delivered(producer, topic) is None


def test_an_interceptor_scoped_to_a_user_applies_to_that_user_only_and_the_most_specific_wins(
    tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    topic = unique_topic()
    producer = Producer({"bootstrap.servers": tansu.bootstrap})
    for i in range(5):
        producer.produce(topic, f"v{i}".encode(), partition=0)
    assert producer.flush(15) == 0
    interceptors = [
        InterceptorSpec(name="tag", plugin="test-tag", config={"tag": "-everyone"}),
        InterceptorSpec(name="tag", plugin="test-tag", scope=Scope(username="orders-app"), config={"tag": "-orders"}),
    ]
    with _sasl_gateway(tansu, interceptors) as gw:
        assert _values(bootstrap_of(gw), topic, "orders-app") == [f"v{i}-orders".encode() for i in range(5)]
        assert _values(bootstrap_of(gw), topic, "billing-app") == [f"v{i}-everyone".encode() for i in range(5)]


def _values(bootstrap: str, topic: str, username: str) -> list[bytes]:
    """The values of partition 0 of ``topic`` as ``username`` consumes them through the gateway."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": username,
            "sasl.password": mint(username, None, 600, SECRET),
            "group.id": f"g-{username}",
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(out) < 5 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            out.append(msg.value())
    consumer.close()
    return out


def test_a_host_with_too_many_failed_logins_is_refused_even_with_a_good_token(
    tansu: TansuBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kanal")
    with _sasl_gateway(tansu, GATEWAY_AUTHENTICATION_MAX_FAILURES_PER_MINUTE="3") as gw:
        for _ in range(3):
            assert _auth_error(gw, "orders-app", "guess").code() == KafkaError._AUTHENTICATION
        good = mint("orders-app", None, 600, SECRET)
        assert _auth_error(gw, "orders-app", good).code() == KafkaError._AUTHENTICATION
        assert "without checking it: 3 failed logins from there" in caplog.text


def test_a_client_that_does_not_re_authenticate_is_closed_when_its_session_ends_and_logs_in_again(
    tansu: TansuBroker, unique_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """kafka-python does not implement KIP-368: once its session is over, its next request closes
    the connection; it reconnects, logs in again and its records still arrive."""
    caplog.set_level(logging.INFO, logger="kanal")
    topic = unique_topic()
    with _sasl_gateway(tansu, GATEWAY_AUTHENTICATION_CONNECTION_MAX_REAUTH_MS="500") as gw:
        producer = KafkaProducer(
            bootstrap_servers=bootstrap_of(gw),
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_plain_username="orders-app",
            sasl_plain_password=mint("orders-app", None, 600, SECRET),
            retries=5,
        )
        sent = 0
        deadline = time.monotonic() + 30
        while "request after the session expired" not in caplog.text and time.monotonic() < deadline:
            producer.send(topic, f"v{sent}".encode()).get(timeout=15)
            sent += 1
        assert "request after the session expired" in caplog.text
        producer.send(topic, b"after").get(timeout=15)  # logged in again on a new connection
        producer.close()
    expired = caplog.text.index("request after the session expired")
    assert "authenticated as orders-app" in caplog.text[expired:]  # a new login after the close
