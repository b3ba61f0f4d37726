"""The gateway authenticates to the cluster with SASL PLAIN or SCRAM; clients connect without it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from inprocess import bootstrap_of, inprocess_gateway
from sasl_front import SaslFront

from kanal.api import UpstreamError
from kanal.config.settings import build_settings
from kanal.embedded import TansuBroker
from kanal.net.kafka_client import GatewayKafkaClient

pytestmark = pytest.mark.integration


def _split(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


@pytest.fixture
def fronted_broker(tmp_path: Path) -> Iterator[tuple[TansuBroker, SaslFront]]:
    """A Tansu broker that announces the SASL front as its address, so every connection goes through it."""
    front = SaslFront("PLAIN", "gateway-user", "s3cret=,é")
    broker = TansuBroker(advertised=front.address, log_path=tmp_path / "tansu.log").start()
    front.broker = _split(broker.bootstrap)
    try:
        yield broker, front
    finally:
        front.close()
        broker.stop()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_gateway_authenticates_upstream(
    fronted_broker: tuple[TansuBroker, SaslFront], mechanism: str, unique_topic: Callable[..., str]
) -> None:
    broker, front = fronted_broker
    front.mechanism = mechanism
    fronted = _FrontedBroker(broker, front.address)
    env = {
        "GATEWAY_SECURITY_PROTOCOL": "PLAINTEXT",
        "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "KAFKA_SASL_MECHANISM": mechanism,
        "KAFKA_SASL_JAAS_CONFIG": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="gateway-user" password="s3cret=,é";',
    }
    topic = unique_topic()
    with inprocess_gateway(fronted, env=env) as gw:  # type: ignore[arg-type]
        admin = AdminClient({"bootstrap.servers": bootstrap_of(gw)})
        for future in admin.create_topics([NewTopic(topic, 1)]).values():
            future.result(timeout=15)
        producer = Producer({"bootstrap.servers": bootstrap_of(gw)})
        producer.produce(topic, b"authenticated upstream")
        assert producer.flush(15) == 0
    assert front.authenticated >= 2 and front.refused == 0


def test_wrong_password_is_reported(tansu: TansuBroker) -> None:
    front = SaslFront("SCRAM-SHA-256", "gateway-user", "right")
    front.broker = _split(tansu.bootstrap)
    settings = build_settings(
        {
            "KAFKA_BOOTSTRAP_SERVERS": front.address,
            "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
            "KAFKA_SASL_USERNAME": "gateway-user",
            "KAFKA_SASL_PASSWORD": "wrong",
        }
    )
    client = GatewayKafkaClient(settings.upstream, 5, settings.max_frame_size, "kanal-test")
    try:
        with pytest.raises(UpstreamError, match="SASL authentication failed: Authentication failed"):
            trio.run(client.metadata)
        assert front.refused == 1
    finally:
        front.close()


class _FrontedBroker:
    """Looks like the TansuBroker to the in-process gateway helper, but bootstraps via the front."""

    def __init__(self, broker: TansuBroker, address: str) -> None:
        self.bootstrap = address
        self.node_id = broker.node_id


@pytest.mark.parametrize("protocol", ["SSL", "SASL_SSL"])
def test_gateway_speaks_tls_to_the_cluster(tmp_path: Path, protocol: str, unique_topic: Callable[..., str]) -> None:
    import ssl

    from test_tls import _certificates

    ca, cert, key = _certificates(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    front = SaslFront("SCRAM-SHA-512" if protocol == "SASL_SSL" else None, "gateway-user", "pw", tls=context)
    broker = TansuBroker(advertised=front.address, log_path=tmp_path / "tansu.log").start()
    front.broker = _split(broker.bootstrap)
    env = {
        "GATEWAY_SECURITY_PROTOCOL": "PLAINTEXT",
        "KAFKA_SECURITY_PROTOCOL": protocol,
        "KAFKA_SSL_CA_LOCATION": str(ca),
        "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "KAFKA_SASL_USERNAME": "gateway-user",
        "KAFKA_SASL_PASSWORD": "pw",
    }
    try:
        topic = unique_topic()
        with inprocess_gateway(_FrontedBroker(broker, front.address), env=env) as gw:  # type: ignore[arg-type]
            admin = AdminClient({"bootstrap.servers": bootstrap_of(gw)})
            for future in admin.create_topics([NewTopic(topic, 1)]).values():
                future.result(timeout=15)
            producer = Producer({"bootstrap.servers": bootstrap_of(gw)})
            producer.produce(topic, b"over tls")
            assert producer.flush(15) == 0
        assert front.refused == 0
        if protocol == "SASL_SSL":
            assert front.authenticated >= 2
    finally:
        front.close()
        broker.stop()
