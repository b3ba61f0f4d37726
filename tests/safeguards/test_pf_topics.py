"""``read-only-topic``, ``topic-required-schema-id`` and ``header-removal`` in a gateway in front
of Tansu, with real clients: the error codes and messages they report, what reaches the broker
(read straight from it) and the audit events."""

from __future__ import annotations

import datetime
import struct
from typing import Any

import kafka
import kafka.errors
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)
from kanal_safeguards.decisions import PREFIX
from safeguard_clients import bootstrap_of, direct, safeguards_gateway, spec, through
from test_produce_fetch_policies import create_topics, events_of, poll_consumer, produce, stored, wait_for
from wire import WireClient

from kanal.api import ApiKey, build, nested, require_request_class
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway

pytestmark = pytest.mark.integration


def read_only_gateway(tansu: TansuBroker, topic: str, action: str = "BLOCK") -> Any:
    return safeguards_gateway(tansu, [spec("ro", "read-only-topic", {"topic": topic, "action": action})])


def error_of(future: Any) -> KafkaError:
    with pytest.raises(KafkaException) as caught:
        future.result(30)
    error: KafkaError = caught.value.args[0]
    return error


def raw_create_partitions(gateway: Gateway, topic: str, count: int) -> Any:
    cls = require_request_class(ApiKey.CREATE_PARTITIONS, 1)
    request = build(
        cls,
        topics=(build(nested(cls, "topics"), name=topic, count=count, assignments=None),),
        timeout=datetime.timedelta(seconds=15),
        validate_only=False,
    )
    client = WireClient(bootstrap_of(gateway))
    try:
        return client.call(request)
    finally:
        client.close()


# -- read-only-topic


def test_read_only_topic_refuses_produce(tansu: TansuBroker, unique_topic: Any) -> None:
    frozen, free = unique_topic("frozen"), unique_topic("free")
    create_topics(tansu, frozen, free)
    with read_only_gateway(tansu, ".*-frozen-.*") as gw:
        [refused] = produce(through(gw), frozen, [(b"no", None)])
        assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert produce(through(gw), free, [(b"yes", None)]) == [None]
        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap_of(gw))
        try:
            with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
                producer.send(frozen, b"kafka-python", partition=0).get(timeout=30)
        finally:
            producer.close()
        [event, _] = events_of(gw, "read-only-topic", 2)
    assert stored(tansu, frozen) == []
    assert [m.value() for m in stored(tansu, free)] == [b"yes"]
    assert event == {
        "plugin": "read-only-topic",
        "action": "BLOCK",
        "topic": frozen,
        "partition": 0,
        "api": "Produce",
        "reasons": [f"Topic '{frozen}' is read-only."],
    }


def test_read_only_topic_is_not_deleted_the_others_are(tansu: TansuBroker, unique_topic: Any) -> None:
    frozen, free = unique_topic("frozen"), unique_topic("free")
    create_topics(tansu, frozen, free)
    with read_only_gateway(tansu, ".*-frozen-.*") as gw:
        admin = AdminClient(through(gw))
        futures = admin.delete_topics([frozen, free], operation_timeout=15, request_timeout=30)
        assert error_of(futures[frozen]).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert futures[free].result(30) is None
        [event] = events_of(gw, "read-only-topic", 1)
    listed = AdminClient(direct(tansu))
    topics = wait_for(lambda: (t := listed.list_topics(timeout=15).topics) and free not in t and t)
    assert frozen in topics
    assert event["api"] == "DeleteTopics" and event["topics"] == [frozen]


def test_read_only_topic_refuses_config_partition_and_record_changes(tansu: TansuBroker, unique_topic: Any) -> None:
    frozen = unique_topic("frozen")
    create_topics(tansu, frozen)
    with read_only_gateway(tansu, frozen) as gw:
        admin = AdminClient(through(gw))
        resource = ConfigResource(
            ConfigResource.Type.TOPIC,
            frozen,
            incremental_configs=[ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)],
        )
        [altered] = admin.incremental_alter_configs([resource], request_timeout=30).values()
        assert error_of(altered).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        grown = raw_create_partitions(gw, frozen, 3)  # librdkafka will not: Tansu lacks CreatePartitions
        assert [(r.name, r.error_code) for r in grown.results] == [(frozen, KafkaError.TOPIC_AUTHORIZATION_FAILED)]
        assert grown.results[0].error_message == f"{PREFIX} Topic '{frozen}' is read-only."
        [deleted] = admin.delete_records([TopicPartition(frozen, 0, 0)], request_timeout=30).values()
        assert error_of(deleted).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        events = events_of(gw, "read-only-topic", 3)
    assert [e["api"] for e in events] == ["IncrementalAlterConfigs", "CreatePartitions", "DeleteRecords"]
    assert {e["action"] for e in events} == {"BLOCK"}


def test_read_only_info_lets_writes_through(tansu: TansuBroker, unique_topic: Any) -> None:
    topic = unique_topic()
    create_topics(tansu, topic)
    with read_only_gateway(tansu, topic, action="INFO") as gw:
        assert produce(through(gw), topic, [(b"allowed", None)]) == [None]
        [event] = events_of(gw, "read-only-topic", 1)
    assert [m.value() for m in stored(tansu, topic)] == [b"allowed"]
    assert event["action"] == "INFO" and event["reasons"] == [f"Topic '{topic}' is read-only."]


# -- topic-required-schema-id


def framed(schema_id: int, payload: bytes) -> bytes:
    """A value in the Confluent wire format."""
    return b"\0" + struct.pack(">i", schema_id) + payload


def test_schema_id_required(tansu: TansuBroker, unique_topic: Any) -> None:
    topic = unique_topic()
    create_topics(tansu, topic)
    config = {"topic": topic, "schemaIdRequired": True}
    with safeguards_gateway(tansu, [spec("sid", "topic-required-schema-id", config)]) as gw:
        [refused] = produce(through(gw), topic, [(b'{"plain": "json"}', None)])
        assert refused is not None and refused.code() == KafkaError.POLICY_VIOLATION
        assert produce(through(gw), topic, [(framed(7, b"avro"), None)]) == [None]
        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap_of(gw))
        try:
            with pytest.raises(kafka.errors.PolicyViolationError, match=f"{PREFIX} SchemaId is required.$"):
                producer.send(topic, b"kafka-python", partition=0).get(timeout=30)
        finally:
            producer.close()
        [event, _] = events_of(gw, "topic-required-schema-id", 2)
    assert [m.value() for m in stored(tansu, topic)] == [framed(7, b"avro")]
    assert event["action"] == "BLOCK" and event["topic"] == topic and event["reasons"] == ["SchemaId is required."]


def test_schema_id_not_allowed_and_info(tansu: TansuBroker, unique_topic: Any) -> None:
    strict, lenient = unique_topic("strict"), unique_topic("lenient")
    create_topics(tansu, strict, lenient)
    with safeguards_gateway(
        tansu,
        [
            spec("strict", "topic-required-schema-id", {"topic": strict, "schemaIdRequired": False}),
            spec("lenient", "topic-required-schema-id", {"topic": lenient, "schemaIdRequired": True, "action": "INFO"}),
        ],
    ) as gw:
        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap_of(gw))
        try:
            with pytest.raises(kafka.errors.PolicyViolationError, match=f"{PREFIX} SchemaId is not allowed.$"):
                producer.send(strict, framed(1, b"x"), partition=0).get(timeout=30)
        finally:
            producer.close()
        assert produce(through(gw), strict, [(b"plain", None)]) == [None]
        assert produce(through(gw), lenient, [(b"plain too", None)]) == [None]
        events = events_of(gw, "topic-required-schema-id", 2)
    assert [m.value() for m in stored(tansu, strict)] == [b"plain"]
    assert [m.value() for m in stored(tansu, lenient)] == [b"plain too"]
    assert [(e["action"], e["reasons"]) for e in events] == [
        ("BLOCK", ["SchemaId is not allowed."]),
        ("INFO", ["SchemaId is required."]),
    ]


# -- header-removal


def test_header_removal_strips_matching_headers_on_fetch(tansu: TansuBroker, unique_topic: Any) -> None:
    topic, other = unique_topic(), unique_topic("other")
    create_topics(tansu, topic, other)
    headers = [("trace-id", b"1"), ("internal.secret", b"s"), ("internal.route", b"r"), ("keep.internal", b"k")]
    for name in (topic, other):
        assert produce(direct(tansu), name, [(b"v1", headers), (b"v2", [("internal.x", b"x")])]) == [None, None]
    config = {"topic": topic, "headerKeyRegex": "internal\\..*"}
    with safeguards_gateway(tansu, [spec("strip", "header-removal", config, priority=1000)]) as gw:
        got = poll_consumer(through(gw), topic, lambda polled: len(polled) >= 2)
        untouched = poll_consumer(through(gw), other, lambda polled: len(polled) >= 2)
    assert [(m.value(), m.headers()) for m in got] == [
        (b"v1", [("trace-id", b"1"), ("keep.internal", b"k")]),
        (b"v2", None),
    ]
    assert [m.headers() for m in untouched] == [headers, [("internal.x", b"x")]]
    assert [m.headers() for m in stored(tansu, topic)] == [headers, [("internal.x", b"x")]]
