"""The fleet's membership group with real gateway processes in front of a real Tansu broker: every
node sees the others (``GET /gateway/v2/fleet``, ``gateway_fleet_members``), a node stopped with
SIGTERM leaves at once, a node meeting an older membership protocol in its group exits with code 41
(and the rolling-upgrade path of another group id works), the removed variables are refused, and a
node rides out a cluster outage.

Tansu holds a JoinGroup for half the session timeout before it completes a rebalance, so the
timings here are short and every wait is for a condition, never a fixed sleep.
"""

from __future__ import annotations

import datetime
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from confluent_kafka.admin import AdminClient

from kanal.config.upstream import UpstreamSettings
from kanal.embedded import EmbeddedProcessError, GatewayProcess, TansuBroker, free_port
from kanal.net.upstream import BrokerCalls
from kanal.protocol.entities import build, nested

pytestmark = pytest.mark.integration

SESSION_MS = 8000  # Tansu completes a rebalance after half of it
SHORT_SESSION = {"KAFKA_SESSION_TIMEOUT_MS": "6000"}  # where no margin against the session timeout is measured
HEARTBEAT_MS = 300
USERS = '[{"username": "ops", "password": "secret"}]'
AUTH = ("ops", "secret")


def node_env(broker: TansuBroker, group: str, **extra: str) -> dict[str, str]:
    return {
        **broker.gateway_settings(),
        "GATEWAY_GROUP_ID": group,
        "GATEWAY_ADMIN_API_USERS": USERS,
        "KAFKA_SESSION_TIMEOUT_MS": str(SESSION_MS),
        "KAFKA_HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_MS),
        **extra,
    }


def fleet(node: GatewayProcess) -> dict[str, Any]:
    answer = httpx.get(f"http://127.0.0.1:{node.env['GATEWAY_HTTP_PORT']}/gateway/v2/fleet", auth=AUTH, timeout=5)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def gauge(node: GatewayProcess) -> float:
    text = httpx.get(f"http://127.0.0.1:{node.env['GATEWAY_HTTP_PORT']}/metrics", timeout=5).text
    line = next(line for line in text.splitlines() if line.startswith("gateway_fleet_members "))
    return float(line.split()[1])


def wait_for(condition: Callable[[], bool], timeout: float, what: str, *nodes: GatewayProcess) -> float:
    """Seconds until ``condition()`` held; fails after ``timeout`` with the nodes' output."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            tails = "\n".join(f"--- {n!r}\n{n.tail(30)}" for n in nodes)
            pytest.fail(f"{what}: not within {timeout} s\n{tails}")
        time.sleep(0.1)
    return time.monotonic() - started


def sees(node: GatewayProcess, expected: set[int]) -> bool:
    """Whether the node is stable and lists exactly the nodes whose first client ports are ``expected``."""
    view = fleet(node)
    return view["state"] == "stable" and {m["ports"]["first"] for m in view["members"]} == expected


@pytest.fixture
def group() -> str:
    return f"fleet-test-{uuid.uuid4().hex[:8]}"


@contextmanager
def nodes(broker: TansuBroker, group: str, count: int, tmp_path: Path) -> Iterator[list[GatewayProcess]]:
    """``count`` gateway processes in ``group``, started side by side (each takes a second or two)."""
    with ExitStack() as stack:
        processes = [GatewayProcess(node_env(broker, group), log_path=tmp_path / f"node-{i}.log") for i in range(count)]
        for process in processes:
            stack.callback(process.stop)
        with ThreadPoolExecutor(count) as pool:
            list(pool.map(lambda process: process.start(timeout=30), processes))
        yield processes


def test_every_node_sees_the_others_and_a_stopped_node_leaves_at_once(
    tansu: TansuBroker, group: str, tmp_path: Path
) -> None:
    with nodes(tansu, group, 3, tmp_path) as fleet_nodes:
        ports = {int(n.env["GATEWAY_PORT_START"]) for n in fleet_nodes}
        for node in fleet_nodes:
            wait_for(lambda node=node: sees(node, ports), 30, f"{node!r} sees the 3 nodes", *fleet_nodes)
        views = [fleet(n) for n in fleet_nodes]
        assert len({v["generation"] for v in views}) == 1 and len({v["leader"] for v in views}) == 1
        assert all(gauge(n) == 3 for n in fleet_nodes)
        for node, view in zip(fleet_nodes, views, strict=True):
            [me] = [m for m in view["members"] if m["self"]]
            assert me["memberId"] == view["memberId"] and me["ports"]["http"] == int(node.env["GATEWAY_HTTP_PORT"])
            assert (me["host"], me["version"], me["protocolVersion"]) == ("127.0.0.1", "0.1.0", 1)
            assert sum(m["leader"] for m in view["members"]) == 1

        leaving, staying = fleet_nodes[0], fleet_nodes[1:]
        stopped_at = time.monotonic()
        assert leaving.stop(timeout=15) == 0
        assert "left the fleet group" in leaving.output
        rest = ports - {int(leaving.env["GATEWAY_PORT_START"])}
        for node in staying:
            wait_for(lambda node=node: sees(node, rest), 30, f"{node!r} sees the node gone", *staying)
        gone_after = time.monotonic() - stopped_at
        # a node that vanished would be seen gone after a session timeout (and Tansu's rebalance): this
        # one told the group it was going
        assert gone_after < 0.75 * SESSION_MS / 1000, gone_after
        assert all(gauge(n) == 2 for n in staying)


class OlderNode:
    """A test double of a node of an older membership protocol: the plain consumer protocol type,
    with a consumer subscription as its metadata (how a gateway without a fleet protocol would show
    up in a group), joined and heartbeating in a thread of its own."""

    PROTOCOL_TYPE = "consumer"

    def __init__(self, broker: TansuBroker, group: str) -> None:
        self.broker = broker
        self.group = group
        self.stable = threading.Event()
        self.stop = threading.Event()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="older-node", daemon=True)

    def __enter__(self) -> OlderNode:
        self._thread.start()
        assert self.stable.wait(20), f"the older node did not join: {self.failure!r}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        try:
            trio.run(self._member)
        except BaseException as exc:
            self.failure = exc
            self.stable.set()

    async def _member(self) -> None:
        address = (self.broker.host, self.broker.port)
        calls = await BrokerCalls.open(address, UpstreamSettings(bootstrap_servers=(address,)), 10, 1 << 20, "old")
        session = datetime.timedelta(milliseconds=6000)
        subscription = b"\x00\x00\x00\x00\x00\x01\x00\x0d_license_topic\xff\xff\xff\xff"  # v0, one topic, no data
        member_id = ""
        while True:
            cls = calls.request_class(11)
            protocol = build(nested(cls, "protocols"), name="range", metadata=subscription)
            joined = await calls.call(
                build(
                    cls,
                    group_id=self.group,
                    session_timeout=session,
                    rebalance_timeout=session,
                    member_id=member_id,
                    protocol_type=self.PROTOCOL_TYPE,
                    protocols=(protocol,),
                ),
                30,
            )
            member_id = joined.member_id
            if joined.error_code.name == "none":
                break
            assert joined.error_code.name == "member_id_required", joined
        cls = calls.request_class(14)
        assignments = (build(nested(cls, "assignments"), member_id=member_id, assignment=b""),)
        synced = await calls.call(
            build(
                cls,
                group_id=self.group,
                generation_id=joined.generation_id,
                member_id=member_id,
                protocol_type=self.PROTOCOL_TYPE,
                protocol_name="range",
                assignments=assignments,
            ),
            30,
        )
        assert synced.error_code.name == "none", synced
        self.stable.set()
        heartbeat = calls.request_class(12)
        while not self.stop.is_set():
            await trio.sleep(0.3)
            beat = build(heartbeat, group_id=self.group, generation_id=joined.generation_id, member_id=member_id)
            answer = await calls.call(beat, 10)
            assert answer.error_code.name == "none", answer
        leave = calls.request_class(13)
        await calls.call(
            build(leave, group_id=self.group, members=(build(nested(leave, "members"), member_id=member_id),)), 10
        )
        await calls.aclose()


def test_a_node_meeting_an_older_protocol_exits_41_and_another_group_id_is_the_way_through(
    tansu: TansuBroker, group: str, tmp_path: Path
) -> None:
    with OlderNode(tansu, group), ExitStack() as stack:
        new = GatewayProcess(node_env(tansu, group, **SHORT_SESSION), log_path=tmp_path / "new.log")
        stack.callback(new.stop)
        new.start(timeout=30)  # it serves at once, and learns of the group in the background
        # the rolling upgrade of spec 03 (item 2): the new nodes in a group of their own (started meanwhile)
        upgraded = GatewayProcess(node_env(tansu, f"{group}-v2", **SHORT_SESSION), log_path=tmp_path / "upgraded.log")
        stack.callback(upgraded.stop)
        upgraded.start(timeout=30)

        wait_for(lambda: new.returncode is not None, 30, "the new node exits", new)
        assert new.returncode == 41, new.tail()
        output = new.output
        assert f"membership group {group!r}" in output and "INCONSISTENT_GROUP_PROTOCOL" in output
        assert "the group runs protocol type 'consumer'" in output  # what it met, from DescribeGroups
        assert "another GATEWAY_GROUP_ID" in output and "stop every older node" in output
        assert "(exit code 41)" in output

        port = int(upgraded.env["GATEWAY_PORT_START"])
        wait_for(lambda: sees(upgraded, {port}), 20, "the upgraded node joins its own group", upgraded)
        assert upgraded.running


def test_removed_variables_are_refused_at_startup_naming_the_replacement(tansu: TansuBroker, tmp_path: Path) -> None:
    env = {**tansu.gateway_settings(), "GATEWAY_CONSUMER_GROUP_MEMBERSHIP_TIMEOUT_MS": "30000"}
    with pytest.raises(EmbeddedProcessError) as refused:
        GatewayProcess(env, log_path=tmp_path / "refused.log").start(timeout=30)
    assert refused.value.returncode == 2
    assert "GATEWAY_CONSUMER_GROUP_MEMBERSHIP_TIMEOUT_MS: removed" in refused.value.output
    assert "KAFKA_SESSION_TIMEOUT_MS" in refused.value.output


def test_a_node_keeps_serving_through_a_cluster_outage_and_rejoins(group: str, tmp_path: Path) -> None:
    port = free_port()
    broker = TansuBroker(port, log_path=tmp_path / "tansu-1.log").start()
    node = GatewayProcess(node_env(broker, group, **SHORT_SESSION), log_path=tmp_path / "node.log")
    try:
        node.start(timeout=30)
        first = int(node.env["GATEWAY_PORT_START"])
        wait_for(lambda: sees(node, {first}), 20, "the node joins", node)

        broker.stop()
        wait_for(lambda: fleet(node)["state"] == "outage", 20, "the node sees the outage", node)
        assert node.running and {m["ports"]["first"] for m in fleet(node)["members"]} == {first}  # the last list

        broker = TansuBroker(port, log_path=tmp_path / "tansu-2.log").start()
        wait_for(lambda: sees(node, {first}), 30, "the node rejoins", node)
        assert "the backing cluster answers again" in node.output
        topics = AdminClient({"bootstrap.servers": node.bootstrap}).list_topics(timeout=15)
        assert topics.brokers  # and its clients are served
    finally:
        assert node.stop() == 0
        broker.stop()
