"""Internal load balancing (GATEWAY_FEATURE_FLAGS_INTERNAL_LOAD_BALANCING): the mapping of backing
brokers onto the fleet's live nodes (:mod:`kanal.protocol.balance`), then the gateway's answers that
use it (Metadata, DescribeCluster, FindCoordinator, leader hints, a virtual cluster's), without sockets.

The spread bounds come from the hash: rendezvous hashing with a 64-bit BLAKE2b weight sends each
(client, broker) pair to each of N candidates with chance 1/N, independently of the other pairs. The
hash is deterministic (the same on every node and in every run), so these tests are too; the bounds
say what any key set of that size must show for the hash to behave as its model says.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import pytest

from kanal.admin.fleet import balancing_view
from kanal.api.context import Connection
from kanal.config.settings import build_settings
from kanal.gateway import Gateway
from kanal.pipeline.registry import PluginRegistry
from kanal.protocol import balance
from kanal.protocol.api import ApiKey, require_request_class
from kanal.protocol.balance import (
    MAX_CACHED_CLIENTS,
    STANDBY_ID_BASE,
    GatewayNode,
    LoadBalancer,
    client_key,
    rendezvous,
    standby_ids,
)
from kanal.protocol.entities import build, nested
from kanal.protocol.member_metadata import MemberMetadata
from kanal.protocol.membership import Assigned, Member, NodeState
from kanal.protocol.messages import response_type
from kanal.tenancy.names import VirtualNames
from kanal.tenancy.rewrite import to_logical, to_physical

FIRST_BROKER = 111
BROKERS = (111, 112, 113)
A = GatewayNode("gw-a", 7000, 7002, "r1")
B = GatewayNode("gw-b", 8000, 8002, "r2")
C = GatewayNode("gw-c", 9000, 9002, "r2")
KEYS = [client_key("10.0.0.7", None, f"client-{i}") for i in range(100)]


def own_address(node: GatewayNode) -> Any:
    """What ``node`` answers alone (today's answer): its host, its port for the broker."""
    return lambda broker: (node.host, node.port(broker - FIRST_BROKER))


def balancer(own: GatewayNode, *members: GatewayNode, racks: dict[int, str | None] | None = None) -> LoadBalancer:
    lb = LoadBalancer(own, FIRST_BROKER, own_address(own), racks)
    if members:
        lb.members_changed(members)
    return lb


def hosts(lb: LoadBalancer, broker: int, keys: Iterable[str] = KEYS) -> dict[str, str]:
    """Each client key's host for ``broker``."""
    out = {}
    for key in keys:
        address = lb.address_of(key)(broker)
        assert address is not None
        out[key] = address[0]
    return out


# -- the mapping ------------------------------------------------------------------------------------


def test_a_client_gets_the_same_node_on_every_request_and_from_every_node() -> None:
    on_a, on_b = balancer(A, A, B, C), balancer(B, C, B, A)  # (the list's order does not matter)
    for broker in BROKERS:
        first = hosts(on_a, broker)
        assert hosts(on_a, broker) == first
        assert hosts(on_b, broker) == first  # a client bootstrapped on A and refreshing on B stays put
        assert hosts(balancer(A, A, B, C), broker) == first  # a restarted process too (no per-process hash)


def test_the_address_is_the_chosen_node_s_port_for_the_broker() -> None:
    lb = balancer(A, A, B, C)
    by_host = {n.host: n for n in (A, B, C)}
    for broker in BROKERS:
        for key in KEYS[:10]:
            address = lb.address_of(key)(broker)
            assert address is not None
            host, port = address
            assert port == by_host[host].first_port + broker - FIRST_BROKER


def test_clients_spread_evenly_over_three_members() -> None:
    lb = balancer(A, A, B, C)
    for broker in BROKERS:
        shares = Counter(hosts(lb, broker).values())
        # Binomial(100, 1/3) per member: mean 33.3, standard deviation 4.7; 14..53 is 4 deviations
        assert set(shares) == {"gw-a", "gw-b", "gw-c"}, shares
        assert all(14 <= count <= 53 for count in shares.values()), shares


def test_one_client_s_brokers_spread_too() -> None:
    """The broker is part of the key: with N members and B brokers, the (client, broker) pairs spread."""
    lb = balancer(A, A, B, C)
    pairs = Counter(lb.address_of(key)(broker)[0] for key in KEYS for broker in BROKERS)  # type: ignore[index]
    assert all(70 <= count <= 130 for count in pairs.values()), pairs  # Binomial(300, 1/3): 100 +- 8.2
    assert any(len({lb.address_of(key)(b)[0] for b in BROKERS}) > 1 for key in KEYS)  # type: ignore[index]


def test_when_a_member_leaves_only_its_clients_move() -> None:
    lb = balancer(A, A, B, C)
    before = {broker: hosts(lb, broker) for broker in BROKERS}
    lb.members_changed([A, B])  # C left the group
    for broker in BROKERS:
        after = hosts(lb, broker)
        moved = {key for key in KEYS if after[key] != before[broker][key]}
        assert moved == {key for key in KEYS if before[broker][key] == "gw-c"}
        assert set(after.values()) == {"gw-a", "gw-b"}  # each to its runner-up


def test_when_a_member_joins_only_clients_that_move_to_it_move() -> None:
    lb = balancer(A, A, B)
    before = hosts(lb, 111)
    lb.members_changed([A, B, C])
    after = hosts(lb, 111)
    moved = {key for key in KEYS if after[key] != before[key]}
    assert moved and all(after[key] == "gw-c" for key in moved)


def test_a_node_restarted_in_place_gets_its_clients_back() -> None:
    """A node is known by its address, not by the id it draws at each start."""
    lb = balancer(A, A, B, C)
    before = hosts(lb, 112)
    lb.members_changed([A, B])
    lb.members_changed([A, B, GatewayNode("gw-c", 9000, 9002, "r2")])
    assert hosts(lb, 112) == before


def test_a_node_listed_twice_counts_once() -> None:
    """Killed and restarted: its old entry stays until its session expires, beside the new one."""
    lb = balancer(A, A, B, C, C)
    assert lb.members == tuple(sorted((A, B, C), key=lambda n: n.identity))
    assert hosts(lb, 111) == hosts(balancer(A, A, B, C), 111)


def test_a_member_in_the_broker_s_rack_is_preferred() -> None:
    racks: dict[int, str | None] = {111: "r1", 112: "r2", 113: "r9"}
    lb = balancer(A, A, B, C, racks=racks)
    assert set(hosts(lb, 111).values()) == {"gw-a"}  # the one node in r1
    assert set(hosts(lb, 112).values()) == {"gw-b", "gw-c"}  # spread within r2
    assert set(hosts(lb, 113).values()) == {"gw-a", "gw-b", "gw-c"}  # no node in r9: all of them
    # a broker without a rack, or of unknown rack: all of them
    assert set(hosts(balancer(A, A, B, C, racks={111: None}), 111).values()) == {"gw-a", "gw-b", "gw-c"}


def test_racks_learnt_later_apply_at_once() -> None:
    lb = balancer(A, A, B, C)
    version = lb.version
    lb.learn_racks({111: "r1"})
    assert set(hosts(lb, 111).values()) == {"gw-a"} and lb.version == version + 1
    lb.learn_racks({111: "r1"})  # (nothing new: the cache stays)
    assert lb.version == version + 1


def test_a_leaving_node_is_no_longer_named_by_its_own_answers() -> None:
    on_a, on_b = balancer(A, A, B, C), balancer(B, A, B, C)
    assert "gw-a" in hosts(on_a, 111).values()
    on_a.leave()
    leaving = hosts(on_a, 111)
    assert set(leaving.values()) == {"gw-b", "gw-c"}
    # the survivors, once the rebalance removed it, answer what the leaving node answered meanwhile
    on_b.members_changed([B, C])
    assert hosts(on_b, 111) == leaving


def test_before_the_member_list_alone_or_alone_and_leaving_a_node_answers_with_itself() -> None:
    joining = balancer(A)
    assert not joining.balancing and joining.address_of(KEYS[0])(112) == ("gw-a", 7001)
    alone = balancer(A, A)
    assert not alone.balancing and alone.address_of(KEYS[0])(112) == ("gw-a", 7001)
    alone.leave()
    assert alone.address_of(KEYS[0])(113) == ("gw-a", 7002)


def test_a_member_whose_ports_do_not_reach_a_broker_is_not_sent_its_clients() -> None:
    short = GatewayNode("gw-short", 6000, 6000)  # one port: broker 111 only
    lb = balancer(A, A, short)
    assert set(hosts(lb, 111).values()) == {"gw-a", "gw-short"}
    assert set(hosts(lb, 113).values()) == {"gw-a"}


def test_each_client_s_choices_are_computed_once_per_member_list() -> None:
    lb = balancer(A, A, B, C)
    first = lb.address_of(KEYS[0])
    assert lb.address_of(KEYS[0]) is first
    lb.members_changed([A, B])
    assert lb.address_of(KEYS[0]) is not first
    for i in range(MAX_CACHED_CLIENTS + 1):  # the cache is bounded
        lb.address_of(str(i))
    assert rendezvous(KEYS[0], 111, lb.members).host == lb.address_of(KEYS[0])(111)[0]  # type: ignore[index]


# -- the gateway's answers --------------------------------------------------------------------------


def member(node: GatewayNode) -> Member:
    metadata = MemberMetadata(node.host, node.host, node.first_port, node.last_port, 8888, node.rack, "0.1.0", 1)
    return Member(f"m-{node.host}", metadata)


def gateway(**env: str) -> Gateway:
    """Node A of a fleet of A, B and C (the member list handed to it as its membership would)."""
    settings = build_settings(
        {
            "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9",
            "GATEWAY_ADVERTISED_HOST": A.host,
            "GATEWAY_PORT_START": str(A.first_port),
            "GATEWAY_PORT_COUNT": "3",
            "GATEWAY_MIN_BROKERID": str(FIRST_BROKER),
            "GATEWAY_RACK_ID": "r1",
            **env,
        }
    )
    gw = Gateway(settings, PluginRegistry())
    gw.fleet = gw._fleet_membership()
    gw.fleet._report(Assigned(3, False, tuple(member(n) for n in (A, B, C))), NodeState.JOINING)
    return gw


def client(client_id: str, host: str = "10.0.0.7", principal: str | None = None) -> Connection:
    return Connection(1, f"{host}:51234", "127.0.0.1:7000", FIRST_BROKER, principal, client_id=client_id)


def metadata(version: int = 12, racks: dict[int, str | None] | None = None) -> Any:
    cls = response_type(ApiKey.METADATA, version)
    broker_cls, topic_cls = nested(cls, "brokers"), nested(cls, "topics")
    partition_cls = nested(topic_cls, "partitions")
    extra: dict[int, dict[str, Any]] = {b: {"rack": (racks or {}).get(b)} if version >= 1 else {} for b in BROKERS}
    brokers = tuple(build(broker_cls, node_id=b, host=f"broker-{b}", port=9092, **extra[b]) for b in BROKERS)
    partitions = tuple(build(partition_cls, partition_index=i, leader_id=BROKERS[i % 3]) for i in range(30))
    topics = (build(topic_cls, name="orders", partitions=partitions),)
    return build(cls, brokers=brokers, topics=topics, **({"controller_id": 112} if version >= 1 else {}))


def broker_map(body: Any) -> dict[int, tuple[str, int]]:
    """The backing brokers' addresses an answer names (not its standby brokers)."""
    return {int(b.node_id): (str(b.host), int(b.port)) for b in body.brokers if int(b.node_id) < STANDBY_ID_BASE}


def standby_map(body: Any) -> dict[int, tuple[str, int]]:
    """The standby brokers a Metadata answer lists: the other live nodes, leading nothing."""
    return {int(b.node_id): (str(b.host), int(b.port)) for b in body.brokers if int(b.node_id) >= STANDBY_ID_BASE}


def test_metadata_names_the_client_s_nodes_and_leaves_the_partitions_alone() -> None:
    gw = gateway()
    body = metadata()
    answer = gw.core_rules.response(ApiKey.METADATA, 12, body, client("app-1"))
    lb = gw.balancer
    assert lb is not None
    expected = {b: lb.address_of(client_key("10.0.0.7", None, "app-1"))(b) for b in BROKERS}
    assert broker_map(answer) == expected
    assert answer.topics is body.topics and answer.controller_id == 112  # ids stay the brokers'
    hosts_seen = {
        gw.core_rules.response(ApiKey.METADATA, 12, body, client(f"app-{i}")).brokers[0].host for i in range(60)
    }
    assert hosts_seen == {"gw-a", "gw-b", "gw-c"}  # 3 * (2/3)^60: no member may be missing


def test_the_key_is_host_principal_and_client_id() -> None:
    gw = gateway()
    body = metadata()

    def brokers(conn: Connection) -> dict[int, tuple[str, int]]:
        return broker_map(gw.core_rules.response(ApiKey.METADATA, 12, body, conn))

    # another connection of the same client (another port, another listener): the same answer
    other_connection = Connection(2, "10.0.0.7:60000", "127.0.0.1:7001", 112, client_id="app-1")
    assert brokers(other_connection) == brokers(client("app-1"))
    # another host, principal or client id is another client: some of 30 answer otherwise
    ids = [f"app-{i}" for i in range(30)]
    assert any(brokers(client(i, host="10.0.0.8")) != brokers(client(i)) for i in ids)
    assert any(brokers(client(i, principal="alice")) != brokers(client(i)) for i in ids)
    assert len({tuple(brokers(client(i)).items()) for i in ids}) > 1


def test_find_coordinator_describe_cluster_and_leader_hints_agree_with_metadata() -> None:
    gw = gateway()
    conn = client("app-7")
    expected = broker_map(gw.core_rules.response(ApiKey.METADATA, 12, metadata(), conn))
    old = response_type(ApiKey.FIND_COORDINATOR, 3)
    answer = gw.core_rules.response(ApiKey.FIND_COORDINATOR, 3, build(old, node_id=113, host="b", port=1), conn)
    assert (answer.host, answer.port) == expected[113]
    batch = response_type(ApiKey.FIND_COORDINATOR, 6)
    entry = build(nested(batch, "coordinators"), key="g", node_id=112, host="b", port=1)
    answer = gw.core_rules.response(ApiKey.FIND_COORDINATOR, 6, build(batch, coordinators=(entry,)), conn)
    assert (answer.coordinators[0].host, answer.coordinators[0].port) == expected[112]
    cluster = response_type(ApiKey.DESCRIBE_CLUSTER, 1)
    brokers = tuple(build(nested(cluster, "brokers"), broker_id=b, host="b", port=1) for b in BROKERS)
    answer = gw.core_rules.response(ApiKey.DESCRIBE_CLUSTER, 1, build(cluster, brokers=brokers), conn)
    assert {int(b.broker_id): (b.host, b.port) for b in answer.brokers} == expected
    produce = response_type(ApiKey.PRODUCE, 10)
    hint = build(nested(produce, "node_endpoints"), node_id=111, host="b", port=1)
    answer = gw.core_rules.response(ApiKey.PRODUCE, 10, build(produce, node_endpoints=(hint,)), conn)
    assert (answer.node_endpoints[0].host, answer.node_endpoints[0].port) == expected[111]


def test_a_virtual_cluster_s_clients_get_the_same_mapping() -> None:
    """The core's rules run innermost, before the virtual cluster's renaming, which leaves addresses be."""
    gw = gateway()
    conn = client("app-7")
    expected = broker_map(gw.core_rules.response(ApiKey.METADATA, 12, metadata(), conn))
    names = VirtualNames("team-a.")
    find = build(require_request_class(ApiKey.FIND_COORDINATOR, 6), key_type=0, coordinator_keys=("billing",))
    _, rewrite = to_physical(ApiKey.FIND_COORDINATOR, find, names)
    batch = response_type(ApiKey.FIND_COORDINATOR, 6)
    entry = build(nested(batch, "coordinators"), key="team-a.billing", node_id=113, host="b", port=1)
    seen = gw.core_rules.response(ApiKey.FIND_COORDINATOR, 6, build(batch, coordinators=(entry,)), conn)
    logical = to_logical(ApiKey.FIND_COORDINATOR, seen, rewrite, names)
    [coordinator] = logical.coordinators
    assert (coordinator.key, (coordinator.host, coordinator.port)) == ("billing", expected[113])
    all_topics = build(require_request_class(ApiKey.METADATA, 12), topics=None)
    _, rewrite = to_physical(ApiKey.METADATA, all_topics, names)
    seen = gw.core_rules.response(ApiKey.METADATA, 12, metadata(), conn)
    assert broker_map(to_logical(ApiKey.METADATA, seen, rewrite, names)) == expected


def test_broker_racks_come_from_metadata_and_metadata_v0_does_not_clear_them() -> None:
    gw = gateway()
    gw.core_rules.response(ApiKey.METADATA, 12, metadata(racks={111: "r1", 112: "r2"}), client("x"))
    assert gw.balancer is not None and gw.balancer.racks == {111: "r1", 112: "r2", 113: None}
    gw.core_rules.response(ApiKey.METADATA, 0, metadata(version=0), client("x"))
    assert gw.balancer.racks == {111: "r1", 112: "r2", 113: None}
    racked = metadata(racks={111: "r1", 112: "r2"})
    answers = [broker_map(gw.core_rules.response(ApiKey.METADATA, 12, racked, client(f"c{i}"))) for i in range(30)]
    assert {a[111][0] for a in answers} == {"gw-a"}  # the only member in r1
    assert {a[112][0] for a in answers} == {"gw-b", "gw-c"}  # the two in r2
    assert {a[113][0] for a in answers} == {"gw-a", "gw-b", "gw-c"}  # a broker without a rack


def test_a_node_that_starts_shutting_down_stops_naming_itself() -> None:
    gw = gateway()
    names = {
        broker_map(gw.core_rules.response(ApiKey.METADATA, 12, metadata(), client(f"c{i}")))[111][0] for i in range(60)
    }
    assert "gw-a" in names
    gw.shutdown()
    names = {
        broker_map(gw.core_rules.response(ApiKey.METADATA, 12, metadata(), client(f"c{i}")))[111][0] for i in range(60)
    }
    assert names == {"gw-b", "gw-c"}


@pytest.mark.parametrize("flag", ["false", "off"])
def test_with_the_flag_off_every_answer_names_this_node(flag: str) -> None:
    gw = gateway(GATEWAY_FEATURE_FLAGS_INTERNAL_LOAD_BALANCING=flag)
    assert gw.balancer is None and gw.core_rules.addresses_for is None
    for i in range(20):
        answer = gw.core_rules.response(ApiKey.METADATA, 12, metadata(), client(f"c{i}"))
        assert broker_map(answer) == {111: ("gw-a", 7000), 112: ("gw-a", 7001), 113: ("gw-a", 7002)}


def test_without_a_connection_or_before_the_fleet_the_answer_is_this_node_s() -> None:
    gw = gateway()
    answer = gw.core_rules.response(ApiKey.METADATA, 12, metadata())  # (no client: e.g. the replay)
    assert broker_map(answer) == {111: ("gw-a", 7000), 112: ("gw-a", 7001), 113: ("gw-a", 7002)}
    fresh = Gateway(gw.settings, PluginRegistry())
    fresh.fleet = fresh._fleet_membership()  # joining: no member list yet
    answer = fresh.core_rules.response(ApiKey.METADATA, 12, metadata(), client("c1"))
    assert broker_map(answer) == {111: ("gw-a", 7000), 112: ("gw-a", 7001), 113: ("gw-a", 7002)}


# -- standby brokers: the other live nodes a client learns of -------------------------------------


def one_broker_metadata(version: int = 12) -> Any:
    """A Metadata answer of a one-broker cluster (111), as in a small deployment."""
    cls = response_type(ApiKey.METADATA, version)
    extra = {"rack": None} if version >= 1 else {}
    broker = build(nested(cls, "brokers"), node_id=111, host="broker-111", port=9092, **extra)
    partition = build(nested(nested(cls, "topics"), "partitions"), partition_index=0, leader_id=111)
    return build(cls, brokers=(broker,), topics=(build(nested(cls, "topics"), name="orders", partitions=(partition,)),))


def test_a_one_broker_answer_lists_the_other_live_nodes_as_brokers_that_lead_nothing() -> None:
    gw = gateway()
    body = one_broker_metadata()
    for i in range(30):
        answer = gw.core_rules.response(ApiKey.METADATA, 12, body, client(f"app-{i}"))
        [(host, _)] = broker_map(answer).values()
        standbys = standby_map(answer)
        # every node exactly once: the client's own node as the broker, the two others as standbys,
        # each at its port for the broker (so whatever the client asks there reaches broker 111)
        assert sorted([host, *(h for h, _ in standbys.values())]) == ["gw-a", "gw-b", "gw-c"]
        assert set(standbys.values()) <= {("gw-a", 7000), ("gw-b", 8000), ("gw-c", 9000)}
        assert answer.topics is body.topics  # the partitions still name broker 111 alone
    racks = {int(b.node_id): b.rack for b in answer.brokers if int(b.node_id) >= STANDBY_ID_BASE}
    assert set(racks.values()) <= {"r1", "r2"}  # each standby in its node's rack
    v0 = gw.core_rules.response(ApiKey.METADATA, 0, one_broker_metadata(version=0), client("app-0"))
    assert len(standby_map(v0)) == 2  # versions without racks too


def test_standby_ids_are_the_same_from_every_node_and_survive_a_member_leaving() -> None:
    ids = standby_ids([A, B, C])
    assert standby_ids([C, A, B]) == ids and len(set(ids.values())) == 3
    assert all(STANDBY_ID_BASE <= i < 2**31 for i in ids.values())
    assert standby_ids([A, B]) == {k: v for k, v in ids.items() if k != C.identity}
    # what node B answers for a client equals what node A answers for it
    lb_a, lb_b = balancer(A, A, B, C), balancer(B, A, B, C)
    for key in KEYS:
        assert lb_a.standbys(key, [111]) == lb_b.standbys(key, [111])
    lb_a.members_changed([A, B])  # C is gone: no answer names it any more
    assert all(s.host != "gw-c" for key in KEYS for s in lb_a.standbys(key, [111]))


def test_standby_ids_that_meet_are_told_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(balance, "_STANDBY_ID_SPAN", 4)  # 3 nodes in 4 ids: some hashes meet
    nodes = [GatewayNode(f"gw-{i}", 7000, 7002) for i in range(4)]
    assert len(set(standby_ids(nodes).values())) == 4


def test_a_client_whose_brokers_name_every_node_gets_no_standby() -> None:
    gw = gateway()
    for i in range(30):
        answer = gw.core_rules.response(ApiKey.METADATA, 12, metadata(), client(f"app-{i}"))
        named = {host for host, _ in broker_map(answer).values()}
        assert {h for h, _ in standby_map(answer).values()} == {"gw-a", "gw-b", "gw-c"} - named


def test_no_standbys_alone_leaving_or_in_other_answers() -> None:
    gw = gateway()
    gw.shutdown()  # leaving: its own answers name neither it as broker nor as standby
    for i in range(20):
        answer = gw.core_rules.response(ApiKey.METADATA, 12, one_broker_metadata(), client(f"c{i}"))
        assert "gw-a" not in {h for h, _ in (*broker_map(answer).values(), *standby_map(answer).values())}
    cluster = response_type(ApiKey.DESCRIBE_CLUSTER, 1)
    brokers = (build(nested(cluster, "brokers"), broker_id=111, host="b", port=1),)
    answer = gw.core_rules.response(ApiKey.DESCRIBE_CLUSTER, 1, build(cluster, brokers=brokers), client("c1"))
    assert len(answer.brokers) == 1  # DescribeCluster says what the cluster is, without standbys
    alone = balancer(A)
    assert alone.standbys(KEYS[0], [111]) == ()
    alone.members_changed([A])
    assert alone.standbys(KEYS[0], [111]) == ()


def test_a_member_found_dead_is_left_out_and_the_fleet_view_says_so() -> None:
    gw = gateway()
    assert gw.balancer is not None
    gw.balancer.set_unreachable([C.identity])
    view = balancing_view(gw.balancer)
    assert view["unreachable"] == ["gw-c:9000"]
    assert [n["host"] for n in view["nodes"]] == ["gw-a", "gw-b"]
    for i in range(30):
        answer = gw.core_rules.response(ApiKey.METADATA, 12, one_broker_metadata(), client(f"c{i}"))
        assert "gw-c" not in {h for h, _ in (*broker_map(answer).values(), *standby_map(answer).values())}
    gw.balancer.set_unreachable([A.identity])  # a node never takes itself for dead
    assert gw.balancer.unreachable == frozenset()


def test_a_node_with_another_min_broker_id_is_sent_clients_at_its_own_port_for_the_broker() -> None:
    """Node D's first port stands for broker 100 (its GATEWAY_MIN_BROKERID), not 111: its port for
    broker 111 is 11 further."""
    d = GatewayNode("gw-d", 6000, 6020, min_broker_id=100)
    lb = balancer(A, A, d)
    ports = {lb.address_of(key)(111) for key in KEYS}
    assert ports == {("gw-a", 7000), ("gw-d", 6011)}
    assert {lb.address_of(key)(113) for key in KEYS} == {("gw-a", 7002), ("gw-d", 6013)}
    for key in KEYS:
        assert {(s.host, s.port) for s in lb.standbys(key, [111, 112])} <= {("gw-a", 7000), ("gw-d", 6011)}
