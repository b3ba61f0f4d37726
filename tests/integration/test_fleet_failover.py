"""A node of a three-node fleet killed with SIGKILL under load: an idempotent producer (acks=all)
that was served by it goes on through the other nodes within the session timeout, and the partition
holds every record once, in order, read back from the broker itself.

What makes it work: each Metadata answer lists the fleet's other nodes as brokers that lead nothing
(so the client knows where else to ask: librdkafka forgets its bootstrap servers once it has
Metadata), and the survivors stop sending clients to a node whose admin port refuses connections,
before its session expires (:mod:`kanal.net.peer_probe`). The producer is given no rebootstrap
setting: it recovers as any client would.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from test_fleet_balancing import CLIENTS, first_port, ports_through, requests
from test_fleet_membership import SESSION_MS, nodes, sees, wait_for

from kanal.embedded import TansuBroker

pytestmark = pytest.mark.integration

RATE = 400  # records a second: a steady load, well within what one node serves here


def read_back(broker: TansuBroker, topic: str, count: int, timeout: float = 30) -> list[bytes]:
    """The values of ``topic``'s partition 0 from its start, read from the broker directly, once
    ``count`` are there (and whatever more came by then)."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"check-{uuid.uuid4().hex[:8]}"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
        while (message := consumer.poll(1.0)) is not None:  # anything past the count: duplicates
            if message.error() is None:
                values.append(message.value())
    finally:
        consumer.close()
    return values


def test_after_sigkill_an_idempotent_producer_goes_on_through_the_others_and_loses_nothing(
    tansu: TansuBroker, tmp_path: Path
) -> None:
    group = f"failover-{uuid.uuid4().hex[:8]}"
    with nodes(tansu, group, 3, tmp_path) as fleet_nodes:
        ports = {first_port(n) for n in fleet_nodes}
        for node in fleet_nodes:
            wait_for(lambda node=node: sees(node, ports), 30, f"{node!r} sees the 3 nodes", *fleet_nodes)
        topic = f"failover-{uuid.uuid4().hex[:10]}"
        admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(15)

        client_id = CLIENTS[0]
        by_port = {first_port(n): n for n in fleet_nodes}
        victim = by_port[ports_through(fleet_nodes[0], [client_id])[client_id]]
        survivors = [n for n in fleet_nodes if n is not victim]

        delivered: list[tuple[bytes, int, float]] = []  # (value, offset, when)
        failures: list[KafkaError] = []

        def on_delivery(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                failures.append(error)
            else:
                delivered.append((message.value(), message.offset(), time.monotonic()))

        producer = Producer(
            {
                "bootstrap.servers": ",".join(n.bootstrap for n in fleet_nodes),
                "client.id": client_id,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 60000,
            }
        )
        sent = 0

        def produce_until(condition: object, timeout: float, what: str) -> None:
            """Produces RATE records a second until ``condition()`` holds."""
            started = time.monotonic()
            while not condition():  # type: ignore[operator]
                if time.monotonic() - started > timeout:
                    pytest.fail(f"{what}: not within {timeout} s; failures {failures[:3]}")
                nonlocal sent
                for _ in range(RATE // 20):
                    producer.produce(topic, str(sent).encode(), on_delivery=on_delivery)
                    sent += 1
                producer.poll(0.05)

        produce_until(lambda: len(delivered) >= 500, 30, "500 records delivered through the client's node")
        assert requests(victim, "Produce") > 0  # it was the one serving the producer
        served_before = [requests(n, "Produce") for n in survivors]

        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        after = len(delivered)
        produce_until(lambda: len(delivered) >= after + 1000, 60, "1,000 more records delivered after the kill")
        assert producer.flush(60) == 0
        assert not failures, failures[:5]

        first_after = next(when for _, _, when in delivered[after:] if when > killed_at)
        recovered_in = first_after - killed_at
        assert recovered_in < SESSION_MS / 1000, f"delivering again took {recovered_in:.1f} s"
        assert [requests(n, "Produce") for n in survivors] != served_before  # the others serve it now

        expected = [str(i).encode() for i in range(sent)]
        assert sorted(delivered, key=lambda d: d[1])[-1][1] == sent - 1  # offsets 0 .. sent-1
        assert read_back(tansu, topic, sent) == expected  # nothing lost, nothing twice, in order
        for node in survivors:  # and the survivors no longer name the dead node
            wait_for(lambda node=node: first_port(victim) not in ports_through(node).values(), 30, "moved", node)
