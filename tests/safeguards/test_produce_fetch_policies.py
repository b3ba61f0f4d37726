"""``produce-policy`` and ``fetch-policy`` in a gateway in front of Tansu, with real clients: what
confluent-kafka and kafka-python report for each rule and action, what reaches the broker (read
straight from it), the audit events, and ``throttle_time`` on THROTTLE (read with raw requests,
since the clients do not show it)."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Sequence
from typing import Any

import kafka
import kafka.errors
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition
from kanal_safeguards.decisions import PREFIX
from safeguard_clients import (
    audit_events,
    bootstrap_of,
    create_topics,
    direct,
    read_to_end,
    safeguards_gateway,
    spec,
    through,
    wait_for,
)
from wire import WireClient, produce_request

from kanal.api import build, nested, require_request_class
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway

pytestmark = pytest.mark.integration

Headers = list[tuple[str, bytes]]


# -- helpers shared with the test_pf_* modules


def stored(tansu: TansuBroker, topic: str, partition: int = 0) -> list[Message]:
    """Every record of the partition, read from the broker itself (up to its end)."""
    return read_to_end(direct(tansu), topic, partition)


def produce(
    config: dict[str, Any], topic: str, records: Sequence[tuple[bytes, Headers | None]], **settings: Any
) -> list[KafkaError | None]:
    """Produces ``records`` (value, headers) to partition 0; the delivery report of each."""
    producer = Producer({**config, "linger.ms": 0, **settings})
    reports: list[KafkaError | None] = []
    for value, headers in records:
        producer.produce(topic, value, partition=0, headers=headers, on_delivery=lambda e, _: reports.append(e))
    assert producer.flush(30) == 0
    return reports


def events_of(gateway: Gateway, plugin: str, count: int) -> list[dict[str, Any]]:
    """The first ``count`` SAFEGUARD events of ``plugin`` (their ``eventData``), once written."""

    def found() -> list[dict[str, Any]]:
        data = [e["eventData"] for e in audit_events(gateway) if e["eventData"].get("plugin") == plugin]
        return data if len(data) >= count else []

    return list(wait_for(found)[:count])


def raw_produce(gateway: Gateway, topic: str, acks: int = -1) -> Any:
    """A Produce v9 request of two records without headers, answered."""
    client = WireClient(bootstrap_of(gateway))
    try:
        return client.call(produce_request(topic, acks, [b"a", b"b"]))
    finally:
        client.close()


def raw_fetch(gateway: Gateway, topic: str, *, isolation: int = 1, max_wait_ms: int = 100, version: int = 12) -> Any:
    """A Fetch of partition 0 from offset 0, answered."""
    cls = require_request_class(1, version)
    topic_cls = nested(cls, "topics")
    part_cls = nested(topic_cls, "partitions")
    partition = build(part_cls, partition=0, current_leader_epoch=-1, fetch_offset=0, partition_max_bytes=1 << 20)
    request = build(
        cls,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=isolation,
        session_epoch=-1,
        topics=(build(topic_cls, topic=topic, partitions=(partition,)),),
    )
    client = WireClient(bootstrap_of(gateway))
    try:
        return client.call(request)
    finally:
        client.close()


def produce_gateway(tansu: TansuBroker, config: dict[str, Any]) -> Any:
    return safeguards_gateway(tansu, [spec("produce", "produce-policy", config)])


def fetch_gateway(tansu: TansuBroker, config: dict[str, Any]) -> Any:
    return safeguards_gateway(tansu, [spec("fetch", "fetch-policy", config)])


# -- produce-policy


def test_headers_required_fails_only_the_partitions_at_fault(tansu: TansuBroker, unique_topic: Any) -> None:
    guarded, other = unique_topic("guarded"), unique_topic("other")
    create_topics(tansu, guarded, other)
    config = {"topic": ".*guarded.*", "recordHeaderRequired": {"value": True}}
    with produce_gateway(tansu, config) as gw:
        refused = produce(through(gw), guarded, [(b"bare", None)])
        assert len(refused) == 1 and refused[0] is not None
        assert refused[0].code() == KafkaError.POLICY_VIOLATION  # librdkafka drops the message: see below
        assert produce(through(gw), guarded, [(b"dressed", [("origin", b"test")])]) == [None]
        assert produce(through(gw), other, [(b"bare", None)]) == [None]  # another topic: no rule
        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap_of(gw))
        try:
            with pytest.raises(kafka.errors.PolicyViolationError, match=f"{PREFIX} Headers are required$"):
                producer.send(guarded, b"kafka-python", partition=0).get(timeout=30)
        finally:
            producer.close()
        response = raw_produce(gw, guarded)
        [event, *_] = events_of(gw, "produce-policy", 3)
    [partition] = response.responses[0].partition_responses
    assert (partition.error_code, partition.error_message) == (44, f"{PREFIX} Headers are required")
    assert [m.value() for m in stored(tansu, guarded)] == [b"dressed"]
    assert [m.value() for m in stored(tansu, other)] == [b"bare"]
    assert event["action"] == "BLOCK" and event["topic"] == guarded and event["reasons"] == ["Headers are required"]


def test_compressions_block_with_both_clients(tansu: TansuBroker, unique_topic: Any) -> None:
    topic = unique_topic()
    create_topics(tansu, topic)
    with produce_gateway(tansu, {"compressions": {"values": ["NONE", "LZ4"]}}) as gw:
        zipped = b"compressible " * 100  # librdkafka sends a batch that does not shrink uncompressed
        [refused] = produce(through(gw), topic, [(zipped, None)], **{"compression.type": "gzip"})
        assert refused is not None and refused.code() == KafkaError.POLICY_VIOLATION
        assert produce(through(gw), topic, [(zipped, None)], **{"compression.type": "lz4"}) == [None]
        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap_of(gw), compression_type="gzip")
        try:
            with pytest.raises(
                kafka.errors.PolicyViolationError,
                match=rf"{PREFIX} compression is 'GZIP', must be one of \[NONE, LZ4\]$",
            ):
                producer.send(topic, zipped, partition=0).get(timeout=30)
        finally:
            producer.close()
        [_, event] = events_of(gw, "produce-policy", 2)
    assert [m.value() for m in stored(tansu, topic)] == [zipped]
    assert event["reasons"] == ["compression is 'GZIP', must be one of [NONE, LZ4]"]


def test_acks_rejects_the_request(tansu: TansuBroker, unique_topic: Any) -> None:
    topic = unique_topic()
    create_topics(tansu, topic)
    with produce_gateway(tansu, {"acks": {"value": -1}}) as gw:
        [refused] = produce(through(gw), topic, [(b"acks-1", None)], acks=1)
        assert refused is not None and refused.code() == KafkaError.POLICY_VIOLATION
        assert produce(through(gw), topic, [(b"acks-all", None)], acks="all") == [None]
        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap_of(gw), acks=1)
        try:
            with pytest.raises(kafka.errors.PolicyViolationError, match=f"{PREFIX} acks is '1', must be '-1'$"):
                producer.send(topic, b"kafka-python acks=1", partition=0).get(timeout=30)
        finally:
            producer.close()
        events = events_of(gw, "produce-policy", 2)
    assert [m.value() for m in stored(tansu, topic)] == [b"acks-all"]
    assert events[0]["topics"] == [topic] and events[0]["reasons"] == ["acks is '1', must be '-1'"]


def test_version_range_rejects_older_produce_requests(tansu: TansuBroker, unique_topic: Any) -> None:
    topic = unique_topic()
    create_topics(tansu, topic)
    with produce_gateway(tansu, {"version": {"min": 10}}) as gw:
        response = raw_produce(gw, topic)  # v9
        [event] = events_of(gw, "produce-policy", 1)
    [partition] = response.responses[0].partition_responses
    assert partition.error_code == KafkaError.POLICY_VIOLATION
    assert partition.error_message == f"{PREFIX} version is '9', must not be less than '10'"
    assert stored(tansu, topic) == []
    assert event["action"] == "BLOCK" and event["apiVersion"] == 9


def test_idempotence_and_transactions_required(tansu: TansuBroker, unique_topic: Any) -> None:
    idempotent, transactional = unique_topic("idem"), unique_topic("txn")
    create_topics(tansu, idempotent, transactional)
    with safeguards_gateway(
        tansu,
        [
            spec("idem", "produce-policy", {"topic": ".*-idem-.*", "idempotenceRequired": {"value": True}}),
            spec("txn", "produce-policy", {"topic": ".*-txn-.*", "transactionRequired": {"value": True}}),
        ],
    ) as gw:
        [refused] = produce(through(gw), idempotent, [(b"plain", None)])
        assert refused is not None and refused.code() == KafkaError.POLICY_VIOLATION
        assert produce(through(gw), idempotent, [(b"idempotent", None)], **{"enable.idempotence": True}) == [None]
        [refused] = produce(through(gw), transactional, [(b"plain", None)])
        assert refused is not None and refused.code() == KafkaError.POLICY_VIOLATION
        producer = Producer({**through(gw), "transactional.id": transactional})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(transactional, b"in a transaction", partition=0)
        producer.commit_transaction(30)
    assert [m.value() for m in stored(tansu, idempotent)] == [b"idempotent"]
    assert b"in a transaction" in [m.value() for m in stored(tansu, transactional)]
    assert b"plain" not in [m.value() for m in stored(tansu, transactional)]


def test_info_lets_the_records_through_and_audits(tansu: TansuBroker, unique_topic: Any) -> None:
    topic = unique_topic()
    create_topics(tansu, topic)
    config = {"recordHeaderRequired": {"value": True, "action": "INFO"}, "acks": {"value": -1, "action": "INFO"}}
    with produce_gateway(tansu, config) as gw:
        assert produce(through(gw), topic, [(b"bare", None)], acks=1) == [None]
        events = events_of(gw, "produce-policy", 2)
    assert [m.value() for m in stored(tansu, topic)] == [b"bare"]
    assert sorted((e["action"], tuple(e["reasons"])) for e in events) == [
        ("INFO", ("Headers are required",)),
        ("INFO", ("acks is '1', must be '-1'",)),
    ]


def test_throttle_sets_throttle_time_and_writes(tansu: TansuBroker, unique_topic: Any) -> None:
    topic = unique_topic()
    create_topics(tansu, topic)
    config = {"recordHeaderRequired": {"value": True, "action": "THROTTLE"}, "throttleTimeMs": 250}
    with produce_gateway(tansu, config) as gw:
        response = raw_produce(gw, topic)
        assert produce(through(gw), topic, [(b"client", None)]) == [None]  # the client waits, then goes on
        [event, _] = events_of(gw, "produce-policy", 2)
    assert response.throttle_time == datetime.timedelta(milliseconds=250)
    assert [p.error_code for p in response.responses[0].partition_responses] == [0]
    assert [m.value() for m in stored(tansu, topic)] == [b"a", b"b", b"client"]
    assert event["action"] == "THROTTLE"


def test_a_compliant_request_is_not_throttled(tansu: TansuBroker, unique_topic: Any) -> None:
    topic = unique_topic()
    create_topics(tansu, topic)
    with produce_gateway(tansu, {"acks": {"value": -1, "action": "THROTTLE"}}) as gw:
        response = raw_produce(gw, topic, acks=-1)
        assert audit_events(gw) == []
    assert response.throttle_time == datetime.timedelta(0)


# -- fetch-policy


def poll_until(consumer: Consumer, done: Callable[[list[Message]], bool]) -> list[Message]:
    """What ``consumer`` polls (messages and errors) until ``done`` of them."""
    polled: list[Message] = []
    deadline = time.monotonic() + 30
    while not done(polled):
        assert time.monotonic() < deadline, [m.error() or m.value() for m in polled]
        message = consumer.poll(0.2)
        if message is not None:
            polled.append(message)
    return polled


def poll_consumer(config: dict[str, Any], topic: str, done: Callable[[list[Message]], bool]) -> list[Message]:
    """Messages and errors polled from the start of partition 0 until ``done``."""
    consumer = Consumer({**config, "group.id": "pf", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    try:
        return poll_until(consumer, done)
    finally:
        consumer.close()


def refusals(gateway: Gateway) -> int:
    return sum(1 for e in audit_events(gateway) if e["eventData"].get("action") == "BLOCK")


def test_isolation_level_blocks_fetches(tansu: TansuBroker, unique_topic: Any) -> None:
    topic = unique_topic()
    create_topics(tansu, topic)
    assert produce(direct(tansu), topic, [(b"one", None), (b"two", None)]) == [None, None]
    with fetch_gateway(tansu, {"topic": topic, "isolationLevel": {"value": "read_committed"}}) as gw:
        response = raw_fetch(gw, topic, isolation=0)
        [partition] = response.responses[0].partitions
        assert partition.error_code == KafkaError.POLICY_VIOLATION and partition.records is None

        # librdkafka logs the error, backs off and fetches again: each attempt is refused and audited
        consumer = Consumer(
            {**through(gw), "group.id": "pf", "isolation.level": "read_uncommitted", "enable.auto.commit": False}
        )
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        try:
            polled = poll_until(consumer, lambda _: refusals(gw) >= 3)
        finally:
            consumer.close()
        assert [m.value() for m in polled if m.error() is None] == []

        def both(polled: list[Message]) -> bool:
            return len([m for m in polled if m.error() is None]) >= 2

        committed = poll_consumer(through(gw, **{"isolation.level": "read_committed"}), topic, both)
        assert [m.value() for m in committed if m.error() is None] == [b"one", b"two"]
        event = events_of(gw, "fetch-policy", 1)[0]
    assert event["action"] == "BLOCK" and event["topics"] == [topic]
    assert event["reasons"] == ["isolationLevel is 'read_uncommitted', must be 'read_committed'"]


def test_fetch_ranges_rack_id_and_version(tansu: TansuBroker, unique_topic: Any) -> None:
    topic = unique_topic()
    create_topics(tansu, topic)
    config = {"maxWaitMs": {"max": 1000}, "rackIdRequired": {"value": True}, "version": {"max": 11}}
    with fetch_gateway(tansu, config) as gw:
        response = raw_fetch(gw, topic, max_wait_ms=5000, version=12)
        [event] = events_of(gw, "fetch-policy", 1)
    assert response.responses[0].partitions[0].error_code == KafkaError.POLICY_VIOLATION
    assert event["reasons"] == [
        "rackId is required",
        "maxWaitMs is '5000', must not be greater than '1000'",
        "version is '12', must not be greater than '11'",
    ]


def test_fetch_rules_for_other_topics_do_not_apply(tansu: TansuBroker, unique_topic: Any) -> None:
    topic = unique_topic()
    create_topics(tansu, topic)
    assert produce(direct(tansu), topic, [(b"free", None)]) == [None]
    with fetch_gateway(tansu, {"topic": "guarded-.*", "isolationLevel": {"value": "read_committed"}}) as gw:
        response = raw_fetch(gw, topic, isolation=0)
        assert audit_events(gw) == []
    assert response.responses[0].partitions[0].error_code == 0


def test_fetch_info_and_throttle(tansu: TansuBroker, unique_topic: Any) -> None:
    topic = unique_topic()
    create_topics(tansu, topic)
    assert produce(direct(tansu), topic, [(b"kept", None)]) == [None]
    with safeguards_gateway(
        tansu,
        [
            spec("info", "fetch-policy", {"fetchMinBytes": {"min": 10, "action": "INFO"}}),
            spec("slow", "fetch-policy", {"isolationLevel": {"value": "read_committed", "action": "THROTTLE"}}),
        ],
    ) as gw:
        response = raw_fetch(gw, topic, isolation=0)
        consumed = poll_consumer(
            through(gw, **{"isolation.level": "read_uncommitted"}),
            topic,
            lambda polled: any(m.error() is None for m in polled),
        )
        events = events_of(gw, "fetch-policy", 2)
    [partition] = response.responses[0].partitions
    assert partition.error_code == 0 and partition.records is not None
    assert response.throttle_time == datetime.timedelta(milliseconds=100)
    assert [m.value() for m in consumed if m.error() is None] == [b"kept"]
    assert sorted(e["action"] for e in events) == ["INFO", "THROTTLE"]
    info = next(e for e in events if e["action"] == "INFO")
    assert info["reasons"] == ["fetchMinBytes is '1', must not be less than '10'"]
