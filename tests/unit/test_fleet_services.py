"""``GatewayServices.fleet`` of a real gateway: the plugins' view of its membership group, with the
membership driven through its state machine (no broker), and without a group."""

from __future__ import annotations

import trio
import trio.testing
from kio.schema.errors import ErrorCode

from kanal.api import Fleet, FleetMember
from kanal.config.settings import build_settings
from kanal.gateway import Gateway
from kanal.net.membership import FleetMembership
from kanal.pipeline.registry import PluginRegistry
from kanal.protocol.api import ApiKey, response_class
from kanal.protocol.entities import build, nested
from kanal.protocol.member_metadata import MemberMetadata, encode_member_list, encode_metadata
from kanal.protocol.membership import MemberConfig

GROUP = "kanal_gateway-fleet"


def node(name: str, port: int) -> MemberMetadata:
    return MemberMetadata(name, "127.0.0.1", port, port + 2, port + 100, "rack-1", "0.1.0", 1_700_000_000_000)


def gateway(*, fleet: bool = True) -> Gateway:
    settings = build_settings({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "GATEWAY_RACK_ID": "r9"})
    gateway = Gateway(settings, PluginRegistry(), fleet=fleet)
    if fleet:
        config = MemberConfig(GROUP, node("me", 7000), session_timeout_ms=6000, heartbeat_interval_ms=500)
        gateway.fleet = FleetMembership(config, settings.upstream, 1.0, 1 << 20)
    return gateway


def join(membership: FleetMembership, generation: int, leader: str) -> None:
    """A generation of two members, "m-other" (node "other") and "m-me" (this node), led by ``leader``."""
    member = membership.member
    if member.coordinator is None:
        find = response_class(ApiKey.FIND_COORDINATOR, 6)
        entry = build(nested(find, "coordinators"), key=GROUP, node_id=1, host="b", port=9092)
        member.receive(build(find, coordinators=(entry,)), 0.0)
    joined = response_class(ApiKey.JOIN_GROUP, 9)
    member.receive(build(joined, generation_id=generation, leader=leader, member_id="m-me", protocol_name="v1"), 0.0)
    members = [("m-other", encode_metadata(node("other", 8000))), ("m-me", encode_metadata(node("me", 7000)))]
    sync = response_class(ApiKey.SYNC_GROUP, 5)
    member.receive(build(sync, assignment=encode_member_list(generation, leader, members)), 0.0)


def rebalance(membership: FleetMembership) -> None:
    heartbeat = response_class(ApiKey.HEARTBEAT, 4)
    membership.member.receive(build(heartbeat, error_code=ErrorCode.rebalance_in_progress), 1.0)


def test_the_view_follows_the_membership() -> None:
    gw = gateway()
    assert gw.fleet is not None
    fleet: Fleet = gw.services_for("some-plugin").fleet
    assert fleet is gw.services_for("another").fleet  # one view per gateway
    # joining: this node alone, nobody leads yet
    assert (fleet.node_id, fleet.is_leader, fleet.leader, fleet.generation) == ("me", False, None, -1)
    assert [m.node_id for m in fleet.members] == ["me"]

    join(gw.fleet, 4, leader="m-other")
    assert not fleet.is_leader and fleet.generation == 4
    assert fleet.members == (
        FleetMember("other", "127.0.0.1", 8000, 8002, 8100, "rack-1", "0.1.0", 1_700_000_000_000, leader=True),
        FleetMember("me", "127.0.0.1", 7000, 7002, 7100, "rack-1", "0.1.0", 1_700_000_000_000, leader=False),
    )
    assert fleet.leader is not None and fleet.leader.node_id == "other"

    rebalance(gw.fleet)
    join(gw.fleet, 5, leader="m-me")
    assert fleet.is_leader and fleet.generation == 5
    assert fleet.leader is not None and fleet.leader.node_id == "me"
    # while the group rebalances, during an outage and once it leaves, the node does not lead
    rebalance(gw.fleet)
    assert not fleet.is_leader and fleet.leader is not None and fleet.leader.node_id == "me"
    join(gw.fleet, 6, leader="m-me")
    assert fleet.is_leader
    gw.fleet.member.connection_failed("connection refused", 2.0)
    assert not fleet.is_leader
    gw.fleet.member.stop()
    assert not fleet.is_leader


def test_changed_returns_when_the_leadership_or_the_members_change() -> None:
    gw = gateway()
    assert gw.fleet is not None
    membership = gw.fleet
    fleet = gw.services_for("p").fleet
    seen: list[tuple[int, bool]] = []

    async def watch() -> None:
        while True:
            await fleet.changed()
            seen.append((fleet.generation, fleet.is_leader))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await trio.sleep(5)
            assert seen == []  # nothing changed
            join(membership, 1, leader="m-me")
            await trio.sleep(1)
            rebalance(membership)
            await trio.sleep(1)
            join(membership, 2, leader="m-other")
            await trio.sleep(1)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert seen == [(1, True), (1, False), (2, False)]


def test_a_gateway_without_a_group_is_a_fleet_of_one_that_it_leads() -> None:
    gw = gateway(fleet=False)
    fleet = gw.services_for("p").fleet
    assert fleet.is_leader and fleet.generation == 0 and fleet.node_id == gw.node_id
    [me] = fleet.members
    assert me == fleet.leader and me.leader and me.node_id == gw.node_id
    assert (me.host, me.first_port, me.http_port, me.rack) == (gw.advertised_host, 6969, 8888, "r9")


def test_the_plugins_fleet_is_the_gateways_own_membership() -> None:
    gw = gateway()
    assert gw.core_services.fleet_host is gw
    assert gw.services_for("p").fleet.node_id == "me"  # as its membership announces it
