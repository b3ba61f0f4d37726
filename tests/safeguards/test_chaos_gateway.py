"""The chaos interceptors through a real gateway in front of Tansu, with confluent-kafka clients
and raw requests (librdkafka retries what fails, so raw requests show the error codes themselves).
What is stored is always read from the broker directly. Nothing sleeps: tests wait for conditions.
"""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from kanal_safeguards.chaos.common import INJECTIONS_METRIC
from safeguard_clients import audit_events, bootstrap_of, direct, safeguards_gateway, spec, through, wait_for
from wire import WireClient, metadata_request, produce_request

from kanal.api import ErrorCode, build, nested, require_request_class
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway

METRIC = INJECTIONS_METRIC + "_total"
LEADER_ERRORS = {
    int(ErrorCode.leader_not_available),
    int(ErrorCode.not_leader_or_follower),
    int(ErrorCode.broker_not_available),
}


@pytest.fixture
def topic(tansu: TansuBroker) -> Iterator[str]:
    name = f"chaos-{uuid.uuid4().hex[:10]}"
    admin = AdminClient(direct(tansu))
    for future in admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)]).values():
        future.result(30)
    yield name


def produce(config: dict[str, Any], topic: str, values: list[bytes], **extra: Any) -> list[Any]:
    """Produces ``values`` to partition 0, one by one in order; answers the delivery errors (None
    for a delivered record), in order."""
    producer = Producer({**config, "linger.ms": 0, "message.timeout.ms": 60_000, **extra})
    reports: list[Any] = []
    for value in values:
        producer.produce(topic, value, partition=0, on_delivery=lambda err, _msg: reports.append(err))
        producer.flush(60)
    assert len(reports) == len(values)
    return reports


def consume(config: dict[str, Any], topic: str, records: int) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every message of partition 0 from the start, until the consumer reached
    the end of the partition after seeing ``records`` distinct offsets."""
    consumer = Consumer(
        {
            **config,
            "group.id": f"chaos-{uuid.uuid4().hex[:8]}",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got: list[tuple[int, bytes | None]] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF and len({o for o, _ in got}) >= records:
                    return got
                continue
            got.append((int(message.offset() or 0), message.value()))
    finally:
        consumer.close()
    raise AssertionError(f"did not read {records} records: {got}")


def raw_fetch(gateway: Gateway, topic: str) -> Any:
    cls = require_request_class(1, 12)
    topic_cls = nested(cls, "topics")
    part_cls = nested(topic_cls, "partitions")
    partition = build(part_cls, partition=0, current_leader_epoch=-1, fetch_offset=0, partition_max_bytes=1 << 20)
    request = build(
        cls,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=100),
        min_bytes=1,
        max_bytes=1 << 20,
        session_epoch=-1,
        topics=(build(topic_cls, topic=topic, partitions=(partition,)),),
    )
    return call(gateway, request)


def call(gateway: Gateway, request: Any) -> Any:
    client = WireClient(bootstrap_of(gateway), timeout=30)
    try:
        return client.call(request)
    finally:
        client.close()


def fetch_code(response: Any) -> int:
    [t] = response.responses
    [p] = t.partitions
    return int(p.error_code)


def produce_code(response: Any) -> int:
    [t] = response.responses
    [p] = t.partition_responses
    return int(p.error_code)


def injections(gateway: Gateway, plugin: str) -> float:
    return gateway.metrics.registry.get_sample_value(METRIC, {"plugin": plugin}) or 0.0


VALUES = [b"v-%d" % n for n in range(5)]


# -- chaos-broken-brokers --------------------------------------------------------------------------


def test_broken_brokers_fail_every_produce_and_fetch_with_the_default_errors(tansu: TansuBroker, topic: str) -> None:
    produce(direct(tansu), topic, [b"stored"])
    config = {"rateInPercent": 100}
    with safeguards_gateway(tansu, [spec("broken", "chaos-broken-brokers", config)]) as gateway:
        errors = produce(through(gateway), topic, VALUES, retries=0)
        assert [e.code() for e in errors] == [int(ErrorCode.corrupt_message)] * len(VALUES)
        assert all(fetch_code(raw_fetch(gateway, topic)) == int(ErrorCode.unknown_server_error) for _ in range(3))
        assert injections(gateway, "chaos-broken-brokers") >= len(VALUES) + 3
        [event] = wait_for(lambda: audit_events(gateway))  # one event, not one per injection
        assert (event["eventData"]["plugin"], event["eventData"]["action"]) == ("chaos-broken-brokers", "CHAOS")
    assert consume(direct(tansu), topic, 1) == [(0, b"stored")]  # nothing of the failed produce was written


def test_broken_brokers_answer_the_errors_of_error_map(tansu: TansuBroker, topic: str) -> None:
    produce(direct(tansu), topic, [b"stored"])
    config = {"rateInPercent": 100, "errorMap": {"PRODUCE": "INVALID_RECORD", "FETCH": "OFFSET_OUT_OF_RANGE"}}
    with safeguards_gateway(tansu, [spec("broken", "chaos-broken-brokers", config)]) as gateway:
        errors = produce(through(gateway), topic, [b"x"], retries=0)
        assert [e.code() for e in errors] == [KafkaError.INVALID_RECORD]
        assert fetch_code(raw_fetch(gateway, topic)) == int(ErrorCode.offset_out_of_range)
        assert produce_code(call(gateway, produce_request(topic, -1, [b"raw"]))) == int(ErrorCode.invalid_record)


def test_nothing_is_injected_at_rate_0(tansu: TansuBroker, topic: str) -> None:
    interceptors = [
        spec("broken", "chaos-broken-brokers", {"rateInPercent": 0}),
        spec("leaders", "chaos-leader-election-errors", {"rateInPercent": 0}),
        spec("duplicates", "chaos-duplicate-messages", {"rateInPercent": 0}),
        spec("corruption", "chaos-message-corruption", {"rateInPercent": 0}),
    ]
    with safeguards_gateway(tansu, interceptors) as gateway:
        assert produce(through(gateway), topic, VALUES) == [None] * len(VALUES)
        assert consume(through(gateway), topic, len(VALUES)) == list(enumerate(VALUES))
        assert audit_events(gateway) == []
    assert consume(direct(tansu), topic, len(VALUES)) == list(enumerate(VALUES))


# -- chaos-leader-election-errors ------------------------------------------------------------------


def test_leader_election_errors_are_answered_and_clients_retry_through_them(tansu: TansuBroker, topic: str) -> None:
    always = [spec("leaders", "chaos-leader-election-errors", {"rateInPercent": 100, "seed": 1})]
    with safeguards_gateway(tansu, always) as gateway:
        codes = {produce_code(call(gateway, produce_request(topic, -1, [b"raw"]))) for _ in range(12)}
        codes |= {fetch_code(raw_fetch(gateway, topic)) for _ in range(12)}
        assert codes == LEADER_ERRORS
    half = [spec("leaders", "chaos-leader-election-errors", {"rateInPercent": 50, "seed": 2})]
    with safeguards_gateway(tansu, half) as gateway:
        assert produce(through(gateway), topic, VALUES) == [None] * len(VALUES)  # every record delivered
        assert injections(gateway, "chaos-leader-election-errors") > 0  # after retries
    assert consume(direct(tansu), topic, len(VALUES)) == list(enumerate(VALUES))  # each written once


# -- records ---------------------------------------------------------------------------------------


def test_consumers_see_duplicates_the_broker_does_not_store(tansu: TansuBroker, topic: str) -> None:
    produce(direct(tansu), topic, VALUES)
    with safeguards_gateway(tansu, [spec("dup", "chaos-duplicate-messages", {"topic": topic})]) as gateway:
        seen = consume(through(gateway), topic, len(VALUES))
        assert sorted(seen) == sorted([*enumerate(VALUES), *enumerate(VALUES)])
    assert consume(direct(tansu), topic, len(VALUES)) == list(enumerate(VALUES))


def test_produced_duplicates_are_written_twice(tansu: TansuBroker, topic: str) -> None:
    config = {"topic": topic, "target": "PRODUCE"}
    with safeguards_gateway(tansu, [spec("dup", "chaos-duplicate-messages", config)]) as gateway:
        assert produce(through(gateway), topic, VALUES) == [None] * len(VALUES)
    stored = consume(direct(tansu), topic, 2 * len(VALUES))
    assert [v for _, v in stored] == [v for value in VALUES for v in (value, value)]


def test_corrupted_values_carry_size_in_bytes_more_bytes(tansu: TansuBroker, topic: str) -> None:
    produce(direct(tansu), topic, VALUES)
    config = {"topic": topic, "sizeInBytes": 6}
    with safeguards_gateway(tansu, [spec("corrupt", "chaos-message-corruption", config)]) as gateway:
        seen = consume(through(gateway), topic, len(VALUES))
    for (offset, value), want in zip(seen, VALUES, strict=True):
        assert value is not None and value[: len(want)] == want and len(value) == len(want) + 6, offset
    assert consume(direct(tansu), topic, len(VALUES)) == list(enumerate(VALUES))  # stored as produced

    produced = {"topic": topic, "sizeInBytes": 3, "target": "PRODUCE"}
    with safeguards_gateway(tansu, [spec("corrupt", "chaos-message-corruption", produced)]) as gateway:
        produce(through(gateway), topic, [b"written"])
    [(_, stored)] = consume(direct(tansu), topic, len(VALUES) + 1)[len(VALUES) :]
    assert stored is not None and stored.startswith(b"written") and len(stored) == len(b"written") + 3


def test_invalid_schema_ids_replace_the_four_id_bytes(tansu: TansuBroker, topic: str) -> None:
    framed = b"\x00" + (12).to_bytes(4, "big") + b"payload"
    config = {"topic": topic, "target": "PRODUCE", "invalidSchemaId": 999}
    with safeguards_gateway(tansu, [spec("schema", "chaos-invalid-schema-id", config)]) as gateway:
        produce(through(gateway), topic, [framed, b"plain"])
    stored = [v for _, v in consume(direct(tansu), topic, 2)]
    assert stored == [b"\x00" + (999).to_bytes(4, "big") + b"payload", b"plain"]

    with safeguards_gateway(tansu, [spec("schema", "chaos-invalid-schema-id", {"seed": 4})]) as gateway:
        [(_, value), (_, plain)] = consume(through(gateway), topic, 2)
    assert plain == b"plain"
    assert value is not None and value[0] == 0 and value[5:] == b"payload"
    assert int.from_bytes(value[1:5], "big") != 999  # a random id, not the one stored


# -- latency ---------------------------------------------------------------------------------------


def test_latency_delays_the_answer_by_at_least_latency_ms(tansu: TansuBroker) -> None:
    """A lower bound: the answer cannot come before the gateway waited latencyMs."""
    config = {"appliedPercentage": 100, "latencyMs": 400}
    with safeguards_gateway(tansu, [spec("latency", "chaos-latency", config)]) as gateway:
        client = WireClient(bootstrap_of(gateway), timeout=30)
        try:
            for n in range(1, 4):
                start = time.monotonic()
                answer = client.call(metadata_request(), correlation_id=n)
                assert time.monotonic() - start >= 0.4
                assert answer.brokers  # the broker's answer, late
        finally:
            client.close()
        assert injections(gateway, "chaos-latency") == 3


def test_slow_producers_consumers_delay_produce_of_matching_topics(tansu: TansuBroker, topic: str) -> None:
    config = {"rateInPercent": 100, "minLatencyMs": 300, "maxLatencyMs": 500, "topic": topic}
    with safeguards_gateway(tansu, [spec("slow", "chaos-slow-producers-consumers", config)]) as gateway:
        start = time.monotonic()
        assert produce_code(call(gateway, produce_request(topic, -1, [b"late"]))) == 0
        assert time.monotonic() - start >= 0.3
        call(gateway, metadata_request([topic]))
        assert injections(gateway, "chaos-slow-producers-consumers") == 1  # Metadata is not delayed
