"""Pooled upstream connections (GATEWAY_UPSTREAM_CONNECTION_POOL_TYPE=ROUND_ROBIN) with real clients
of three libraries at once: each sees what it would see directly, a client's requests keep their
order, acks=0 and transactions work, and the broker sees a bounded number of shared connections."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from inprocess import bootstrap_of, inprocess_gateway
from test_clients import SCENARIOS, ScenarioResult, check_user_view
from wire import WireClient, metadata_request

from kanal.embedded import TansuBroker
from kanal.gateway import Gateway

pytestmark = pytest.mark.integration

POOLED = {"GATEWAY_UPSTREAM_CONNECTION_POOL_TYPE": "ROUND_ROBIN", "GATEWAY_UPSTREAM_NUM_CONNECTION": "2"}


def _shared_links(gateway: Gateway) -> int:
    return sum(pool.open_links for pool in gateway._pools.values())


def _topic(bootstrap: str, partitions: int = 1) -> str:
    topic = f"pooled-{time.time_ns()}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions)]).values():
        future.result(timeout=15)
    return topic


def _consume_values(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(values) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                values.append(msg.value())
    finally:
        consumer.close()
    return values


def _run_all(jobs: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Runs the jobs at once, each in a thread; re-raises the first failure."""
    results: dict[str, Any] = {}
    errors: list[BaseException] = []

    def run(name: str, job: Callable[[], Any]) -> None:
        try:
            results[name] = job()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=item) for item in jobs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    if errors:
        raise errors[0]
    return results


def test_three_client_libraries_interleave_on_shared_upstream_connections(tansu: TansuBroker) -> None:
    with inprocess_gateway(tansu, env=POOLED) as gateway:
        bootstrap = bootstrap_of(gateway)
        results: dict[str, ScenarioResult] = _run_all({name: lambda f=f: f(bootstrap) for name, f in SCENARIOS.items()})
        for result in results.values():
            check_user_view(result)
        assert 1 <= _shared_links(gateway) <= 2


def test_a_clients_order_acks0_and_transactions_hold_on_a_shared_connection(tansu: TansuBroker) -> None:
    with inprocess_gateway(tansu, env=POOLED) as gateway:
        bootstrap = bootstrap_of(gateway)
        ordered, fire_and_forget, transactional = _topic(bootstrap), _topic(bootstrap), _topic(bootstrap)
        count = 2000

        def idempotent() -> None:  # five requests in flight: the broker must see them in order
            producer = Producer(
                {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0, "batch.num.messages": 10}
            )
            for i in range(count):
                producer.produce(ordered, str(i).encode(), partition=0)
                producer.poll(0)
            assert producer.flush(30) == 0

        def acks0() -> None:
            producer = Producer({"bootstrap.servers": bootstrap, "acks": 0, "linger.ms": 0})
            for i in range(count):
                producer.produce(fire_and_forget, str(i).encode(), partition=0)
                producer.poll(0)
            assert producer.flush(30) == 0

        def transaction() -> None:
            producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional})
            producer.init_transactions(30)
            producer.begin_transaction()
            for i in range(100):
                producer.produce(transactional, str(i).encode(), partition=0)
            producer.commit_transaction(30)

        _run_all({"idempotent": idempotent, "acks0": acks0, "transaction": transaction})
        assert _consume_values(bootstrap, ordered, count) == [str(i).encode() for i in range(count)]
        assert _consume_values(bootstrap, fire_and_forget, count) == [str(i).encode() for i in range(count)]
        assert _consume_values(bootstrap, transactional, 100) == [str(i).encode() for i in range(100)]
        assert 1 <= _shared_links(gateway) <= 2


def test_idle_clients_share_the_pool_and_open_nothing_before_their_first_request(tansu: TansuBroker) -> None:
    with inprocess_gateway(tansu, env=POOLED) as gateway:
        before = int(gateway.metrics.upstream_connections._value.get())
        clients = [WireClient(bootstrap_of(gateway)) for _ in range(40)]
        try:
            deadline = time.monotonic() + 5
            while len(gateway.connections) < 40 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(gateway.connections) == 40
            assert int(gateway.metrics.upstream_connections._value.get()) == before  # nothing asked yet
            for client in clients:
                client.call(metadata_request(), 1)
            assert _shared_links(gateway) == 2
            assert int(gateway.metrics.upstream_connections._value.get()) == before + 2
        finally:
            for client in clients:
                client.close()
