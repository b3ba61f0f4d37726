"""The gateway on the wire: ordering, malformed input, backpressure. Raw sockets, real broker."""

from __future__ import annotations

import socket
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire import WireClient, api_versions_request, metadata_request, produce_request

from kanal.embedded import GatewayProcess
from kanal.protocol.headers import encode_request_header, response_correlation_id
from kanal.protocol.messages import decode_response

pytestmark = pytest.mark.integration


def test_pipelined_requests_are_answered_in_request_order(gateway: GatewayProcess) -> None:
    client = WireClient(gateway.bootstrap)
    try:
        kinds = []
        for corr in range(1, 61):
            body = api_versions_request() if corr % 3 == 0 else metadata_request()
            kinds.append((corr, body))
            client.send(body, corr)
        for corr, body in kinds:
            frame = client.receive()
            assert response_correlation_id(frame) == corr
            decoded = decode_response(int(body.__api_key__), int(body.__version__), frame)
            if body.__api_key__ == 3:
                assert [(b.host, b.port) for b in decoded.brokers] == [tuple(_split(gateway.bootstrap))]
    finally:
        client.close()


def _split(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def test_metadata_of_every_version_points_at_the_gateway(gateway: GatewayProcess) -> None:
    client = WireClient(gateway.bootstrap)
    try:
        for version in range(0, 13):
            response = client.call(metadata_request(version=version), correlation_id=version + 1)
            assert [(b.host, b.port) for b in response.brokers] == [_split(gateway.bootstrap)], version
    finally:
        client.close()


def test_api_versions_offer_only_what_the_gateway_decodes(gateway: GatewayProcess) -> None:
    from kanal.protocol.api import supported_versions

    client = WireClient(gateway.bootstrap)
    try:
        response = client.call(api_versions_request(), 7)
        for entry in response.api_keys:
            low, high = supported_versions(int(entry.api_key)) or (99, -1)
            assert low <= entry.min_version <= entry.max_version <= high
    finally:
        client.close()


# Malformed input the gateway itself must refuse: each closes that connection only.
_malformed = st.one_of(
    st.integers(min_value=100 * 1024 * 1024 + 1, max_value=2**31 - 1).map(lambda n: struct.pack(">i", n)),
    st.integers(min_value=-(2**31), max_value=-1).map(lambda n: struct.pack(">i", n)),
    st.binary(min_size=0, max_size=7).map(lambda b: struct.pack(">i", len(b)) + b),  # shorter than a header
    st.tuples(st.integers(min_value=93, max_value=32767), st.integers(0, 20), st.binary(max_size=64)).map(
        lambda t: _frame(encode_request_header(t[0], t[1], 1, "fuzz", 1) + t[2])  # unknown API
    ),
    st.tuples(st.sampled_from([0, 1, 3]), st.integers(min_value=30, max_value=32767)).map(
        lambda t: _frame(encode_request_header(t[0], t[1], 1, "fuzz", 1))  # version never offered
    ),
    st.integers(min_value=1, max_value=500).map(  # client id longer than the frame
        lambda n: _frame(struct.pack(">hhih", 3, 12, 1, n) + b"x")
    ),
)


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_malformed)
def test_malformed_frames_close_that_connection_only(gateway: GatewayProcess, data: bytes) -> None:
    healthy = WireClient(gateway.bootstrap)
    bad = WireClient(gateway.bootstrap)
    try:
        healthy.call(metadata_request(), 1)
        bad.send_raw(data)
        assert bad.closed_by_peer(timeout=10), f"gateway kept the connection open after {data[:40]!r}"
        assert healthy.call(metadata_request(), 2).brokers  # the other client is still served
    finally:
        bad.close()
        healthy.close()
    assert gateway.wait_for_output("closing client")


def test_a_client_that_stops_reading_does_not_grow_gateway_memory(gateway: GatewayProcess) -> None:
    rss_before = _rss_kib(gateway.pid)
    sock = socket.create_connection(_split(gateway.bootstrap))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    frame = _encoded(metadata_request())
    sent = 0
    deadline = time.monotonic() + 20
    blocked_since: float | None = None
    while time.monotonic() < deadline:
        try:
            sent += sock.send(frame)
            blocked_since = None
        except BlockingIOError:
            blocked_since = blocked_since or time.monotonic()
            if time.monotonic() - blocked_since > 3:
                break
            time.sleep(0.01)
    try:
        assert blocked_since is not None, "the gateway kept reading from a client that never reads"
        grown_mib = (_rss_kib(gateway.pid) - rss_before) / 1024
        assert grown_mib < 64, f"gateway RSS grew by {grown_mib:.0f} MiB for {sent / 2**20:.1f} MiB of requests"
    finally:
        sock.close()
    healthy = WireClient(gateway.bootstrap)
    try:
        assert healthy.call(metadata_request(), 1).brokers
    finally:
        healthy.close()


def _encoded(body: object) -> bytes:
    from kanal.protocol.messages import encode_request

    frame = encode_request(body, 1, "slow-reader")
    return struct.pack(">i", len(frame)) + bytes(frame)


def _rss_kib(pid: int | None) -> int:
    assert pid is not None
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_acks_zero_produce_gets_no_response_and_keeps_order(gateway: GatewayProcess, tansu: object) -> None:
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"acks0-{time.time_ns()}"
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1)]).values():
        future.result(timeout=15)
    client = WireClient(gateway.bootstrap)
    try:
        client.call(metadata_request([topic]), 1)
        client.send(produce_request(topic, 0, [b"fire", b"and", b"forget"]), 2)
        client.send(metadata_request([topic]), 3)
        frame = client.receive()
        assert response_correlation_id(frame) == 3  # nothing was sent back for the acks=0 produce
        client.send(produce_request(topic, 1, [b"acked"]), 4)
        produced = decode_response(0, 9, client.receive())
        assert produced.responses[0].partition_responses[0].error_code == 0
    finally:
        client.close()
    consumer = Consumer({"bootstrap.servers": tansu.bootstrap, "group.id": topic})  # type: ignore[attr-defined]
    consumer.assign([TopicPartition(topic, 0, 0)])
    values = []
    deadline = time.monotonic() + 20
    while len(values) < 4 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            values.append(msg.value())
    consumer.close()
    assert values == [b"fire", b"and", b"forget", b"acked"]
