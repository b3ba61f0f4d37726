"""End to end: the installed plugin in a real gateway, real producers, records read back from the broker.

Given a Tansu broker and ``python -m kanal run --config kanal.yaml`` in front of it, with two
contrib-header-injection interceptors configured (one keeping existing headers, one overriding ``x-env``),
when confluent-kafka and kafka-python produce through the gateway, then a consumer reading the
broker directly sees every record with the injected headers, and with the same partition, key,
value, timestamp and other headers as sent. Records of topics the ``topics`` regexes do not
select arrive exactly as sent.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from header_injection_helpers import running_gateway, write_config
from kanal.embedded import GatewayProcess, TansuBroker, gateway_env

pytestmark = pytest.mark.integration

PARTITIONS = 3
RECORDS = 30
TIMEOUT = 20.0
BASE_TS = int(time.time() * 1000) - 3_600_000  # an hour ago: explicit, distinct from log-append time

Headers = list[tuple[str, bytes | None]]

INTERCEPTORS: list[dict[str, Any]] = [
    {
        "name": "add-origin",
        "plugin": "contrib-header-injection",
        "priority": 100,
        "scope": {},
        "config": {
            "headers": {
                "x-origin": "kanal-gateway",
                "x-client": "{{clientId}}",
                "x-from": "{{clientAddress}}",
                "x-where": "{{topic}}/{{partition}}",
            },
            "topics": ["hi-.*"],
        },
    },
    {
        "name": "force-env",
        "plugin": "contrib-header-injection",
        "priority": 200,
        "config": {"headers": {"x-env": "prod"}, "topics": ["hi-.*"], "overrideIfExists": True},
    },
]


@dataclass(frozen=True)
class Sent:
    partition: int
    key: bytes
    value: bytes | None
    headers: Headers
    timestamp: int


def outgoing() -> list[Sent]:
    """Records with and without headers, some already carrying x-origin or x-env, a null value."""
    out = []
    for i in range(RECORDS):
        headers: Headers = []
        if i % 2:
            headers.append(("trace", f"trace-{i}".encode()))
        if i % 5 == 0:
            headers.append(("x-origin", b"producer"))
        if i % 3 == 0:
            headers += [("x-env", b"dev"), ("empty", b""), ("x-env", b"staging")]
        value = None if i == 7 else f"value-{i}".encode() * (1 + i % 4)
        out.append(Sent(i % PARTITIONS, f"key-{i}".encode(), value, headers, BASE_TS + 1000 * i))
    return out


def expected_headers(sent: Sent, topic: str, client_id: str) -> list[tuple[str, Any]]:
    """What the two interceptors make of ``sent.headers``; x-from is matched as a pattern."""
    headers: list[tuple[str, Any]] = list(sent.headers)
    names = {k for k, _ in headers}
    extra: list[tuple[str, Any]] = [
        ("x-origin", b"kanal-gateway"),
        ("x-client", client_id.encode()),
        ("x-from", re.compile(rb"127\.0\.0\.1:\d+")),
        ("x-where", f"{topic}/{sent.partition}".encode()),
    ]
    headers += [h for h in extra if h[0] not in names]  # add-origin keeps what the producer set
    return [h for h in headers if h[0] != "x-env"] + [("x-env", b"prod")]  # force-env overrides


def headers_match(actual: Headers, expected: list[tuple[str, Any]]) -> bool:
    if [k for k, _ in actual] != [k for k, _ in expected]:
        return False
    return all(
        want.fullmatch(got or b"") if isinstance(want, re.Pattern) else got == want
        for (_, got), (_, want) in zip(actual, expected, strict=True)
    )


# -------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def gateway(tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("kanal")
    with running_gateway(tansu, write_config(directory, INTERCEPTORS), directory) as process:
        yield process


def create_topic(broker: TansuBroker, prefix: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
    futures[topic].result(TIMEOUT)
    return topic


@dataclass(frozen=True)
class Received:
    partition: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp: int


def consume_direct(broker: TansuBroker, topic: str, count: int) -> list[Received]:
    """Reads ``count`` records of ``topic`` from the broker itself (not through the gateway)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": f"hi-check-{uuid.uuid4().hex}", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        got: list[Received] = []
        deadline = time.monotonic() + TIMEOUT
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            partition, headers = msg.partition(), msg.headers()
            assert partition is not None and not isinstance(headers, dict)
            got.append(
                Received(
                    partition, msg.key(), msg.value(), [(k, _bytes(v)) for k, v in headers or []], msg.timestamp()[1]
                )
            )
        assert len(got) == count, f"read {len(got)} of {count} records of {topic} from the broker"
        return got
    finally:
        consumer.close()


def _bytes(value: str | bytes | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


# -------------------------------------------------------------------------------- producers


def produce_confluent(
    bootstrap: str, topic: str, records: list[Sent], client_id: str, codec: str, idempotent: bool = False
) -> None:
    from confluent_kafka import Producer

    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "compression.type": codec,
            "linger.ms": 20,
            "enable.idempotence": idempotent,
        }
    )
    for rec in records:
        producer.produce(
            topic,
            key=rec.key,
            value=rec.value,
            partition=rec.partition,
            headers=list(rec.headers),
            timestamp=rec.timestamp,
            on_delivery=on_delivery,
        )
    assert producer.flush(TIMEOUT) == 0, "confluent-kafka could not deliver every record"
    assert not errors, errors


def kafka_python_codecs() -> list[str]:
    from kafka import codec

    available = {
        "gzip": codec.has_gzip(),
        "snappy": codec.has_snappy(),
        "lz4": codec.has_lz4(),
        "zstd": codec.has_zstd(),
    }
    return ["none", *(name for name, present in available.items() if present)]


def produce_kafka_python(
    bootstrap: str, topic: str, records: list[Sent], client_id: str, codec: str, idempotent: bool = False
) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        compression_type=None if codec == "none" else codec,
        linger_ms=20,
        acks="all",
        enable_idempotence=idempotent,
    )
    try:
        futures = [
            producer.send(
                topic,
                key=rec.key,
                value=rec.value,
                partition=rec.partition,
                headers=rec.headers,
                timestamp_ms=rec.timestamp,
            )
            for rec in records
        ]
        producer.flush(TIMEOUT)
        for future in futures:
            future.get(TIMEOUT)
    finally:
        producer.close(timeout=TIMEOUT)


PRODUCERS = {"confluent": produce_confluent, "kafka-python": produce_kafka_python}
CASES = [("confluent", c) for c in ("none", "gzip", "snappy", "lz4", "zstd")] + [
    ("kafka-python", c) for c in kafka_python_codecs()
]
IDS = [f"{client}-{codec}" for client, codec in CASES]


# -------------------------------------------------------------------------------- tests


def sort_key(rec: Sent | Received) -> tuple[int, int]:
    return rec.partition, rec.timestamp


@pytest.mark.parametrize(("client", "codec"), CASES, ids=IDS)
def test_headers_arrive_and_records_are_otherwise_unchanged(
    client: str, codec: str, tansu: TansuBroker, gateway: GatewayProcess
) -> None:
    check_roundtrip(client, codec, False, tansu, gateway)


@pytest.mark.parametrize("client", sorted(PRODUCERS))
def test_idempotent_producers(client: str, tansu: TansuBroker, gateway: GatewayProcess) -> None:
    """Re-encoded batches keep producer id, epoch and base sequence: the broker accepts them."""
    check_roundtrip(client, "lz4", True, tansu, gateway)


def check_roundtrip(client: str, codec: str, idempotent: bool, tansu: TansuBroker, gateway: GatewayProcess) -> None:
    topic = create_topic(tansu, f"hi-{client}-{codec}")
    client_id = f"hi-test-{client}"
    sent = outgoing()
    PRODUCERS[client](gateway.bootstrap, topic, sent, client_id, codec, idempotent)

    received = sorted(consume_direct(tansu, topic, len(sent)), key=sort_key)
    for want, got in zip(sorted(sent, key=sort_key), received, strict=True):
        assert (got.partition, got.key, got.value, got.timestamp) == (
            want.partition,
            want.key,
            want.value,
            want.timestamp,
        )
        expected = expected_headers(want, topic, client_id)
        assert headers_match(got.headers, expected), f"{got.key!r}: {got.headers} != {expected}"


@pytest.mark.parametrize("client", sorted(PRODUCERS))
def test_topics_not_selected_are_untouched(client: str, tansu: TansuBroker, gateway: GatewayProcess) -> None:
    topic = create_topic(tansu, f"other-{client}")  # "hi-.*" must match the whole name: no match
    sent = outgoing()
    PRODUCERS[client](gateway.bootstrap, topic, sent, f"hi-test-{client}", "none")

    received = sorted(consume_direct(tansu, topic, len(sent)), key=sort_key)
    assert received == [
        Received(r.partition, r.key, r.value, r.headers, r.timestamp) for r in sorted(sent, key=sort_key)
    ]


def test_bad_config_stops_the_gateway_with_the_interceptor_and_key(tansu: TansuBroker, tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        [
            {
                "name": "add-origin",
                "plugin": "contrib-header-injection",
                "config": {"headers": {"x-client": "{{clientID}}"}},
            }
        ],
    )
    proc = subprocess.run(
        [sys.executable, "-m", "kanal", "run", "--config", str(config)],
        env=gateway_env(tansu.gateway_settings()),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=os.getcwd(),
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        "interceptor 'add-origin' (contrib-header-injection): headers.x-client: unknown template variable"
        in proc.stderr
    )
