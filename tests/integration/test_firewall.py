"""The protocol firewall (GATEWAY_FEATURE_FLAGS_VALIDATE_REQUESTS) in front of a real broker: a
malformed request closes that client's connection at the gateway, the broker never sees it, and
everyone else is still served. Raw sockets send mutations of requests librdkafka really sent."""

from __future__ import annotations

import base64
import json
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from wire import WireClient, metadata_request, produce_request

from kanal.embedded import GatewayProcess, TansuBroker
from kanal.protocol.headers import parse_request_header, response_correlation_id
from kanal.protocol.messages import decode_request_body, encode_request

pytestmark = pytest.mark.integration

CAPTURE = Path(__file__).resolve().parents[2] / "conformance" / "captures" / "kafka" / "rdkafka.jsonl"


@pytest.fixture(scope="module")
def firewall(tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    env = {**tansu.gateway_settings(), "GATEWAY_FEATURE_FLAGS_VALIDATE_REQUESTS": "true"}
    process = GatewayProcess(env, log_path=tmp_path_factory.mktemp("firewall") / "gateway.log").start(timeout=30)
    try:
        yield process
    finally:
        code = process.stop(timeout=15)
    assert code == 0, f"gateway exited with {code} on SIGTERM:\n{process.tail()}"


@pytest.fixture(scope="module")
def topic(tansu: TansuBroker) -> str:
    name = f"firewall-{time.time_ns()}"
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    for future in admin.create_topics([NewTopic(name, 1)]).values():
        future.result(timeout=15)
    return name


def _captured(api_key: int) -> bytes:
    for line in CAPTURE.read_text().splitlines():
        o = json.loads(line)
        if o["dir"] == "c2s" and o["api_key"] == api_key:
            return base64.b64decode(o["frame"])
    raise LookupError(api_key)


def _records_at(frame: bytes) -> int:
    """Where the records of the first partition of a Produce frame start."""
    header = parse_request_header(frame)
    body = decode_request_body(0, header.api_version, frame, header.body_offset)
    records = bytes(body.topic_data[0].partition_data[0].records)
    return frame.index(records)


def _patch(frame: bytes, at: int, raw: bytes) -> bytes:
    return frame[:at] + raw + frame[at + len(raw) :]


def _batch_patch(offset: int, raw: bytes) -> Callable[[bytes], bytes]:
    return lambda frame: _patch(frame, _records_at(frame) + offset, raw)


RECORDS = "Produce v10: topic_data[0].partition_data[0].records"

# (name, request it mutates, mutation, the reason the gateway logs)
MUTATIONS: list[tuple[str, int, Callable[[bytes], bytes], str]] = [
    ("truncated Produce", 0, lambda f: f[:-1], "Produce v10: <tagged fields>: varint runs past the 0 bytes left"),
    (
        "negative batchLength",
        0,
        _batch_patch(8, struct.pack(">i", -100)),
        f"{RECORDS}: batch 0: batchLength -100 is less than the v2 header's 49",
    ),
    ("batch of magic 1", 0, _batch_patch(16, b"\x01"), f"{RECORDS}: batch 0: magic 1, expected 2"),
    (
        "negative record count",
        0,
        _batch_patch(57, struct.pack(">i", -3)),
        f"{RECORDS}: batch 0: negative record count -3",
    ),
    (
        "topic name not UTF-8",
        0,
        lambda f: f.replace(b"cap-rdkafka", b"cap-\xffdkafka", 1),
        "Produce v10: topic_data[0].name: not valid UTF-8",
    ),
    (
        "Metadata topic count past the end",
        3,
        lambda f: f[:18] + b"\xff\xff\x07" + f[19:],  # the body starts at 18
        "Metadata v12: topics: count 131070 needs at least 2359260 bytes, 3 left",
    ),
    ("truncated Fetch", 1, lambda f: f[: len(f) // 2], "Fetch v16: topics: count 1 needs at least 18 bytes, 7 left"),
]


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _produce_through(producer: Producer, topic: str, value: bytes) -> None:
    """A real client still produces through the gateway (delivery confirmed by the broker)."""
    outcome: list[KafkaError | None] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        outcome.append(err)

    producer.produce(topic, value, on_delivery=delivered)
    assert producer.flush(30) == 0
    assert outcome == [None]


def _eventually(condition: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _refused(gateway: GatewayProcess, mark: int, reason: str) -> bool:
    """Whether the gateway logged closing a client for ``reason`` after output position ``mark``."""
    return any(line.endswith(f"malformed request: {reason}") for line in gateway.output[mark:].splitlines())


def _broker_panics(tansu: TansuBroker) -> int:
    return tansu.output.count("panicked")


@pytest.mark.parametrize(("name", "api_key", "mutate", "reason"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_a_malformed_request_closes_that_connection_and_the_broker_stays_healthy(
    firewall: GatewayProcess,
    tansu: TansuBroker,
    topic: str,
    name: str,
    api_key: int,
    mutate: Callable[[bytes], bytes],
    reason: str,
) -> None:
    original = _captured(api_key)
    bad_frame = mutate(original)
    assert bad_frame != original, name
    producer = Producer({"bootstrap.servers": firewall.bootstrap, "linger.ms": 0})
    healthy = WireClient(firewall.bootstrap)
    bad = WireClient(firewall.bootstrap)
    panics = _broker_panics(tansu)
    try:
        _produce_through(producer, topic, b"before")
        mark = len(firewall.output)
        bad.send_raw(_frame(bad_frame))
        assert bad.closed_by_peer(timeout=10), f"the gateway kept the connection open after: {name}"
        assert _eventually(lambda: _refused(firewall, mark, reason)), firewall.tail()
        _produce_through(producer, topic, b"after")
        assert healthy.call(metadata_request([topic]), 7).topics[0].name == topic
        healthy.send_raw(_frame(original))  # the request unmutated still gets its answer
        assert response_correlation_id(healthy.receive()) == parse_request_header(original).correlation_id
    finally:
        bad.close()
        healthy.close()
    assert _broker_panics(tansu) == panics


def test_a_request_that_panics_the_broker_never_reaches_it(
    firewall: GatewayProcess, tansu: TansuBroker, topic: str
) -> None:
    """A Produce whose record batch has a negative batchLength panics a broker task (Tansu: "capacity
    overflow"). Sent directly it does; through the gateway it is refused before it is forwarded."""
    bad_frame = _frame(_batch_patch(8, struct.pack(">i", -100))(_captured(0)))
    before = _broker_panics(tansu)
    direct = WireClient(tansu.bootstrap)
    try:
        direct.send_raw(bad_frame)
        assert direct.closed_by_peer(timeout=10)
    finally:
        direct.close()
    assert _eventually(lambda: _broker_panics(tansu) > before), (
        "the broker no longer panics on a negative batchLength: pick another request it chokes on\n"
        + tansu.output[-2000:]
    )
    panics = _broker_panics(tansu)
    for _ in range(3):
        through = WireClient(firewall.bootstrap)
        try:
            through.send_raw(bad_frame)
            assert through.closed_by_peer(timeout=10)
        finally:
            through.close()
    producer = Producer({"bootstrap.servers": firewall.bootstrap, "linger.ms": 0})
    _produce_through(producer, topic, b"still served")  # a round trip through the gateway and the broker
    assert _broker_panics(tansu) == panics


def test_a_large_malformed_produce_is_refused_and_a_large_good_one_passes(firewall: GatewayProcess, topic: str) -> None:
    """Requests large enough to be forwarded while they arrive (256 KiB and more) are checked too."""
    body = produce_request(topic, 1, [bytes(1000)] * 400)
    good = encode_request(body, 5, "firewall-test")
    assert len(good) > 300 * 1024
    client = WireClient(firewall.bootstrap)
    try:
        client.send_raw(_frame(bytes(good)))
        assert response_correlation_id(client.receive()) == 5
    finally:
        client.close()
    bad = bytearray(good)
    bad[_records_at(bytes(good)) + 16] = 1  # magic
    mark = len(firewall.output)
    client = WireClient(firewall.bootstrap)
    try:
        client.send_raw(_frame(bytes(bad)))
        assert client.closed_by_peer(timeout=10)
    finally:
        client.close()
    reason = "Produce v9: topic_data[0].partition_data[0].records: batch 0: magic 1, expected 2"
    assert _eventually(lambda: _refused(firewall, mark, reason)), firewall.tail()
