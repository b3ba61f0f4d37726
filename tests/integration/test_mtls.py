"""Client certificates name the client (GATEWAY_SECURITY_PROTOCOL=SSL, GATEWAY_SSL_CLIENT_AUTH): the
subject, mapped by GATEWAY_SSL_PRINCIPAL_MAPPING_RULES, is the connection's principal, with real
client libraries and certificates made for the test.

Which principal a connection got shows in what its clients consume: an interceptor scoped to one
user tags the values that user fetches, another tag applies to everyone else."""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import logging
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.helpers import create_ssl_context
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from inprocess import bootstrap_of, inprocess_gateway
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaPythonTopicPartition
from tagging import TagPlugin

from kanal.admin.identity import account_from_manifest
from kanal.api.interceptor import InterceptorSpec, Scope
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway
from kanal.identity.accounts import AccountType, ServiceAccount
from kanal.identity.tokens import mint

pytestmark = pytest.mark.integration

# The example of the security page ("Client certificates (mTLS)"): clients of OU=ServiceUsers are
# named by their CN, partners by their CN in lower case, nobody else; one partner's principal is
# renamed by an EXTERNAL service account.
RULES = "RULE:^CN=([a-zA-Z0-9.-]*),OU=ServiceUsers,.*$/$1/,RULE:^CN=([a-zA-Z0-9.-]*),OU=Partners,.*$/$1/L"
PARTNER_ACCOUNT = """\
apiVersion: gateway/v2
kind: GatewayServiceAccount
metadata: {name: partner}
spec: {type: EXTERNAL, externalNames: [partner-1]}
"""
SECRET = secrets.token_bytes(32)


INTERCEPTORS = [
    InterceptorSpec(name="tag", plugin="test-tag", config={"tag": "-everyone"}),
    InterceptorSpec(name="tag", plugin="test-tag", scope=Scope(username="orders-app"), config={"tag": "-orders"}),
    InterceptorSpec(name="tag", plugin="test-tag", scope=Scope(username="partner"), config={"tag": "-partner"}),
]


@dataclass(frozen=True)
class Pki:
    """A CA, the gateway's certificate, and a certificate (and key) per client subject."""

    ca: Path
    server_cert: Path
    server_key: Path
    clients: dict[str, tuple[Path, Path]]


def _name(subject: Sequence[tuple[x509.ObjectIdentifier, str]]) -> x509.Name:
    return x509.Name([x509.NameAttribute(oid, value) for oid, value in subject])


def _issue(
    directory: Path,
    stem: str,
    subject: x509.Name,
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    server: bool,
) -> tuple[Path, Path]:
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


# Each client's subject, in certificate order: Kafka prints it last first (CN=..,OU=..,O=Kanal).
CLIENTS = {
    label: [(NameOID.ORGANIZATION_NAME, "Kanal"), (NameOID.ORGANIZATIONAL_UNIT_NAME, ou), (NameOID.COMMON_NAME, cn)]
    for label, cn, ou in [
        ("orders-app", "orders-app", "ServiceUsers"),
        ("billing-app", "billing-app", "ServiceUsers"),
        ("partner", "Partner-1", "Partners"),
        ("intruder", "intruder", "Elsewhere"),
    ]
}


def _ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name([(NameOID.COMMON_NAME, common_name)])
    usage = x509.KeyUsage(
        digital_signature=False,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca, ca_key = _ca("kanal test CA")
    ca_path = directory / "ca.pem"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    server_name = _name([(NameOID.COMMON_NAME, "127.0.0.1")])
    server_cert, server_key = _issue(directory, "gateway", server_name, ca, ca_key, True)
    clients = {label: _issue(directory, label, _name(rdns), ca, ca_key, False) for label, rdns in CLIENTS.items()}
    other, other_key = _ca("another CA")  # signs the certificate of a client the gateway does not trust
    clients["stranger"] = _issue(directory, "stranger", _name(CLIENTS["orders-app"]), other, other_key, False)
    return Pki(ca_path, server_cert, server_key, clients)


def _env(pki: Pki, client_auth: str, protocol: str = "SSL") -> dict[str, str]:
    return {
        "GATEWAY_SECURITY_PROTOCOL": protocol,
        "GATEWAY_SSL_CERTIFICATE_LOCATION": str(pki.server_cert),
        "GATEWAY_SSL_KEY_LOCATION": str(pki.server_key),
        "GATEWAY_SSL_CA_LOCATION": str(pki.ca),
        "GATEWAY_SSL_CLIENT_AUTH": client_auth,
        "GATEWAY_SSL_PRINCIPAL_MAPPING_RULES": RULES,
    }


ACCOUNTS = [
    ServiceAccount("orders-app", None, AccountType.LOCAL),
    ServiceAccount("billing-app", None, AccountType.LOCAL),
    account_from_manifest(yaml.safe_load(PARTNER_ACCOUNT)),
]


@pytest.fixture(scope="module")
def required(tansu: TansuBroker, pki: Pki) -> Iterator[Gateway]:
    """A gateway that requires a client certificate."""
    with inprocess_gateway(tansu, {"tag": TagPlugin()}, INTERCEPTORS, env=_env(pki, "REQUIRED")) as gw:
        gw.service_accounts.replace(ACCOUNTS)
        yield gw


# -- the three client libraries ------------------------------------------------------------------


def _confluent_config(gw: Gateway, pki: Pki, client: str | None) -> dict[str, object]:
    config: dict[str, object] = {
        "bootstrap.servers": bootstrap_of(gw),
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca),
    }
    if client is not None:
        cert, key = pki.clients[client]
        config |= {"ssl.certificate.location": str(cert), "ssl.key.location": str(key)}
    return config


def _produce(library: str, gw: Gateway, pki: Pki, client: str | None, topic: str, values: list[bytes]) -> None:
    cert, key = pki.clients[client] if client is not None else (None, None)
    if library == "confluent-kafka":
        producer = Producer({**_confluent_config(gw, pki, client), "message.timeout.ms": 15000})
        for value in values:
            producer.produce(topic, value, partition=0)
        assert producer.flush(20) == 0
    elif library == "kafka-python":
        kp = KafkaProducer(
            bootstrap_servers=bootstrap_of(gw),
            security_protocol="SSL",
            ssl_cafile=str(pki.ca),
            ssl_certfile=str(cert) if cert else None,
            ssl_keyfile=str(key) if key else None,
        )
        for value in values:
            kp.send(topic, value, partition=0).get(timeout=20)
        kp.close()
    else:

        async def produce() -> None:
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap_of(gw),
                security_protocol="SSL",
                ssl_context=create_ssl_context(cafile=str(pki.ca), certfile=cert, keyfile=key),
            )
            await producer.start()
            try:
                for value in values:
                    await producer.send_and_wait(topic, value, partition=0)
            finally:
                await producer.stop()

        asyncio.run(produce())


def _consume(library: str, gw: Gateway, pki: Pki, client: str | None, topic: str, count: int) -> list[bytes]:
    """The first ``count`` values of partition 0 of ``topic``, as ``client`` fetches them."""
    cert, key = pki.clients[client] if client is not None else (None, None)
    out: list[bytes] = []
    deadline = time.monotonic() + 30
    if library == "confluent-kafka":
        consumer = Consumer({**_confluent_config(gw, pki, client), "group.id": "mtls", "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, 0, 0)])
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                out.append(msg.value() or b"")
        consumer.close()
    elif library == "kafka-python":
        kc = KafkaConsumer(
            bootstrap_servers=bootstrap_of(gw),
            security_protocol="SSL",
            ssl_cafile=str(pki.ca),
            ssl_certfile=str(cert) if cert else None,
            ssl_keyfile=str(key) if key else None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        kc.assign([KafkaPythonTopicPartition(topic, 0)])
        while len(out) < count and time.monotonic() < deadline:
            for records in kc.poll(timeout_ms=500).values():
                out.extend(r.value for r in records)
        kc.close()
    else:

        async def consume() -> None:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=bootstrap_of(gw),
                security_protocol="SSL",
                ssl_context=create_ssl_context(cafile=str(pki.ca), certfile=cert, keyfile=key),
                enable_auto_commit=False,
                auto_offset_reset="earliest",
            )
            await consumer.start()
            try:
                consumer.assign([AioTopicPartition(topic, 0)])
                while len(out) < count and time.monotonic() < deadline:
                    for records in (await consumer.getmany(timeout_ms=500)).values():
                        out.extend(r.value for r in records)
            finally:
                await consumer.stop()

        asyncio.run(consume())
    return out[:count]


def _refused(gw: Gateway, pki: Pki, client: str | None) -> None:
    """librdkafka gets nowhere with the gateway (the connection is closed before any answer)."""
    producer = Producer({**_confluent_config(gw, pki, client), "socket.timeout.ms": 2000})
    with pytest.raises(KafkaException):
        producer.list_topics(timeout=3)


def _wait_for(caplog: pytest.LogCaptureFixture, text: str) -> None:
    """The gateway logs from its own thread: wait for the line rather than assume it is there."""
    deadline = time.monotonic() + 10
    while text not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.05)
    assert text in caplog.text


# -- the tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("library", ["confluent-kafka", "kafka-python", "aiokafka"])
def test_a_client_certificate_gives_the_connection_its_mapped_principal(
    library: str,
    required: Gateway,
    pki: Pki,
    unique_topic: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kanal")
    topic = unique_topic()
    values = [f"{library}-{i}".encode() for i in range(3)]
    _produce(library, required, pki, "orders-app", topic, values)
    # The interceptor scoped to orders-app changes what orders-app fetches, and only that.
    assert _consume(library, required, pki, "orders-app", topic, 3) == [v + b"-orders" for v in values]
    assert _consume(library, required, pki, "billing-app", topic, 3) == [v + b"-everyone" for v in values]
    assert "authenticated as orders-app (SSL)" in caplog.text
    assert "authenticated as billing-app (SSL)" in caplog.text
    assert "CN=orders-app,OU=ServiceUsers,O=Kanal" not in caplog.text  # the rule took the CN only


def test_an_external_service_account_renames_the_mapped_principal(
    required: Gateway, pki: Pki, unique_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """CN=Partner-1,OU=Partners,O=Kanal maps (lower-cased) to partner-1, which the EXTERNAL account
    ``partner`` lists among its external names: the connection is ``partner``."""
    caplog.set_level(logging.INFO, logger="kanal")
    topic = unique_topic()
    _produce("confluent-kafka", required, pki, "partner", topic, [b"p"])
    assert _consume("confluent-kafka", required, pki, "partner", topic, 1) == [b"p-partner"]
    assert "authenticated as partner (SSL)" in caplog.text


def test_without_a_certificate_a_client_is_refused_when_one_is_required(
    required: Gateway, pki: Pki, unique_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kanal")
    _refused(required, pki, None)
    _wait_for(caplog, "peer did not return a certificate")
    # others are unaffected
    _produce("confluent-kafka", required, pki, "billing-app", unique_topic(), [b"v"])


def test_a_subject_no_rule_maps_is_refused_and_the_reason_logged(
    required: Gateway, pki: Pki, unique_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kanal")
    registry = required.metrics.registry
    before = registry.get_sample_value("gateway_failed_authentications_total", {"mechanism": "SSL"}) or 0
    _refused(required, pki, "intruder")
    why = "no rule of GATEWAY_SSL_PRINCIPAL_MAPPING_RULES maps certificate subject 'CN=intruder,OU=Elsewhere,O=Kanal'"
    _wait_for(caplog, why)
    assert any(r.levelno == logging.INFO and why in r.getMessage() for r in caplog.records)
    assert (registry.get_sample_value("gateway_failed_authentications_total", {"mechanism": "SSL"}) or 0) > before
    assert "authenticated as intruder" not in caplog.text
    _produce("confluent-kafka", required, pki, "orders-app", unique_topic(), [b"v"])  # others are unaffected


def test_without_a_certificate_a_client_is_anonymous_when_one_is_only_requested(
    tansu: TansuBroker, pki: Pki, unique_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kanal")
    topic = unique_topic()
    with inprocess_gateway(tansu, {"tag": TagPlugin()}, INTERCEPTORS, env=_env(pki, "REQUESTED")) as gw:
        _produce("confluent-kafka", gw, pki, None, topic, [b"a"])
        assert _consume("confluent-kafka", gw, pki, None, topic, 1) == [b"a-everyone"]
        assert "authenticated as" not in caplog.text
        # a client that does present one is named by it
        assert _consume("confluent-kafka", gw, pki, "orders-app", topic, 1) == [b"a-orders"]
        assert "authenticated as orders-app (SSL)" in caplog.text
        # one the gateway's CA did not sign is refused
        _refused(gw, pki, "stranger")
        _wait_for(caplog, "certificate verify failed")


def test_on_a_sasl_ssl_listener_the_sasl_login_names_the_client_not_its_certificate(
    tansu: TansuBroker, pki: Pki, unique_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kanal")
    env = {**_env(pki, "REQUIRED", "SASL_SSL"), "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(SECRET).decode()}
    topic = unique_topic()
    with inprocess_gateway(tansu, {"tag": TagPlugin()}, INTERCEPTORS, env=env) as gw:
        gw.service_accounts.replace(ACCOUNTS)
        config = {
            **_confluent_config(gw, pki, "orders-app"),  # the certificate says orders-app...
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "billing-app",  # ...the login billing-app
            "sasl.password": mint("billing-app", None, 600, SECRET),
        }
        producer = Producer(config)
        producer.produce(topic, b"s", partition=0)
        assert producer.flush(20) == 0
        consumer = Consumer({**config, "group.id": "mtls-sasl", "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while not values and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                values.append(msg.value() or b"")
        consumer.close()
        assert values == [b"s-everyone"]
        assert "authenticated as billing-app (PLAIN)" in caplog.text
        assert "authenticated as orders-app" not in caplog.text
