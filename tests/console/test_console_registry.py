"""The topic page reads Avro values through a schema registry external connection (the topic-views
plugin's connections, ``GATEWAY_EXTERNAL_CONNECTION_<NAME>_CONFIG_*``): a value in the registry's
wire format (a schema id prefix) and one whose ``__value_schema_id`` header names the schema. The
registry is the repository's test registry (no registry can run here otherwise)."""

from __future__ import annotations

import base64
import io
import json
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import ADMIN, USERS, ConsoleNode
from kanal_registry_proxy.testing import TestRegistry

from kanal.embedded import GatewayProcess, TansuBroker

pytestmark = pytest.mark.integration

SCHEMA = {
    "type": "record",
    "name": "Payment",
    "fields": [{"name": "id", "type": "long"}, {"name": "country", "type": "string"}],
}


def avro(value: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(SCHEMA), value)
    return out.getvalue()


def register(url: str, subject: str) -> int:
    request = urllib.request.Request(
        f"{url}/subjects/{subject}/versions",
        data=json.dumps({"schema": json.dumps(SCHEMA)}).encode(),
        method="POST",
        headers={
            "Content-Type": "application/vnd.schemaregistry.v1+json",
            "Authorization": "Basic " + base64.b64encode(b"gw:pw").decode(),
        },
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(json.loads(response.read())["id"])


@pytest.fixture(scope="module")
def registry() -> Iterator[TestRegistry]:
    permissions = [{"username": "gw", "operation": "Write", "resource": ".*"}]
    with TestRegistry(users={"gw": "pw"}, permissions=permissions) as running:
        yield running


@pytest.fixture(scope="module")
def registry_node(
    tansu: TansuBroker, registry: TestRegistry, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConsoleNode]:
    env = {
        **tansu.gateway_settings(),
        "GATEWAY_ADMIN_API_USERS": USERS,
        "GATEWAY_EXTERNAL_CONNECTION_PAYMENTS_SR_CONFIG_URL": registry.url,
        "GATEWAY_EXTERNAL_CONNECTION_PAYMENTS_SR_CONFIG_BASIC_AUTH_USERNAME": "gw",
        "GATEWAY_EXTERNAL_CONNECTION_PAYMENTS_SR_CONFIG_BASIC_AUTH_PASSWORD": "pw",
    }
    process = GatewayProcess(env, log_path=tmp_path_factory.mktemp("console-registry") / "gateway.log")
    process.start(timeout=30)
    try:
        yield ConsoleNode(process)
    finally:
        process.stop()


def test_avro_values_are_decoded_through_the_registry(
    registry_node: ConsoleNode, registry: TestRegistry, tansu: TansuBroker
) -> None:
    topic = f"payments-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})  # (kept: the future needs its client alive)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
    schema_id = register(registry.url, f"{topic}-value")
    producer = Producer({"bootstrap.servers": tansu.bootstrap, "linger.ms": 0})
    producer.produce(topic, b"\x00" + schema_id.to_bytes(4, "big") + avro({"id": 1, "country": "<FR>"}))
    header = [("__value_schema_id", b"\x00" + schema_id.to_bytes(4, "big"))]
    producer.produce(topic, avro({"id": 2, "country": "DE"}), headers=header)
    producer.produce(topic, b"\x00" + (schema_id + 999).to_bytes(4, "big") + b"\x02")  # an unknown schema
    assert producer.flush(10) == 0
    page = registry_node.session(ADMIN).get(f"/console/topics/{topic}", params={"mode": "offset", "offset": "0"}).text
    assert page.count('<span class="kind">schema registry PAYMENTS_SR</span>') >= 2
    assert "&#34;country&#34;: &#34;&lt;FR&gt;&#34;" in page  # decoded, and escaped
    assert "&#34;id&#34;: 2" in page and "&#34;country&#34;: &#34;DE&#34;" in page  # named by its header
    assert "could not decode it" in page  # the unknown schema id says why, the page still renders
