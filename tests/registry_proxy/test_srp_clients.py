"""confluent-kafka's SchemaRegistryClient, AvroSerializer and AvroDeserializer through the proxy.

confluent-kafka 2.16 serializers first ask ``GET /associations/resources/-/{topic}`` and fall back to
the topic name strategy only on a 404: that lookup goes through the proxy too.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from kanal_registry_proxy.testing.proxy import ProxyThread

from registry_proxy.srp_helpers import reactive

sr = pytest.importorskip("confluent_kafka.schema_registry")
avro = pytest.importorskip("confluent_kafka.schema_registry.avro")
serialization = pytest.importorskip("confluent_kafka.serialization")

ORDER = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "namespace": "com.acme",
        "fields": [{"name": "id", "type": "long"}, {"name": "note", "type": "string"}],
    }
)


def client(proxy: ProxyThread, user: str, password: str) -> object:
    return sr.SchemaRegistryClient({"url": proxy.url, "basic.auth.user.info": f"{user}:{password}"})


def test_serializer_and_deserializer_through_the_proxy(make_proxy: Callable[..., ProxyThread]) -> None:
    proxy = make_proxy()
    reactive(
        proxy,
        {
            "alice": [("LITERAL", "orders-value", ["Read", "Write"])],  # the producer
            "bob": [("PREFIXED", "orders-", ["Read"])],  # the consumer
        },
    )
    context = serialization.SerializationContext("orders", serialization.MessageField.VALUE)
    producer_client = client(proxy, "alice", "alice-pass")
    serializer = avro.AvroSerializer(producer_client, ORDER)
    payload = serializer({"id": 7, "note": "caf\u00e9"}, context)
    assert payload[0] == 0  # magic byte, then the schema id
    schema_id = int.from_bytes(payload[1:5], "big")

    consumer_client = client(proxy, "bob", "bob-pass")
    deserializer = avro.AvroDeserializer(consumer_client)
    assert deserializer(payload, context) == {"id": 7, "note": "caf\u00e9"}

    registered = consumer_client.get_schema(schema_id)  # type: ignore[attr-defined]
    assert json.loads(registered.schema_str)["name"] == "Order"
    latest = consumer_client.get_latest_version("orders-value")  # type: ignore[attr-defined]
    assert latest.schema_id == schema_id and latest.version == 1
    assert consumer_client.get_subjects() == ["orders-value"]  # type: ignore[attr-defined]
    assert consumer_client.get_versions("orders-value") == [1]  # type: ignore[attr-defined]
    assert producer_client.test_compatibility("orders-value", sr.Schema(ORDER, "AVRO"))  # type: ignore[attr-defined]


def test_denials_surface_as_client_errors(make_proxy: Callable[..., ProxyThread]) -> None:
    proxy = make_proxy()
    reactive(proxy, {"alice": [("LITERAL", "orders-value", ["Read", "Write"])]})
    context = serialization.SerializationContext("orders", serialization.MessageField.VALUE)
    payload = avro.AvroSerializer(client(proxy, "alice", "alice-pass"), ORDER)({"id": 1, "note": ""}, context)

    bob = client(proxy, "bob", "bob-pass")
    with pytest.raises(Exception, match=r"403|denied"):
        avro.AvroDeserializer(bob)(payload, context)
    with pytest.raises(Exception, match=r"403|denied"):
        avro.AvroSerializer(bob, ORDER)({"id": 1, "note": ""}, context)
    wrong = client(proxy, "alice", "nope")
    with pytest.raises(sr.SchemaRegistryError) as failure:
        wrong.get_subjects()  # type: ignore[attr-defined]
    assert failure.value.http_status_code == 401
    assert bob.get_subjects() == []  # type: ignore[attr-defined]
