"""A broker that stops answering (a paused Tansu process): closed clients are released at once, the
upstream request timeout answers the others with a retriable error, and the gateway recovers."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from inprocess import bootstrap_of, inprocess_gateway
from wire import WireClient, metadata_request, produce_request

from kanal.embedded import TansuBroker
from kanal.protocol.headers import response_correlation_id
from kanal.protocol.messages import decode_response

pytestmark = pytest.mark.integration


@pytest.fixture
def pausable(tmp_path: Path) -> Iterator[TansuBroker]:
    """A broker of this test's own, as it is paused (SIGSTOP) and resumed."""
    broker = TansuBroker(log_path=tmp_path / "tansu.log")
    broker.start(timeout=30)
    try:
        yield broker
    finally:
        if broker.pid is not None:
            os.kill(broker.pid, signal.SIGCONT)
        broker.stop()


def _within(seconds: float, condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _topic(broker: TansuBroker) -> str:
    topic = f"hung-{time.time_ns()}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1)]).values():
        future.result(timeout=15)
    return topic


def test_closed_clients_release_their_descriptors_while_the_broker_hangs(pausable: TansuBroker) -> None:
    topic = _topic(pausable)
    with inprocess_gateway(pausable) as gateway:
        before = _open_fds()
        clients = [WireClient(bootstrap_of(gateway)) for _ in range(50)]
        for client in clients:
            client.call(metadata_request([topic]), 1)  # each has its upstream connection now
        assert pausable.pid is not None
        os.kill(pausable.pid, signal.SIGSTOP)
        for client in clients:
            client.send(metadata_request([topic]), 2)  # never answered while the broker hangs
        assert _within(5.0, lambda: len(gateway.connections) == 50)
        assert _open_fds() >= before + 100  # each client: its socket and its upstream connection
        for client in clients:
            client.close()
        assert _within(5.0, lambda: not gateway.connections), "closed clients are still held"
        assert _within(5.0, lambda: _open_fds() <= before + 5), f"{_open_fds() - before} descriptors left"


def test_the_request_timeout_answers_with_a_retriable_error_and_the_gateway_recovers(
    pausable: TansuBroker,
) -> None:
    topic = _topic(pausable)
    env = {"GATEWAY_UPSTREAM_REQUEST_TIMEOUT_MS": "500"}
    with inprocess_gateway(pausable, env=env) as gateway:
        client = WireClient(bootstrap_of(gateway), timeout=20)
        try:
            client.call(metadata_request([topic]), 1)
            assert pausable.pid is not None
            os.kill(pausable.pid, signal.SIGSTOP)
            started = time.monotonic()
            client.send(produce_request(topic, 1, [b"lost in a hung broker"]), 2)
            frame = client.receive()
            waited = time.monotonic() - started
            assert response_correlation_id(frame) == 2
            partition = decode_response(0, 9, frame).responses[0].partition_responses[0]
            assert partition.error_code == 7  # REQUEST_TIMED_OUT: the client's library retries
            # The produce asks the broker to wait up to 5 s for replicas; the timeout counts after that.
            assert waited >= 5.0, waited
            os.kill(pausable.pid, signal.SIGCONT)
            # The same client connection goes on, on a new upstream connection.
            produced = client.call(produce_request(topic, 1, [b"after the broker came back"]), 3)
            assert produced.responses[0].partition_responses[0].error_code == 0
        finally:
            client.close()
