"""The observer of clusters without a gateway in a fleet: two gateway processes in front of one Tansu
broker, which is also declared as the cluster without a gateway ("legacy"), as in
``test_dq_gateway.py``. Only the fleet's leader observes; the other node answers ``GET /observer``
with nothing and names the observer. After a SIGTERM of the leader the other node takes over from
the leader's last checkpoint: the records written before, during and after the handover are each
counted once (the fleet-wide counts and the history, read through the admin API).

Tansu completes a rebalance after half the session timeout (the test gateways' is 6 s), so the
handover takes a few seconds; every wait is for a condition.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from kanal.embedded import GatewayProcess, TansuBroker

pytestmark = pytest.mark.integration

USERS = "[{username: admin, password: secret, admin: true}]"
AUTH = ("admin", "secret")
TIMEOUT = 30.0
GOOD = json.dumps({"amount": 10}).encode()
BAD = json.dumps({"amount": -5}).encode()


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dq-plugin")
    info = root / "kanal_dataquality_test-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kanal-dataquality-test\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[kanal.plugins]\ndata-quality = kanal_dataquality.plugin\n")
    return root


class Node:
    def __init__(self, process: GatewayProcess) -> None:
        self.process = process
        self.base = f"http://127.0.0.1:{process.env['GATEWAY_HTTP_PORT']}"

    def get(self, path: str) -> httpx.Response:
        response = httpx.get(self.base + path, auth=AUTH, timeout=10)
        assert response.status_code == 200, response.text
        return response

    def put(self, path: str, body: Any) -> None:
        response = httpx.put(self.base + path, json=body, auth=AUTH, timeout=10)
        assert response.status_code == 200, response.text

    def fleet(self) -> dict[str, Any]:
        body: dict[str, Any] = self.get("/gateway/v2/fleet").json()
        return body

    def node_id(self) -> str:
        return str(next(m["nodeId"] for m in self.fleet()["members"] if m["self"]))

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = self.get("/gateway/v2/data-quality/observer/status").json()
        return body

    def counts(self, policy: str) -> tuple[int, int]:
        body = self.get(f"/gateway/v2/data-quality/policies/{policy}/metrics?range=30m").json()
        return body["evaluated"], body["violations"]

    def violations(self, policy: str) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = self.get(
            f"/gateway/v2/data-quality/policies/{policy}/violations?range=30m&limit=1000"
        ).json()
        return entries


def wait_for(condition: Callable[[], Any], what: str, *nodes: Node, timeout: float = TIMEOUT) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {n.process!r}\n{n.process.tail(40)}" for n in nodes)
            pytest.fail(f"{what}: not within {timeout} s\n{tails}")
        time.sleep(0.1)
    return value


def produce(broker: TansuBroker, topic: str, records: list[tuple[int, bytes]]) -> None:
    """Writes to the broker directly (a cluster without a gateway): (partition, value) pairs."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "enable.idempotence": False})
    for partition, value in records:
        producer.produce(topic, value=value, partition=partition)
    assert producer.flush(TIMEOUT) == 0


def observing(node: Node, topic: str) -> bool:
    status = node.status()
    clusters = status["clusters"].get("legacy", {})
    return bool(status["observing"]) and f"{topic}-0" in clusters and f"{topic}-1" in clusters


@pytest.fixture
def fleet(tansu: TansuBroker, plugin_path: Path, tmp_path: Path) -> Iterator[list[Node]]:
    cluster = f"dqfleet-{uuid.uuid4().hex[:8]}"
    with ExitStack() as stack:
        processes = []
        for i in range(2):
            env = {
                **tansu.gateway_settings(),
                "GATEWAY_ADMIN_API_USERS": USERS,
                "GATEWAY_CLUSTER_ID": cluster,
                "GATEWAY_GROUP_ID": f"kanal_{cluster}-fleet",  # (the test gateways default to a group each)
                "DATA_QUALITY_COUNTS_FLUSH_INTERVAL": "500ms",
                "DATA_QUALITY_CLUSTERS": json.dumps({"legacy": {"bootstrapServers": tansu.bootstrap}}),
                "PYTHONPATH": str(plugin_path),
            }
            process = GatewayProcess(env, log_path=tmp_path / f"node-{i}.log")
            stack.callback(process.stop)
            processes.append(process)
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda p: p.start(timeout=30), processes))
        yield [Node(p) for p in processes]


def test_only_the_leader_observes_and_the_next_one_takes_over(tansu: TansuBroker, fleet: list[Node]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"dq-fleet-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(TIMEOUT)
    name = f"fleet-{uuid.uuid4().hex[:8]}"
    first = fleet[0]
    first.put(
        "/gateway/v2/data-quality-rule",
        {
            "apiVersion": "v1",
            "kind": "DataQualityRule",
            "metadata": {"name": f"{name}-positive"},
            "spec": {"type": "Cel", "displayName": "positive", "celExpression": "value.amount > 0"},
        },
    )
    first.put(
        "/gateway/v2/data-quality-policy",
        {
            "apiVersion": "v1",
            "kind": "DataQualityPolicy",
            "metadata": {"name": name, "group": "team-a"},
            "spec": {
                "displayName": name,
                "rules": [f"{name}-positive"],
                "targets": [{"cluster": "legacy", "topic": topic, "patternType": "LITERAL"}],
                "actions": {"block": {"enabled": False}, "mark": {"enabled": False}},
            },
        },
    )

    # the fleet of two forms; its leader observes, the other does not and names it
    def settled() -> tuple[Node, Node] | None:
        views = [n.fleet() for n in fleet]
        if any(v["state"] != "stable" or len(v["members"]) != 2 for v in views):
            return None
        if len({v["generation"] for v in views}) != 1:
            return None
        leaders = [n for n in fleet if observing(n, topic)]
        others = [n for n in fleet if not n.status()["observing"]]
        return (leaders[0], others[0]) if len(leaders) == 1 and len(others) == 1 else None

    leader, other = wait_for(settled, "one node of the two observes", *fleet)
    leader_id = leader.node_id()
    status = other.status()
    assert status["observer"]["nodeId"] == leader_id and status["clusters"] == {}
    answer = other.get("/gateway/v2/data-quality/observer")
    assert answer.json() == {} and answer.headers["Kanal-Observer-Node"] == leader_id
    answer = leader.get("/gateway/v2/data-quality/observer")
    assert set(answer.json()["legacy"]) >= {f"{topic}-0", f"{topic}-1"}
    assert answer.headers["Kanal-Observer-Node"] == leader_id

    produce(tansu, topic, [(0, GOOD), (0, BAD), (1, BAD), (1, GOOD)])
    wait_for(lambda: other.counts(name) == leader.counts(name) == (4, 2), "the counts, seen by both nodes", *fleet)
    assert {e["node"] for e in other.violations(name)} == {e["node"] for e in leader.violations(name)}

    # SIGTERM of the leader: the other node takes over from its last checkpoint
    assert leader.process.stop(timeout=15) == 0
    assert "stopped observing legacy" in leader.process.output
    produce(tansu, topic, [(0, BAD), (1, GOOD)])  # during the handover
    wait_for(lambda: observing(other, topic), "the other node observes", other, timeout=40)
    produce(tansu, topic, [(0, GOOD), (1, BAD), (1, BAD)])  # after it
    checkpoint = other.status()["checkpoints"]["legacy"]
    assert checkpoint["nodeId"] in (leader_id, other.node_id())
    wait_for(lambda: other.counts(name)[0] >= 9, "every record counted", other)
    # each record once: nothing counted again after the handover, every violation in the history once
    produce(tansu, topic, [(0, GOOD), (1, GOOD)])
    wait_for(lambda: other.counts(name)[0] >= 11, "the last records counted", other)
    assert other.counts(name) == (11, 5)
    entries = other.violations(name)
    assert len(entries) == 5 and {e["action"] for e in entries} == {"OBSERVED"}
    assert "this node leads its fleet" in other.process.output
