"""A fleet against one node: total produce throughput of many clients spread over three gateway
nodes by internal load balancing, against the same clients on one node (``fleet``).

One Tansu broker, one gateway alone in a membership group of its own (*1 node*) and ``NODES`` (3)
gateways sharing another one (*3 nodes*), each node on its own port block and HTTP port, with short
membership timings (``KAFKA_SESSION_TIMEOUT_MS=6000``, ``KAFKA_HEARTBEAT_INTERVAL_MS=500``). Before
measuring, every node's ``GET /gateway/v2/fleet`` must list its group's members (1 or 3), stable.

A run: a fresh topic of ``--partitions`` partitions (6), ``--count`` producer processes (librdkafka,
distinct client ids, so that internal load balancing spreads them; picked with the gateway's own
rendezvous function so that each node gets its even share, see ``Fleet.client_ids``),
each bootstrapped on every node of the path, each producing ``--records`` / ``--count`` records of
``--size`` bytes, started together; the rate is all records over the time from the start to the
last producer's last acknowledgement. Paths, in this order per repeat: *direct* (the broker itself,
for context), *1 node*, *3 nodes*. Besides throughput: each node's share of the Produce requests and
bytes it served (its ``/metrics``, ``gateway_requests_total`` and ``gateway_request_bytes_total`` of
``api_key="Produce"``), the gateway processes' CPU (summed), the broker's, and the whole machine's
busy cores.

    python bench/run.py fleet --size 1024 --records 200000 --count 6 --repeats 3
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from kanal.embedded import SHORT_MEMBERSHIP_TIMINGS, TANSU_NODE_ID, GatewayProcess, TansuBroker
from kanal.protocol.balance import GatewayNode, client_key, rendezvous
from kanalbench.cpu import cpu_seconds, machine_idle_seconds
from kanalbench.measure import MB, Options, log
from kanalbench.report import Report
from kanalbench.runs import LiveWorker, create_topic, delete_topic
from kanalbench.scenarios import scenario
from kanalbench.stack import GATEWAY_PORT_COUNT, raise_nofile

NODES = 3
PATHS = ("direct", "1 node", f"{NODES} nodes")
PRODUCE = "Produce"
GB = 1e9


def _metrics(node: GatewayProcess) -> dict[str, float]:
    """The node's Produce requests and request bytes so far (``/metrics``)."""
    from prometheus_client.parser import text_string_to_metric_families

    url = f"http://127.0.0.1:{node.env['GATEWAY_HTTP_PORT']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    out = {"requests": 0.0, "bytes": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("api_key") != PRODUCE:
                continue
            if sample.name == "gateway_requests_total":
                out["requests"] = sample.value
            elif sample.name == "gateway_request_bytes_total":
                out["bytes"] = sample.value
    return out


class Fleet:
    """The broker, the lone node and the fleet's nodes."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.password = secrets.token_hex(8)
        self.broker: TansuBroker | None = None
        self.groups: dict[str, list[GatewayProcess]] = {}

    def _node(self, group: str, i: int) -> GatewayProcess:
        assert self.broker is not None
        env = {
            **self.broker.gateway_settings(GATEWAY_PORT_COUNT),
            **SHORT_MEMBERSHIP_TIMINGS,
            "GATEWAY_GROUP_ID": group,
            "GATEWAY_ADMIN_API_USERS": f'[{{"username": "bench", "password": "{self.password}"}}]',
            **self.opts.env,
        }
        args = ["run"] + (["--config", str(self.opts.config)] if self.opts.config else [])
        return GatewayProcess(env, args=args, log_path=self.opts.log_dir / f"fleet-{group}-node-{i}.log")

    def start(self) -> None:
        raise_nofile()
        self.opts.log_dir.mkdir(parents=True, exist_ok=True)
        self.broker = TansuBroker(log_path=self.opts.log_dir / "tansu-fleet.log").start(timeout=30)
        tag = os.urandom(4).hex()
        self.groups = {
            PATHS[1]: [self._node(f"kanalbench-solo-{tag}", 0)],
            PATHS[2]: [self._node(f"kanalbench-fleet-{tag}", i) for i in range(NODES)],
        }
        every = [node for nodes in self.groups.values() for node in nodes]
        with ThreadPoolExecutor(len(every)) as pool:  # (Tansu holds each JoinGroup for a while)
            list(pool.map(lambda node: node.start(timeout=60), every))
        for nodes in self.groups.values():
            for node in nodes:
                self._wait_members(node, len(nodes), nodes)

    def _fleet_view(self, node: GatewayProcess) -> dict[str, Any]:
        import json

        request = urllib.request.Request(f"http://127.0.0.1:{node.env['GATEWAY_HTTP_PORT']}/gateway/v2/fleet")
        request.add_header("Authorization", "Basic " + b64encode(f"bench:{self.password}".encode()).decode())
        with urllib.request.urlopen(request, timeout=10) as response:
            view: dict[str, Any] = json.loads(response.read())
        return view

    def _wait_members(self, node: GatewayProcess, count: int, group: list[GatewayProcess], timeout: float = 60) -> None:
        """Until the node's ``/gateway/v2/fleet`` is stable and lists exactly the group's nodes."""
        expected = {int(n.env["GATEWAY_PORT_START"]) for n in group}
        deadline = time.monotonic() + timeout
        while True:
            view = self._fleet_view(node)
            ports = {m["ports"]["first"] for m in view["members"]}
            if view["state"] == "stable" and ports == expected and len(view["members"]) == count:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node!r} lists {sorted(ports)} ({view['state']}), not {sorted(expected)}")
            time.sleep(0.2)

    def client_ids(self, count: int) -> list[str]:
        """``count`` client ids that the fleet's rendezvous hashing (the gateway's own function) spreads
        as evenly as ``count`` allows: ``fleet-0``, ``fleet-1``, ... each taken while its node has
        fewer than its even share. (Six random ids leave one of three nodes without a client one
        time in four; many clients spread evenly by themselves.)"""
        nodes = [
            GatewayNode(
                "127.0.0.1",
                int(n.env["GATEWAY_PORT_START"]),
                int(n.env["GATEWAY_PORT_START"]) + GATEWAY_PORT_COUNT - 1,
                None,
            )
            for n in self.groups[PATHS[2]]
        ]
        cap = -(-count // len(nodes))
        taken: dict[int, int] = {}
        ids: list[str] = []
        candidate = 0
        while len(ids) < count:
            client_id = f"fleet-{candidate}"
            node = rendezvous(client_key("127.0.0.1", None, client_id), TANSU_NODE_ID, nodes).first_port
            if taken.get(node, 0) < cap:
                taken[node] = taken.get(node, 0) + 1
                ids.append(client_id)
            candidate += 1
        return ids

    def bootstrap(self, path: str) -> str:
        assert self.broker is not None
        if path == "direct":
            return self.broker.bootstrap
        return ",".join(node.bootstrap for node in self.groups[path])

    def check_alive(self) -> None:
        for nodes in self.groups.values():
            for node in nodes:
                if not node.running:
                    raise RuntimeError(f"gateway node is not running:\n{node.tail(60)}")

    def stop(self) -> None:
        for nodes in self.groups.values():
            for node in nodes:
                with contextlib.suppress(Exception):
                    node.stop()
        if self.broker is not None:
            self.broker.stop()


@contextmanager
def running_fleet(opts: Options) -> Iterator[Fleet]:
    fleet = Fleet(opts)
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()


def _run(fleet: Fleet, path: str, opts: Options, records: int, report: Report | None) -> str:
    direct = fleet.bootstrap("direct")
    topic = create_topic(direct, opts.partitions, "fleet")
    nodes = fleet.groups.get(path, [])
    per_producer = max(1, records // opts.count)
    client_ids = fleet.client_ids(opts.count)
    workers: list[LiveWorker] = []
    try:
        for i in range(opts.count):
            workers.append(
                LiveWorker(
                    "produce-together",
                    opts.log_dir / f"fleet-producer-{i}.log",
                    bootstrap=fleet.bootstrap(path),
                    topic=topic,
                    size=opts.size,
                    records=per_producer,
                    client_id=client_ids[i],
                    payload=opts.payload,
                )
            )
        for worker in workers:
            worker.read()  # connected, with the topic's metadata
        before = [_metrics(node) for node in nodes]
        assert fleet.broker is not None and fleet.broker.pid is not None
        pids = {"broker": fleet.broker.pid, **{f"node {n}": node.pid or 0 for n, node in enumerate(nodes)}}
        start = time.time() + 0.3
        for worker in workers:
            worker.send(repr(start))
        time.sleep(max(0.0, start - time.time()))
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        idle0, t0 = machine_idle_seconds(), time.perf_counter()
        results = [worker.result(timeout=600) for worker in workers]
        cpu1 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        idle1, window = machine_idle_seconds(), time.perf_counter() - t0
        after = [_metrics(node) for node in nodes]
    finally:
        for worker in workers:
            worker.kill()
        delete_topic(direct, topic)
    fleet.check_alive()
    seconds = max(r["end"] for r in results) - start
    total = sum(r["records"] for r in results)
    nbytes = sum(r["bytes"] for r in results)
    rate = total / seconds
    gateway_cpu = sum(cpu1[n] - cpu0[n] for n in pids if n != "broker")
    broker_cpu = cpu1["broker"] - cpu0["broker"]
    busy = window * (os.cpu_count() or 1) - (idle1 - idle0)
    requests = [a["requests"] - b["requests"] for a, b in zip(after, before, strict=True)]
    req_bytes = [a["bytes"] - b["bytes"] for a, b in zip(after, before, strict=True)]
    shares = [r / sum(requests) if sum(requests) else 0.0 for r in requests]
    byte_shares = [b / sum(req_bytes) if sum(req_bytes) else 0.0 for b in req_bytes]
    if report is not None:
        # rows comparing the fleet with one node: 1 node in the direct column, the fleet in the gateway one
        column = {"direct": None, PATHS[1]: "direct", PATHS[2]: "gateway"}[path]
        if column is not None:
            report.metric("produce, all clients", "rec/s").add(column, rate)
            report.metric("produce, all clients", "MB/s").add(column, nbytes / seconds / MB)
            report.metric("gateway CPU, all nodes", "cores").add(column, gateway_cpu / window)
            report.metric("gateway CPU per GB produced", "s").add(column, gateway_cpu / (nbytes / GB))
            report.metric("broker CPU", "cores").add(column, broker_cpu / window)
            report.metric("machine busy (all processes)", "cores").add(column, busy / window)
            others = (busy - broker_cpu - gateway_cpu) / window
            report.metric("clients and the rest (busy - broker - gateways)", "cores").add(column, others)
        if path == PATHS[2]:
            for rank, (share, byte_share) in enumerate(
                sorted(zip(shares, byte_shares, strict=True), reverse=True), start=1
            ):
                report.metric(f"Produce requests, node ranked {rank}", "%").add("gateway", share * 100)
                report.metric(f"Produce bytes, node ranked {rank}", "%").add("gateway", byte_share * 100)
        # context: the same clients on the broker directly (direct column) and through one node
        if path in ("direct", PATHS[1]):
            column = "direct" if path == "direct" else "gateway"
            report.metric("1 node vs direct: produce", "rec/s").add(column, rate)
            report.metric("1 node vs direct: machine busy", "cores").add(column, busy / window)
    spread = ""
    if nodes:
        spread = (
            f"; Produce requests per node {', '.join(f'{r:,.0f}' for r in requests)} "
            f"({', '.join(f'{s:.0%}' for s in shares)} of them, {', '.join(f'{s:.0%}' for s in byte_shares)} "
            f"of the bytes); gateway CPU {gateway_cpu / window:.2f} cores"
        )
    return (
        f"{total:,} records in {seconds:.2f}s: {rate:,.0f} rec/s, {nbytes / seconds / MB:.1f} MB/s; "
        f"broker CPU {broker_cpu / window:.2f} cores, machine busy {busy / window:.2f} cores{spread}"
    )


@scenario(
    "fleet",
    f"--count producers spread over {NODES} gateway nodes (internal load balancing) vs 1 node vs direct",
    size=1024,
    records=200_000,
    count=6,
    partitions=6,
    repeats=3,
)
def fleet(opts: Options, name: str) -> Report:
    report = Report(
        name,
        {
            "size": opts.size,
            "records": opts.records,
            "producers": opts.count,
            "partitions": opts.partitions,
            "nodes": NODES,
            "repeats": opts.repeats,
            "cores": os.cpu_count(),
        },
    )
    report.notes.append(f"direct column = 1 node, gateway column = {NODES} nodes, ratio g/d = {NODES} nodes / 1 node")
    report.notes.append("rows '1 node vs direct': direct column = the broker directly, gateway column = 1 node")
    report.notes.append(
        f"node shares: each {NODES}-node run's nodes ranked by their share of the Produce requests / bytes"
    )
    report.notes.append("gateway CPU per GB produced (s) = cores the gateway needs per GB/s of produce")
    with running_fleet(opts) as fleet:
        if opts.warmup:
            for path in PATHS:
                log(f"  warm-up {path}: " + _run(fleet, path, opts, max(1000, opts.records // 10), None))
        for i in range(opts.repeats):
            for path in PATHS:
                log(f"  run {i + 1}/{opts.repeats} {path}: " + _run(fleet, path, opts, opts.records, report))
    return report
