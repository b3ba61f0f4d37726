"""A fleet-wide ``producer-rate-limiting`` with three real gateway processes of one fleet in front of
one Tansu broker: the limit is declared once (through one node's admin API), six producers are
spread 4/2/0 over the nodes, and the bytes the three nodes let through per second add up to the
limit, not to three times it, within 10%.

The bytes are counted by the gateways themselves (``kanal_rate_limit_bytes_total``, the bytes each
node's limiter let through, read from every node's ``/metrics`` at the start and the end of the
window), and the window starts once the shares have moved to the busy nodes (every wait is for a
condition, never a fixed sleep). Internal load balancing is off, so that each producer stays on the
node it bootstraps from and the load stays skewed: the idle node's share must go to the others for
the fleet to reach the limit.

The limit is 10 MB/s, the figure of the issue: a 2-core machine running the broker, the three
gateways and the six producers pushes it (the limiters read only the length of each Produce
request's records; the records are never decoded). What the fleet lets through falls short of the
limit by the idle node's floor (5% of its base share, under 2% of the limit).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kanal.embedded import GatewayProcess, TansuBroker

pytestmark = pytest.mark.integration

LIMIT = 10 * 1000 * 1000  # bytes per second, fleet-wide
WINDOW = 15.0  # seconds of measurement
PLACEMENT = (4, 2, 0)  # producers per node: skewed, one node idle
AUTH = ("ops", "secret")
VALUE = os.urandom(10_000)  # incompressible (no compression anyway)


def http(node: GatewayProcess) -> str:
    return f"http://127.0.0.1:{node.env['GATEWAY_HTTP_PORT']}"


def metric(node: GatewayProcess, name: str, plugin: str = "producer-rate-limiting") -> float | None:
    """A sample of the node's ``/metrics`` whose labels include ``plugin="..."`` (None: not there)."""
    text = httpx.get(f"{http(node)}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(name + "{") and f'plugin="{plugin}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def counted(nodes: list[GatewayProcess]) -> float:
    """The bytes the nodes' limiters let through so far, all together."""
    return sum(metric(node, "kanal_rate_limit_bytes_total") or 0.0 for node in nodes)


def shares(nodes: list[GatewayProcess]) -> list[float | None]:
    return [metric(node, "kanal_limit_share") for node in nodes]


def wait_for(condition: Callable[[], Any], timeout: float, what: str, nodes: list[GatewayProcess]) -> float:
    """Seconds until ``condition()`` held; fails after ``timeout`` with the nodes' output."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            tails = "\n".join(f"--- {n!r}\n{n.tail(20)}" for n in nodes)
            pytest.fail(f"{what}: not within {timeout} s\n{tails}")
        time.sleep(0.1)
    return time.monotonic() - started


def sees_three(node: GatewayProcess) -> bool:
    view = httpx.get(f"{http(node)}/gateway/v2/fleet", auth=AUTH, timeout=5).json()
    return bool(view["state"] == "stable" and len(view["members"]) == 3)


@pytest.fixture
def fleet(tansu: TansuBroker, tmp_path: Path) -> Iterator[list[GatewayProcess]]:
    """Three nodes of one fleet (their own group and cluster id), each seeing the three."""
    suffix = uuid.uuid4().hex[:8]
    shared = {
        "GATEWAY_GROUP_ID": f"fleet-limit-{suffix}",
        "GATEWAY_CLUSTER_ID": f"fleet-limit-{suffix}",  # fresh resources and usage topics
        "GATEWAY_ADMIN_API_USERS": '[{"username": "ops", "password": "secret", "admin": true}]',
        "GATEWAY_FEATURE_FLAGS_INTERNAL_LOAD_BALANCING": "false",  # producers stay where they bootstrap
        "KAFKA_SESSION_TIMEOUT_MS": "6000",  # Tansu holds a JoinGroup for half of it
    }
    with ExitStack() as stack:
        nodes = [
            GatewayProcess({**tansu.gateway_settings(), **shared}, log_path=tmp_path / f"node-{i}.log")
            for i in range(3)
        ]
        for node in nodes:
            stack.callback(node.stop)
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda node: node.start(timeout=30), nodes))
        for node in nodes:
            wait_for(lambda node=node: sees_three(node), 30, f"{node!r} sees the 3 nodes", nodes)
        yield nodes


class Producers:
    """Producers, each in a thread of its own, sending 10 KB records as fast as they are let."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []

    def start(self, bootstrap: str, name: str) -> None:
        thread = threading.Thread(target=self._run, args=(bootstrap, name), daemon=True)
        thread.start()
        self.threads.append(thread)

    def _run(self, bootstrap: str, name: str) -> None:
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": name,
                "linger.ms": 20,
                "batch.size": 256 * 1024,
                "acks": 1,
                "queue.buffering.max.kbytes": 4096,
                "on_delivery": lambda err, _msg: err is None or self.errors.append(str(err)),
            }
        )
        try:
            while not self.stop.is_set():
                try:
                    producer.produce(self.topic, VALUE)
                except BufferError:
                    producer.poll(0.05)  # the queue is full: the gateway holds us back
                except KafkaException as exc:
                    self.errors.append(str(exc))
                    return
                producer.poll(0)
        finally:
            producer.flush(30)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)


def test_a_fleet_wide_limit_holds_within_10_percent_with_3_nodes_and_6_producers(
    tansu: TansuBroker, fleet: list[GatewayProcess]
) -> None:
    topic = f"fleet-limit-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)

    # declared once, on one node: every node of the fleet applies it
    interceptor = {
        "apiVersion": "gateway/v2",
        "kind": "Interceptor",
        "metadata": {"name": "fleet-produce-rate"},
        "spec": {"pluginClass": "producer-rate-limiting", "priority": 1, "config": {"maximumBytesPerSecond": LIMIT}},
    }
    answer = httpx.put(f"{http(fleet[0])}/gateway/v2/interceptor", json=interceptor, auth=AUTH, timeout=10)
    assert answer.status_code == 200, answer.text

    def base_shares() -> bool:
        now = shares(fleet)
        return all(s is not None and abs(s - LIMIT / 3) < LIMIT * 0.01 for s in now)

    wait_for(base_shares, 30, "every node has a third of the limit", fleet)

    producers = Producers(topic)
    try:
        for node, count in zip(fleet, PLACEMENT, strict=True):
            for n in range(count):
                producers.start(node.bootstrap, f"{topic}-{node.env['GATEWAY_PORT_START']}-{n}")

        def moved() -> bool:
            busy_a, busy_b, idle = (s or 0.0 for s in shares(fleet))
            return idle < LIMIT * 0.05 and busy_a > LIMIT * 0.4 and busy_b > LIMIT * 0.4

        moved_after = wait_for(moved, 20, "the idle node's share goes to the busy ones", fleet)
        assert sum(s or 0.0 for s in shares(fleet)) == pytest.approx(LIMIT, rel=0.01)

        began, before = time.monotonic(), counted(fleet)
        wait_for(lambda: time.monotonic() - began >= WINDOW, WINDOW + 5, "the window", fleet)
        after, ended = counted(fleet), time.monotonic()
    finally:
        producers.close()

    rate = (after - before) / (ended - began)
    print(
        f"shares moved {moved_after:.1f} s after the producers started; fleet-wide rate {rate / 1e6:.2f} MB/s"
        f" for a limit of {LIMIT / 1e6:.2f} MB/s ({rate / LIMIT:.1%}) over {ended - began:.1f} s"
    )
    assert producers.errors == []
    assert abs(rate - LIMIT) <= 0.1 * LIMIT, f"{rate:.0f} B/s for a limit of {LIMIT} B/s"
