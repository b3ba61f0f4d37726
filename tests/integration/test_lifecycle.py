"""Gateway lifecycle with real processes: graceful shutdown, losing and regaining the upstream."""

from __future__ import annotations

import datetime
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from inprocess import bootstrap_of, inprocess_gateway
from wire import WireClient, metadata_request

from kanal.embedded import GatewayProcess, TansuBroker, free_port
from kanal.protocol.api import require_request_class
from kanal.protocol.entities import build, nested
from kanal.protocol.headers import response_correlation_id
from kanal.protocol.messages import decode_response

pytestmark = pytest.mark.integration


def _long_poll_fetch(topic: str, wait_ms: int) -> object:
    cls = require_request_class(1, 12)
    topic_cls = nested(cls, "topics")
    part_cls = nested(topic_cls, "partitions")
    partition = build(
        part_cls,
        partition=0,
        fetch_offset=0,
        partition_max_bytes=1 << 20,
        current_leader_epoch=-1,
        last_fetched_epoch=-1,
        log_start_offset=-1,
    )
    return build(
        cls,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=wait_ms),
        min_bytes=1,
        max_bytes=1 << 20,
        session_epoch=-1,
        topics=(build(topic_cls, topic=topic, partitions=(partition,)),),
    )


def test_shutdown_answers_requests_in_flight(
    tansu: TansuBroker, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = unique_topic()
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1)]).values():
        future.result(timeout=15)
    gateway = GatewayProcess(tansu.gateway_settings(), log_path=tmp_path / "gateway.log").start()
    client = WireClient(gateway.bootstrap)
    try:
        client.call(metadata_request([topic]), 1)
        client.send(_long_poll_fetch(topic, 2500), 2)  # an empty topic: the broker holds it up to 2.5 s
        time.sleep(0.3)
        codes: list[int | None] = []
        stopper = threading.Thread(target=lambda: codes.append(gateway.stop(timeout=20)))
        stopper.start()
        # Once draining, the listeners are closed: a new client is refused (not accepted and reset)
        # while the fetch above is still in flight.
        deadline = time.monotonic() + 2.0
        while "shutting down: draining" not in gateway.output and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _refused_before(gateway.bootstrap, deadline)
        frame = client.receive()
        assert response_correlation_id(frame) == 2
        response = decode_response(1, 12, frame)
        assert response.responses[0].partitions[0].error_code == 0
        stopper.join(30)
        assert codes == [0], gateway.tail()
        assert client.closed_by_peer(timeout=5)
    finally:
        client.close()
        gateway.stop()
    assert "draining 1 client connections" in gateway.output
    assert "shutdown timeout" not in gateway.output  # the drain ended well before GATEWAY_SHUTDOWN_TIMEOUT_MS


def test_a_client_that_closes_is_released_while_its_request_waits_upstream(
    tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    """The broker holds a long-poll Fetch for 30 s; the client closes meanwhile: the gateway lets the
    connection go at once (its descriptors too) instead of waiting for the broker's answer."""
    topic = unique_topic()
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1)]).values():
        future.result(timeout=15)
    with inprocess_gateway(tansu) as gateway:
        client = WireClient(bootstrap_of(gateway))
        try:
            client.call(metadata_request([topic]), 1)
            client.send(_long_poll_fetch(topic, 30_000), 2)
            assert _within(5.0, lambda: len(gateway.connections) == 1)
        finally:
            client.close()
        assert _within(5.0, lambda: not gateway.connections), "the closed client's connection is still held"


def test_an_idle_client_is_closed_but_not_one_waiting_for_the_broker(
    tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    """GATEWAY_IDLE_CONNECTION_TIMEOUT_MS closes a connection that sends nothing and waits for
    nothing; a long poll longer than the timeout is answered, not cut."""
    topic = unique_topic()
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1)]).values():
        future.result(timeout=15)
    with inprocess_gateway(tansu, env={"GATEWAY_IDLE_CONNECTION_TIMEOUT_MS": "300"}) as gateway:
        idle, polling = WireClient(bootstrap_of(gateway)), WireClient(bootstrap_of(gateway))
        try:
            idle.call(metadata_request([topic]), 1)
            polling.call(metadata_request([topic]), 1)
            polling.send(_long_poll_fetch(topic, 1500), 2)  # five times the idle timeout
            assert idle.closed_by_peer(timeout=5)
            frame = polling.receive()
            assert response_correlation_id(frame) == 2
            assert decode_response(1, 12, frame).responses[0].partitions[0].error_code == 0
            assert polling.closed_by_peer(timeout=5)  # idle once answered
        finally:
            idle.close()
            polling.close()


def _within(seconds: float, condition: Callable[[], bool]) -> bool:
    """Whether ``condition`` holds within ``seconds`` (checked every 20 ms)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _refused_before(address: str, deadline: float) -> bool:
    """Whether connecting to ``address`` is refused before ``deadline`` (tried every 20 ms)."""
    host, port = address.rsplit(":", 1)
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
        except ConnectionRefusedError:
            return True
        time.sleep(0.02)
    return False


def test_lost_upstream_gives_retriable_errors_then_recovers(tmp_path: Path) -> None:
    port = free_port()
    broker = TansuBroker(port, log_path=tmp_path / "tansu-1.log").start()
    gateway = GatewayProcess(broker.gateway_settings(), log_path=tmp_path / "gateway.log").start()
    try:
        producer = Producer(
            {"bootstrap.servers": gateway.bootstrap, "message.timeout.ms": 30000, "reconnect.backoff.max.ms": 500}
        )
        topic = "restart-topic"
        admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
        for future in admin.create_topics([NewTopic(topic, 1)]).values():
            future.result(timeout=15)
        producer.produce(topic, b"before")
        assert producer.flush(15) == 0

        broker.stop()
        probe = WireClient(gateway.bootstrap)
        try:  # the gateway cannot reach the broker: the client sees a dropped connection, retriable
            probe.send(metadata_request(), 1)  # (the upstream connection is opened for a first request)
            assert probe.closed_by_peer(timeout=15)
        finally:
            probe.close()
        assert gateway.wait_for_output("upstream unavailable")

        broker = TansuBroker(port, log_path=tmp_path / "tansu-2.log").start()
        direct = AdminClient({"bootstrap.servers": broker.bootstrap})
        for future in direct.create_topics([NewTopic(topic, 1)]).values():
            future.result(timeout=15)
        delivered: list[object] = []
        producer.produce(topic, b"after", on_delivery=lambda err, msg: delivered.append(err))
        assert producer.flush(30) == 0
        assert delivered == [None]
        assert gateway.running
    finally:
        assert gateway.stop() == 0
        broker.stop()
