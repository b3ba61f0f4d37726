"""TLS on the client listener, with certificates made for the test."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from inprocess import bootstrap_of, inprocess_gateway

from kanal.embedded import TansuBroker

pytestmark = pytest.mark.integration


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kanal test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(2)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = directory / "ca.pem", directory / "gateway.pem", directory / "gateway.key"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ca_path, cert_path, key_path


def test_clients_speak_tls_to_the_gateway(tansu: TansuBroker, tmp_path: Path, unique_topic: Callable[..., str]) -> None:
    ca, cert, key = _certificates(tmp_path)
    env = {
        "GATEWAY_SECURITY_PROTOCOL": "SSL",
        "GATEWAY_SSL_CERTIFICATE_LOCATION": str(cert),
        "GATEWAY_SSL_KEY_LOCATION": str(key),
    }
    topic = unique_topic()
    with inprocess_gateway(tansu, env=env) as gw:
        tls = {"bootstrap.servers": bootstrap_of(gw), "security.protocol": "SSL", "ssl.ca.location": str(ca)}
        admin = AdminClient(tls)
        for future in admin.create_topics([NewTopic(topic, 1)]).values():
            future.result(timeout=15)
        producer = Producer(tls)
        for i in range(10):
            producer.produce(topic, key=b"k", value=f"tls-{i}".encode())
        assert producer.flush(15) == 0
        consumer = Consumer({**tls, "group.id": "tls-test"})
        consumer.assign([TopicPartition(topic, 0, 0)])
        values = []
        for _ in range(60):
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                values.append(msg.value())
            if len(values) == 10:
                break
        consumer.close()
        assert values == [f"tls-{i}".encode() for i in range(10)]

        plain = AdminClient({"bootstrap.servers": bootstrap_of(gw), "socket.timeout.ms": 2000})
        with pytest.raises(KafkaException):  # a client without TLS gets nowhere
            plain.list_topics(timeout=3)


def test_a_client_that_never_completes_the_handshake_is_closed(tansu: TansuBroker, tmp_path: Path) -> None:
    """A TCP client that sends no ClientHello holds a connection only until
    GATEWAY_TLS_HANDSHAKE_TIMEOUT_MS; the gateway keeps serving."""
    _, cert, key = _certificates(tmp_path)
    env = {
        "GATEWAY_SECURITY_PROTOCOL": "SSL",
        "GATEWAY_SSL_CERTIFICATE_LOCATION": str(cert),
        "GATEWAY_SSL_KEY_LOCATION": str(key),
        "GATEWAY_TLS_HANDSHAKE_TIMEOUT_MS": "300",
    }
    with inprocess_gateway(tansu, env=env) as gw:
        host, port = bootstrap_of(gw).rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as silent:
            began = time.monotonic()
            try:
                closed = silent.recv(1) == b""
            except ConnectionResetError:
                closed = True
            assert closed and time.monotonic() - began < 5
