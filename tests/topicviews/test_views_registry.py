"""A view over an Avro topic (Confluent framing), decoded through a schema registry external connection.

The registry is the repository's test registry (``kanal_registry_proxy.testing.TestRegistry``) with
basic auth on; the gateway runs in this process with the connection declared as the
``GATEWAY_EXTERNAL_CONNECTION_<NAME>_CONFIG_*`` variables would declare it.
"""

from __future__ import annotations

import base64
import io
import json
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

import kanal_topicviews.plugin as plugin
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from inprocess import bootstrap_of, inprocess_gateway
from kanal_registry_proxy.testing import TestRegistry
from kanal_topicviews.connections import ValueDecoders
from kanal_topicviews.interceptor import PLUGIN_NAME
from kanal_topicviews.resource import topic_view_kind

from kanal.embedded import TansuBroker

pytestmark = pytest.mark.integration

SCHEMA = {
    "type": "record",
    "name": "Payment",
    "namespace": "test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "country", "type": "string"},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}


def _register(url: str, subject: str, schema: dict[str, Any]) -> int:
    request = urllib.request.Request(
        f"{url}/subjects/{subject}/versions",
        data=json.dumps({"schema": json.dumps(schema)}).encode(),
        method="POST",
        headers={
            "Content-Type": "application/vnd.schemaregistry.v1+json",
            "Authorization": "Basic " + base64.b64encode(b"gw:pw").decode(),
        },
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(json.loads(response.read())["id"])


def _framed(schema_id: int, value: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(SCHEMA), value)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


class _NoState:
    def resources(self, kind: str) -> list[dict[str, Any]]:
        return []


@pytest.fixture(scope="module")
def registry() -> Iterator[TestRegistry]:
    permissions = [{"username": "gw", "operation": "Write", "resource": ".*"}]
    with TestRegistry(users={"gw": "pw"}, permissions=permissions) as running:
        yield running


def test_an_avro_topic_through_a_view(tansu: TansuBroker, registry: TestRegistry) -> None:
    from decimal import Decimal

    topic = f"payments-avro-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
    schema_id = _register(registry.url, f"{topic}-value", SCHEMA)
    producer = Producer({"bootstrap.servers": tansu.bootstrap})
    for i in range(6):
        value = {"id": i, "amount": Decimal(f"{i * 25}.50"), "country": "FR" if i % 2 else "DE", "note": None}
        producer.produce(topic, _framed(schema_id, value))
    producer.produce(topic, b'{"id": 6, "country": "FR"}')  # not in the registry's wire format
    producer.produce(topic, _framed(schema_id + 1000, {"id": 7, "amount": Decimal(0), "country": "FR"}))
    assert producer.flush(15) == 0

    env = {
        "GATEWAY_EXTERNAL_CONNECTION_PAYMENTS_SR_CONFIG_URL": registry.url,
        "GATEWAY_EXTERNAL_CONNECTION_PAYMENTS_SR_CONFIG_BASIC_AUTH_USERNAME": "gw",
        "GATEWAY_EXTERNAL_CONNECTION_PAYMENTS_SR_CONFIG_BASIC_AUTH_PASSWORD": "pw",
    }
    with inprocess_gateway(tansu, {"topic-views": plugin}) as gateway:
        kind = topic_view_kind(gateway.services_for(PLUGIN_NAME), ValueDecoders.from_env(env))
        view = f"fr-{uuid.uuid4().hex[:6]}"
        body = {
            "apiVersion": "gateway/v2",
            "kind": "TopicView",
            "metadata": {"name": view},
            "spec": {
                "transformation": {
                    "type": "sql",
                    "statement": f"SELECT id, amount FROM \"{topic}\" WHERE country = 'FR'",
                },
                "onError": {"type": "DROP"},
                "schemaRegistryConnectionName": "payments-sr",
            },
        }
        canonical = kind.validate(body, _NoState())
        assert canonical["spec"]["schemaRegistryConnectionName"] == "payments-sr"
        assert {s.state for s in kind.apply([canonical], _NoState()).values()} == {"Ready"}

        consumer = Consumer({"bootstrap.servers": bootstrap_of(gateway), "group.id": "x", "enable.auto.commit": False})
        consumer.assign([TopicPartition(view, 0, OFFSET_BEGINNING)])
        got: list[tuple[int, Any]] = []
        deadline = time.monotonic() + 15
        while len(got) < 3 and time.monotonic() < deadline:
            for msg in consumer.consume(10, 0.5):
                assert msg.error() is None, msg.error()
                got.append((msg.offset(), json.loads(msg.value())))
        consumer.close()
    assert got == [(1, {"id": 1, "amount": 25.5}), (3, {"id": 3, "amount": 75.5}), (5, {"id": 5, "amount": 125.5})]
