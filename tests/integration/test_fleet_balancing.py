"""Internal load balancing with three real gateway processes in front of one Tansu broker: Metadata
through one node sends different clients to different nodes (the same answer from every node, and
FindCoordinator agreeing with it), a confluent-kafka producer and consumer bootstrapped on one node
are served by another, and once a node is stopped with SIGTERM the survivors no longer name it while
the clients of the survivors stay where they were.

The three nodes start side by side (Tansu holds each JoinGroup for half the session timeout); every
wait is for a condition, never a fixed sleep.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from test_fleet_membership import fleet, nodes, sees, wait_for
from wire import WireClient, metadata_request

from kanal.embedded import GatewayProcess, TansuBroker
from kanal.protocol.api import require_request_class
from kanal.protocol.balance import STANDBY_ID_BASE
from kanal.protocol.entities import build
from kanal.protocol.messages import decode_response

pytestmark = pytest.mark.integration

CLIENTS = [f"balanced-{i}" for i in range(60)]  # 3 * (2/3)^60: every node gets some of them


def first_port(node: GatewayProcess) -> int:
    return int(node.env["GATEWAY_PORT_START"])


class Asker:
    """One raw connection to a node, sending each request with the client id given."""

    def __init__(self, node: GatewayProcess) -> None:
        self.wire = WireClient(node.bootstrap)
        self.correlation = 0

    def call(self, body: Any, client_id: str) -> Any:
        self.correlation += 1
        self.wire.send(body, self.correlation, client_id)
        return decode_response(int(body.__api_key__), int(body.__version__), self.wire.receive())

    def broker_ports(self, client_ids: list[str]) -> dict[str, int]:
        """Each client id's port for the (one) broker, as Metadata answers it."""
        answers = {}
        for client_id in client_ids:
            [broker] = [b for b in self.call(metadata_request([]), client_id).brokers if b.node_id < STANDBY_ID_BASE]
            assert broker.host == "127.0.0.1"
            answers[client_id] = int(broker.port)
        return answers

    def close(self) -> None:
        self.wire.close()


def ports_through(node: GatewayProcess, client_ids: list[str] = CLIENTS) -> dict[str, int]:
    asker = Asker(node)
    try:
        return asker.broker_ports(client_ids)
    finally:
        asker.close()


def requests(node: GatewayProcess, api: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{node.env['GATEWAY_HTTP_PORT']}/metrics", timeout=5).text
    prefix = f'gateway_requests_total{{api_key="{api}"}} '
    return next((float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)), 0.0)


@pytest.fixture(scope="module")
def trio_of_nodes(tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[GatewayProcess]]:
    """Three nodes of one fleet, each seeing the three (so each answers with the three)."""
    group = f"balancing-{uuid.uuid4().hex[:8]}"
    with nodes(tansu, group, 3, tmp_path_factory.mktemp("balancing")) as fleet_nodes:
        ports = {first_port(n) for n in fleet_nodes}
        for node in fleet_nodes:
            wait_for(lambda node=node: sees(node, ports), 30, f"{node!r} sees the 3 nodes", *fleet_nodes)
        yield fleet_nodes


def test_metadata_through_one_node_spreads_clients_and_every_node_agrees(trio_of_nodes: list[GatewayProcess]) -> None:
    a, b, c = trio_of_nodes
    through_a = ports_through(a)
    assert set(through_a.values()) == {first_port(n) for n in trio_of_nodes}
    assert ports_through(a) == through_a  # stable for a client
    assert ports_through(b) == through_a == ports_through(c)  # whichever node it asks
    view = fleet(a)["internalLoadBalancing"]
    assert view["enabled"] and {n["ports"]["first"] for n in view["nodes"]} == set(through_a.values())

    asker = Asker(b)
    try:  # the group coordinator is the same node as the broker's, for that client
        find = build(require_request_class(10, 4), key_type=0, coordinator_keys=("some-group",))
        for client_id in CLIENTS[:6]:
            [coordinator] = asker.call(find, client_id).coordinators
            assert (coordinator.host, coordinator.port) == ("127.0.0.1", through_a[client_id])
    finally:
        asker.close()


def test_a_client_bootstrapped_on_one_node_is_served_by_another(trio_of_nodes: list[GatewayProcess]) -> None:
    a = trio_of_nodes[0]
    by_port = {first_port(n): n for n in trio_of_nodes}
    client_id, port = next((k, p) for k, p in ports_through(a).items() if p != first_port(a))
    serving = by_port[port]
    topic = f"balanced-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": a.bootstrap, "client.id": client_id})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(15)

    produced_before = requests(serving, "Produce")
    producer = Producer({"bootstrap.servers": a.bootstrap, "client.id": client_id, "linger.ms": 0})
    values = [f"record-{i}".encode() for i in range(20)]
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(15) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": a.bootstrap,
            "client.id": client_id,
            "group.id": f"balanced-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    consumed: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(consumed) < len(values) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                consumed.append(message.value())
    finally:
        consumer.close()
    assert consumed == values
    # the records went through the client's node; the bootstrap node only answered Metadata
    assert requests(serving, "Produce") > produced_before
    assert requests(serving, "Fetch") > 0 and requests(serving, "JoinGroup") > 0
    assert requests(a, "Produce") == 0 and requests(a, "Fetch") == 0 and requests(a, "JoinGroup") == 0


def test_after_sigterm_the_survivors_no_longer_name_the_node(trio_of_nodes: list[GatewayProcess]) -> None:
    leaving, *staying = trio_of_nodes
    gone = first_port(leaving)
    before = ports_through(staying[0])
    assert gone in before.values()
    assert leaving.stop(timeout=15) == 0

    def moved_away() -> bool:
        return all(gone not in ports_through(node).values() for node in staying)

    wait_for(moved_away, 30, "the survivors stop naming the stopped node", *staying)
    after = ports_through(staying[0])
    assert ports_through(staying[1]) == after
    # only the stopped node's clients moved: the others' stay where they were
    assert {k: p for k, p in before.items() if p != gone} == {k: p for k, p in after.items() if before[k] != gone}
    assert set(after.values()) == {first_port(n) for n in staying}
