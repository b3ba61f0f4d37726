"""The fleet's membership group, sans I/O: the member metadata and member list formats, and every
transition of the group-member state machine, on kio requests and responses (and their bytes)."""

from __future__ import annotations

import contextlib
import dataclasses
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from kanal.protocol.api import ApiKey, require_request_class, response_class, supported_versions
from kanal.protocol.entities import build, nested
from kanal.protocol.member_metadata import (
    MEMBERSHIP_PROTOCOL_VERSION,
    PROTOCOL_NAME,
    PROTOCOL_TYPE,
    MemberMetadata,
    MetadataError,
    decode_member_list,
    decode_metadata,
    encode_member_list,
    encode_metadata,
)
from kanal.protocol.membership import (
    Assigned,
    GroupAccessDenied,
    GroupMember,
    IncompatibleMembership,
    Left,
    MemberConfig,
    NodeState,
    Phase,
    Rejoining,
    SessionTimeoutRefused,
    Unavailable,
    describe_detail,
)
from kanal.protocol.messages import decode_request, encode_request

GROUP = "kanal_gateway-fleet"
HEARTBEAT = 0.5


def metadata(
    node: str = "node-a", port: int = 6969, protocol_version: int = MEMBERSHIP_PROTOCOL_VERSION
) -> MemberMetadata:
    return MemberMetadata(
        node_id=node,
        host="gw.example.com",
        first_port=port,
        last_port=port + 2,
        http_port=8888,
        rack="eu-west-1a",
        version="0.1.0",
        start_time_ms=1_700_000_000_000,
        protocol_version=protocol_version,
    )


# -- the formats ---------------------------------------------------------------------------------

texts = st.text(max_size=40)
metadatas = st.builds(
    MemberMetadata,
    node_id=texts,
    host=texts,
    first_port=st.integers(-(2**31), 2**31 - 1),
    last_port=st.integers(-(2**31), 2**31 - 1),
    http_port=st.integers(-(2**31), 2**31 - 1),
    rack=st.none() | texts,
    version=texts,
    start_time_ms=st.integers(-(2**63), 2**63 - 1),
    protocol_version=st.integers(-(2**15), 2**15 - 1),
    min_broker_id=st.none() | st.integers(-(2**31), 2**31 - 1),
)


@given(metadatas)
def test_member_metadata_round_trips(value: MemberMetadata) -> None:
    assert decode_metadata(encode_metadata(value)) == value


@given(st.integers(-(2**31), 2**31 - 1), texts, st.lists(st.tuples(texts, st.binary(max_size=64)), max_size=5))
def test_member_list_round_trips(generation: int, leader: str, members: list[tuple[str, bytes]]) -> None:
    listed = decode_member_list(encode_member_list(generation, leader, members))
    assert (listed.generation, listed.leader, list(listed.members)) == (generation, leader, members)


def test_the_metadata_layout_is_the_documented_one() -> None:
    """docs/fleet.md, byte by byte: magic, format version, membership protocol version, then tagged
    fields in tag order (tag, length, value)."""
    blob = encode_metadata(metadata())
    assert blob[:8] == b"KNLM" + struct.pack(">hh", 1, 1)
    assert blob[8:12] == struct.pack(">HH", 1, 6) and blob[12:18] == b"node-a"  # NODE_ID
    assert blob[18:22] == struct.pack(">HH", 2, 14) and blob[22:36] == b"gw.example.com"  # HOST
    assert blob[36:48] == struct.pack(">HHii", 3, 8, 6969, 6971)  # KAFKA_PORTS
    assert blob[48:56] == struct.pack(">HHi", 4, 4, 8888)  # HTTP_PORT
    assert blob[56:60] == struct.pack(">HH", 5, 10) and blob[60:70] == b"eu-west-1a"  # RACK
    assert blob[70:74] == struct.pack(">HH", 6, 5) and blob[74:79] == b"0.1.0"  # VERSION
    assert blob[79:] == struct.pack(">HHq", 7, 8, 1_700_000_000_000)  # START_TIME
    no_rack = encode_metadata(MemberMetadata("n", "h", 1, 1, 2, None, "v", 0))
    assert no_rack[30:38] == struct.pack(">HHi", 4, 4, 2) and no_rack[38:40] == struct.pack(">H", 6)  # no tag 5
    with_min = encode_metadata(MemberMetadata("n", "h", 1, 1, 2, None, "v", 0, min_broker_id=111))
    assert with_min == no_rack + struct.pack(">HHi", 8, 4, 111)  # MIN_BROKER_ID, last
    assert decode_metadata(no_rack).min_broker_id is None  # an older node's: not announced


def test_the_member_list_layout_is_the_documented_one() -> None:
    blob = encode_member_list(7, "m1", [("m1", b"AB"), ("m2", b"")])
    assert blob == (
        b"KNLA" + struct.pack(">hi", 1, 7) + struct.pack(">h", 2) + b"m1" + struct.pack(">i", 2)
        + struct.pack(">h", 2) + b"m1" + struct.pack(">i", 2) + b"AB"
        + struct.pack(">h", 2) + b"m2" + struct.pack(">i", 0)
    )  # fmt: skip


def test_fields_of_a_newer_node_are_skipped() -> None:
    blob = encode_metadata(metadata()) + struct.pack(">HH", 99, 3) + b"new"
    assert decode_metadata(blob) == metadata()
    newer_list = encode_member_list(1, "m", [("m", b"x")]) + b"appended by a later leader"
    assert decode_member_list(newer_list).members == (("m", b"x"),)


@pytest.mark.parametrize(
    "blob,problem",
    [
        (b"", "too short"),
        (b"KNLM\x00", "too short"),
        (b"\x00\x00\x00\x01\x00\x00\x00\x05range", "not Kanal member metadata"),  # a consumer's subscription
        (b"KNLM\x00\x02\x00\x01", "format 2"),
        (b"KNLM\x00\x01\x00\x01", "lacks"),
        (encode_metadata(metadata())[:-3], "announces 8 bytes"),
        (encode_metadata(metadata()) + b"\x00", "truncated field header"),
        (encode_metadata(metadata()) + struct.pack(">HH", 1, 1) + b"x", "NODE_ID appears twice"),
        (
            b"KNLM\x00\x01\x00\x01" + struct.pack(">HH", 1, 2) + b"\xff\xfe" + encode_metadata(metadata())[18:],
            "NODE_ID is not UTF-8",
        ),
        (
            encode_metadata(metadata())[:36] + struct.pack(">HHi", 3, 4, 1) + encode_metadata(metadata())[48:],
            "KAFKA_PORTS has 4 bytes",
        ),
    ],
)
def test_bad_metadata_is_refused_cleanly(blob: bytes, problem: str) -> None:
    with pytest.raises(MetadataError, match=problem):
        decode_metadata(blob)


@pytest.mark.parametrize(
    "blob,problem",
    [
        (b"KNLA\x00", "too short"),
        (b"XXXX" + bytes(6), "not a Kanal member list"),
        (b"KNLA\x00\x09" + bytes(4), "format 9"),
        (b"KNLA\x00\x01" + bytes(4) + b"\x00\x05ab", "truncated in the leader"),
        (b"KNLA\x00\x01" + bytes(4) + b"\x00\x00" + struct.pack(">i", 2**30), "member count"),
        (encode_member_list(1, "m", [("m", b"abc")])[:-1], "truncated in member 0's metadata"),
        (b"KNLA\x00\x01" + bytes(4) + b"\x00\x00\x00\x00\x00\x01\x00\x01", "truncated in member 0's id"),
    ],
)
def test_a_bad_member_list_is_refused_cleanly(blob: bytes, problem: str) -> None:
    with pytest.raises(MetadataError, match=problem):
        decode_member_list(blob)


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_metadata_error(blob: bytes) -> None:
    for decode in (decode_metadata, decode_member_list):
        with contextlib.suppress(MetadataError):
            decode(blob)


@given(metadatas, st.integers(0, 200))
def test_every_truncation_of_metadata_is_refused_cleanly(value: MemberMetadata, cut: int) -> None:
    blob = encode_metadata(value)
    if cut < len(blob):
        with pytest.raises(MetadataError):
            decode_metadata(blob[:cut])


# -- the state machine ---------------------------------------------------------------------------


def config(**overrides: Any) -> MemberConfig:
    values: dict[str, Any] = {
        "group_id": GROUP,
        "metadata": metadata(),
        "session_timeout_ms": 6000,
        "heartbeat_interval_ms": int(HEARTBEAT * 1000),
    }
    return MemberConfig(**{**values, **overrides})


def newest(api_key: int) -> Any:
    versions = supported_versions(api_key)
    assert versions is not None
    return require_request_class(api_key, versions[1])


def at(version: int) -> Any:
    return lambda api_key: require_request_class(api_key, version)


def response(api_key: int, version: int | None = None, **values: Any) -> Any:
    versions = supported_versions(api_key)
    assert versions is not None
    return build(response_class(api_key, versions[1] if version is None else version), **values)


def coordinator_found(code: ErrorCode = ErrorCode.none) -> Any:
    cls = response_class(ApiKey.FIND_COORDINATOR, 6)
    entry = build(nested(cls, "coordinators"), key=GROUP, node_id=111, host="broker", port=9092, error_code=code)
    return build(cls, coordinators=(entry,))


def joined(member_id: str = "m-a", leader: str = "m-a", generation: int = 3, members: Any = ()) -> Any:
    cls = response_class(ApiKey.JOIN_GROUP, 9)
    entries = tuple(build(nested(cls, "members"), member_id=m, metadata=blob) for m, blob in members)
    return build(
        cls,
        error_code=ErrorCode.none,
        generation_id=generation,
        protocol_type=PROTOCOL_TYPE,
        protocol_name=PROTOCOL_NAME,
        leader=leader,
        member_id=member_id,
        members=entries,
    )


def join_error(code: ErrorCode, member_id: str = "") -> Any:
    return response(ApiKey.JOIN_GROUP, error_code=code, member_id=member_id, generation_id=-1)


def synced(blob: bytes) -> Any:
    return response(ApiKey.SYNC_GROUP, error_code=ErrorCode.none, assignment=blob)


def heartbeat(code: ErrorCode = ErrorCode.none) -> Any:
    return response(ApiKey.HEARTBEAT, error_code=code)


def two_members() -> list[tuple[str, bytes]]:
    return [("m-a", encode_metadata(metadata())), ("m-b", encode_metadata(metadata("node-b", 7000)))]


def stable_leader(now: float = 0.0) -> GroupMember:
    """A node through the whole join, as the group's leader, in a group of two."""
    member = GroupMember(config(), now)
    member.receive(coordinator_found(), now)
    member.receive(join_error(ErrorCode.member_id_required, "m-a"), now)
    member.receive(joined(members=two_members()), now)
    request = member.request(newest)
    member.receive(synced(request.assignments[0].assignment), now)
    return member


def test_a_node_finds_the_coordinator_joins_leads_syncs_and_heartbeats() -> None:
    member = GroupMember(config(), 10.0)
    assert (member.phase, member.state, member.due(), member.to_coordinator) == (
        Phase.FIND_COORDINATOR,
        NodeState.JOINING,
        10.0,
        False,
    )
    find = member.request(newest)
    assert find.coordinator_keys == (GROUP,) and find.key_type == 0
    assert member.receive(coordinator_found(), 10.0) is None
    assert member.phase is Phase.JOIN and member.to_coordinator and member.coordinator is not None
    assert (member.coordinator.node_id, member.coordinator.host, member.coordinator.port) == (111, "broker", 9092)

    join = member.request(newest)
    assert (join.group_id, join.member_id, join.protocol_type) == (GROUP, "", PROTOCOL_TYPE)
    assert join.session_timeout.total_seconds() == 6 and join.rebalance_timeout.total_seconds() == 6
    assert [(p.name, decode_metadata(p.metadata)) for p in join.protocols] == [(PROTOCOL_NAME, metadata())]
    assert member.request_timeout() == 11.0  # the rebalance timeout and 5 s
    member.receive(join_error(ErrorCode.member_id_required, "m-a"), 10.0)  # KIP-394
    assert member.phase is Phase.JOIN and member.request(newest).member_id == "m-a"

    member.receive(joined(members=two_members()), 10.5)
    assert (member.phase, member.generation, member.is_leader, member.state) == (Phase.SYNC, 3, True, NodeState.JOINING)
    sync = member.request(newest)
    assert (sync.generation_id, sync.member_id, sync.protocol_type, sync.protocol_name) == (
        3,
        "m-a",
        PROTOCOL_TYPE,
        PROTOCOL_NAME,
    )
    assert [a.member_id for a in sync.assignments] == ["m-a", "m-b"]
    assert len({a.assignment for a in sync.assignments}) == 1  # every member gets the whole list
    listed = decode_member_list(sync.assignments[0].assignment)
    assert (listed.generation, listed.leader, listed.members) == (3, "m-a", tuple(two_members()))

    event = member.receive(synced(sync.assignments[0].assignment), 11.0)
    assert isinstance(event, Assigned) and event.leader and event.generation == 3
    assert [m.metadata for m in event.members] == [metadata(), metadata("node-b", 7000)]
    assert (member.phase, member.state, member.due()) == (Phase.STABLE, NodeState.STABLE, 11.0 + HEARTBEAT)
    beat = member.request(newest)
    assert (beat.group_id, beat.generation_id, beat.member_id) == (GROUP, 3, "m-a")
    assert member.request_timeout() == 6.0
    assert member.receive(heartbeat(), 11.6) is None
    assert member.due() == 11.6 + HEARTBEAT


def test_a_follower_sends_no_assignment_and_reads_the_leaders_list() -> None:
    member = GroupMember(config(), 0.0)
    member.receive(coordinator_found(), 0.0)
    member.receive(joined(member_id="m-a", leader="m-b"), 0.0)
    assert not member.is_leader and member.request(newest).assignments == ()
    blob = encode_member_list(3, "m-b", [("m-b", encode_metadata(metadata("node-b", 7000)))])
    event = member.receive(synced(blob), 0.0)
    assert isinstance(event, Assigned) and not event.leader
    # itself too, though the list left it out (a leader that lost it)
    assert [m.member_id for m in member.members] == ["m-b", "m-a"]
    status = member.status()
    assert (status.group_id, status.state, status.leader_id, status.node) == (
        GROUP,
        NodeState.STABLE,
        "m-b",
        metadata(),
    )


@pytest.mark.parametrize("blob", [b"", b"garbage"])
def test_without_a_readable_member_list_the_node_lists_itself(blob: bytes) -> None:
    member = GroupMember(config(), 0.0)
    member.receive(coordinator_found(), 0.0)
    member.receive(joined(member_id="m-a", leader="m-b"), 0.0)
    member.receive(synced(blob), 0.0)
    assert [(m.member_id, m.metadata) for m in member.members] == [("m-a", metadata())]
    assert member.state is NodeState.STABLE
    assert (member.last_error is None) == (blob == b"")


def test_a_member_with_unreadable_metadata_is_listed_with_the_reason() -> None:
    member = GroupMember(config(), 0.0)
    member.receive(coordinator_found(), 0.0)
    member.receive(joined(members=[("m-a", encode_metadata(metadata())), ("m-x", b"KNLM")]), 0.0)
    event = member.receive(synced(member.request(newest).assignments[0].assignment), 0.0)
    assert isinstance(event, Assigned)
    odd = event.members[1]
    assert odd.member_id == "m-x" and odd.metadata is None and odd.error is not None and "too short" in odd.error


@pytest.mark.parametrize(
    "code,keeps_member_id",
    [
        (ErrorCode.rebalance_in_progress, True),
        (ErrorCode.illegal_generation, True),
        (ErrorCode.unknown_member_id, False),
    ],
)
def test_a_heartbeat_error_sends_the_node_back_to_join(code: ErrorCode, keeps_member_id: bool) -> None:
    member = stable_leader()
    event = member.receive(heartbeat(code), 5.0)
    assert isinstance(event, Rejoining) and code.name.upper() in event.reason
    assert (member.phase, member.state, member.due()) == (Phase.JOIN, NodeState.REBALANCING, 5.0)
    assert member.request(newest).member_id == ("m-a" if keeps_member_id else "")
    assert len(member.members) == 2  # the last list is shown meanwhile


@pytest.mark.parametrize("code", [ErrorCode.rebalance_in_progress, ErrorCode.illegal_generation])
def test_a_sync_error_sends_the_node_back_to_join(code: ErrorCode) -> None:
    member = GroupMember(config(), 0.0)
    member.receive(coordinator_found(), 0.0)
    member.receive(joined(member_id="m-a", leader="m-b"), 0.0)
    assert member.receive(response(ApiKey.SYNC_GROUP, error_code=code), 1.0) is None  # not in a generation yet
    assert (member.phase, member.state, member.due()) == (Phase.JOIN, NodeState.JOINING, 1.0)


def test_an_unknown_member_at_join_joins_anew() -> None:
    member = GroupMember(config(), 0.0)
    member.receive(coordinator_found(), 0.0)
    member.receive(join_error(ErrorCode.member_id_required, "m-a"), 0.0)
    member.receive(join_error(ErrorCode.unknown_member_id), 1.0)
    assert member.phase is Phase.JOIN and member.request(newest).member_id == ""


def test_a_moved_coordinator_is_found_again_and_the_heartbeats_go_on() -> None:
    member = stable_leader()
    assert member.receive(heartbeat(ErrorCode.not_coordinator), 5.0) is None
    assert (member.phase, member.state, member.due()) == (Phase.FIND_COORDINATOR, NodeState.STABLE, 5.0)
    assert not member.to_coordinator
    member.receive(coordinator_found(), 5.1)
    assert member.phase is Phase.STABLE and member.due() == 5.1  # still in its generation: heartbeat now


@pytest.mark.parametrize("code", [ErrorCode.coordinator_not_available, ErrorCode.coordinator_load_in_progress])
def test_an_unavailable_coordinator_is_an_outage_with_backoff(code: ErrorCode) -> None:
    member = stable_leader()
    event = member.receive(heartbeat(code), 5.0)
    assert isinstance(event, Unavailable) and code.name.upper() in event.reason
    assert (member.phase, member.state, member.due()) == (Phase.FIND_COORDINATOR, NodeState.OUTAGE, 5.1)


def test_a_lost_connection_is_an_outage_the_node_retries_with_growing_pauses_and_recovers() -> None:
    member = stable_leader()
    event = member.connection_failed("connection refused", 5.0)
    assert isinstance(event, Unavailable) and event.reason == "connection refused"
    assert (member.state, member.phase, member.last_error) == (
        NodeState.OUTAGE,
        Phase.FIND_COORDINATOR,
        "connection refused",
    )
    pauses = []
    for i in range(8):
        now = 6.0 + i
        assert member.connection_failed("connection refused", now) is None  # told once
        pauses.append(round(member.due() - now, 3))
    assert pauses == [0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0, 2.0]
    assert len(member.status().members) == 2  # the last list, as it was
    member.receive(coordinator_found(), 20.0)
    assert (member.state, member.phase, member.last_error) == (NodeState.STABLE, Phase.STABLE, None)
    member.receive(heartbeat(ErrorCode.unknown_member_id), 20.1)  # its session expired meanwhile
    assert (member.state, member.phase, member.member_id) == (NodeState.REBALANCING, Phase.JOIN, "")


def test_a_find_coordinator_error_is_retried() -> None:
    member = GroupMember(config(), 0.0)
    event = member.receive(coordinator_found(ErrorCode.coordinator_not_available), 1.0)
    assert isinstance(event, Unavailable)
    assert (member.phase, member.state, member.due()) == (Phase.FIND_COORDINATOR, NodeState.OUTAGE, 1.1)


def test_another_protocol_in_the_group_stops_the_node_with_exit_code_41() -> None:
    member = GroupMember(config(), 0.0)
    member.receive(coordinator_found(), 0.0)
    with pytest.raises(IncompatibleMembership) as refused:
        member.receive(join_error(ErrorCode.inconsistent_group_protocol), 3.0)
    assert refused.value.exit_code == 41
    message = str(refused.value)
    assert GROUP in message and "INCONSISTENT_GROUP_PROTOCOL" in message
    assert "another GATEWAY_GROUP_ID" in message and "Read" in message and "stop every older node" in message


def test_a_join_answered_with_another_protocol_type_stops_the_node() -> None:
    member = GroupMember(config(), 0.0)
    member.receive(coordinator_found(), 0.0)
    answer = dataclasses.replace(joined(), protocol_type="consumer", protocol_name="range")
    with pytest.raises(IncompatibleMembership, match="consumer/range"):
        member.receive(answer, 0.0)


def test_the_leader_stops_on_a_member_of_an_older_membership_protocol() -> None:
    member = GroupMember(config(), 0.0)
    member.receive(coordinator_found(), 0.0)
    older = encode_metadata(metadata("node-old", 9000, protocol_version=0))
    with pytest.raises(IncompatibleMembership, match=r"node-old.*speaks membership protocol 0") as refused:
        member.receive(joined(members=[("m-a", encode_metadata(metadata())), ("m-old", older)]), 0.0)
    assert refused.value.exit_code == 41


def test_a_follower_stops_on_a_member_of_an_older_membership_protocol_in_the_list() -> None:
    member = GroupMember(config(), 0.0)
    member.receive(coordinator_found(), 0.0)
    member.receive(joined(member_id="m-a", leader="m-old"), 0.0)
    blob = encode_member_list(3, "m-old", [("m-old", encode_metadata(metadata("node-old", protocol_version=0)))])
    with pytest.raises(IncompatibleMembership):
        member.receive(synced(blob), 0.0)


def test_a_newer_member_is_welcome() -> None:
    member = GroupMember(config(), 0.0)
    member.receive(coordinator_found(), 0.0)
    newer = encode_metadata(metadata("node-new", protocol_version=MEMBERSHIP_PROTOCOL_VERSION + 1))
    member.receive(joined(members=[("m-a", encode_metadata(metadata())), ("m-new", newer)]), 0.0)
    assert member.phase is Phase.SYNC


@pytest.mark.parametrize("stage", ["find", "join", "sync"])
def test_group_acls_refusing_the_node_at_startup_stop_it_naming_the_group_and_the_acl(stage: str) -> None:
    member = GroupMember(config(), 0.0)
    denied = ErrorCode.group_authorization_failed
    with pytest.raises(GroupAccessDenied) as refused:
        if stage == "find":
            member.receive(coordinator_found(denied), 0.0)
        member.receive(coordinator_found(), 0.0)
        if stage == "join":
            member.receive(join_error(denied), 0.0)
        member.receive(joined(member_id="m-a", leader="m-b"), 0.0)
        member.receive(response(ApiKey.SYNC_GROUP, error_code=denied), 0.0)
    message = str(refused.value)
    assert f"Read on the group {GROUP!r}" in message and "GROUP_AUTHORIZATION_FAILED" in message
    assert "GATEWAY_GROUP_ID" in message and refused.value.exit_code == 1


def test_group_acls_removed_while_running_are_an_outage_not_a_stop() -> None:
    member = stable_leader()
    event = member.receive(heartbeat(ErrorCode.group_authorization_failed), 5.0)
    assert isinstance(event, Unavailable) and "Read on the group" in event.reason
    assert member.state is NodeState.OUTAGE


def test_a_refused_session_timeout_names_the_variable() -> None:
    member = GroupMember(config(), 0.0)
    member.receive(coordinator_found(), 0.0)
    with pytest.raises(SessionTimeoutRefused, match="KAFKA_SESSION_TIMEOUT_MS=6000") as refused:
        member.receive(join_error(ErrorCode.invalid_session_timeout), 0.0)
    assert refused.value.exit_code == 2


def test_other_join_errors_are_retried_after_a_pause() -> None:
    member = GroupMember(config(), 0.0)
    member.receive(coordinator_found(), 0.0)
    assert member.receive(join_error(ErrorCode.group_max_size_reached), 1.0) is None
    assert (member.phase, member.due(), member.last_error) == (Phase.JOIN, 1.1, "JoinGroup: GROUP_MAX_SIZE_REACHED")


def test_leaving_sends_a_leave_group_then_the_node_has_left() -> None:
    member = stable_leader()
    assert member.leave(7.0) and member.leave(7.0)  # (asked twice: still one leave)
    assert (member.phase, member.state, member.due()) == (Phase.LEAVE, NodeState.LEAVING, 7.0)
    leave = member.request(newest)
    assert leave.group_id == GROUP and [m.member_id for m in leave.members] == ["m-a"]
    assert member.request(at(0)).member_id == "m-a"  # LeaveGroup v0-v2: one member id
    assert member.receive(response(ApiKey.LEAVE_GROUP), 7.1) == Left()
    assert (member.phase, member.state, member.due()) == (Phase.LEFT, NodeState.LEFT, float("inf"))
    with pytest.raises(RuntimeError):
        member.request(newest)


def test_a_refused_leave_says_why() -> None:
    member = stable_leader()
    member.leave(1.0)
    answer = response(ApiKey.LEAVE_GROUP, error_code=ErrorCode.unknown_member_id)
    assert member.receive(answer, 1.1) == Left("LeaveGroup: UNKNOWN_MEMBER_ID")


def test_a_node_that_never_joined_has_nothing_to_leave() -> None:
    member = GroupMember(config(), 0.0)
    assert not member.leave(1.0) and member.phase is Phase.LEFT


def test_a_failure_while_leaving_ends_the_leave() -> None:
    member = stable_leader()
    member.leave(1.0)
    assert member.connection_failed("timed out", 2.0) == Left("timed out") and member.phase is Phase.LEFT


def test_an_answer_to_another_request_is_a_programming_error() -> None:
    member = GroupMember(config(), 0.0)
    with pytest.raises(ValueError, match="phase FIND_COORDINATOR"):
        member.receive(heartbeat(), 0.0)


@pytest.mark.parametrize(
    "api_key", [ApiKey.FIND_COORDINATOR, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP]
)
def test_every_request_encodes_at_every_version_and_reads_back(api_key: ApiKey) -> None:
    """Requests are built at the version the broker's connection offers: each one goes on the wire
    (kio's encoder) and reads back with its fields."""
    versions = supported_versions(api_key)
    assert versions is not None
    for version in range(versions[0], versions[1] + 1):
        member = stable_leader()
        if api_key is ApiKey.FIND_COORDINATOR:
            member = GroupMember(config(), 0.0)
        elif api_key is ApiKey.JOIN_GROUP:
            member.receive(heartbeat(ErrorCode.rebalance_in_progress), 1.0)
        elif api_key is ApiKey.SYNC_GROUP:
            member.receive(heartbeat(ErrorCode.rebalance_in_progress), 1.0)
            member.receive(joined(members=two_members()), 1.0)
        elif api_key is ApiKey.LEAVE_GROUP:
            member.leave(1.0)
        body = member.request(at(version))
        frame = encode_request(body, 7, "kanal-fleet")
        header, decoded = decode_request(frame)
        assert (header.api_key, header.api_version) == (api_key, version)
        assert decoded == body
        if api_key is ApiKey.FIND_COORDINATOR:
            assert (decoded.coordinator_keys if version >= 4 else decoded.key) in ((GROUP,), GROUP)
        elif api_key is not ApiKey.LEAVE_GROUP or version < 3:
            assert decoded.group_id == GROUP


def test_find_coordinator_answers_of_old_versions_are_read() -> None:
    member = GroupMember(config(), 0.0)
    member.receive(response(ApiKey.FIND_COORDINATOR, 0, node_id=1, host="b1", port=9093), 0.0)
    assert member.coordinator is not None and (member.coordinator.host, member.coordinator.port) == ("b1", 9093)


def test_describe_names_what_the_group_runs() -> None:
    cls = response_class(ApiKey.DESCRIBE_GROUPS, 5)
    member_cls = nested(nested(cls, "groups"), "members")
    group = build(
        nested(cls, "groups"),
        group_id=GROUP,
        group_state="Stable",
        protocol_type="consumer",
        protocol_data="range",
        members=(build(member_cls, member_id="x"),),
    )
    detail = describe_detail(build(cls, groups=(group,)), GROUP)
    assert detail == "the group runs protocol type 'consumer', protocol 'range' with 1 member(s)"
    assert describe_detail(build(cls, groups=()), GROUP) is None
