"""A gateway node's membership in its fleet's Kafka group, as a sans-I/O state machine.

Every node joins one group on the backing cluster (``GATEWAY_GROUP_ID``) with the fleet's own
protocol type, so the cluster is the fleet's coordination engine: FindCoordinator, JoinGroup (the
node's :class:`~kanal.protocol.member_metadata.MemberMetadata` as the one protocol's metadata),
SyncGroup (the leader hands every member the whole member list), then a Heartbeat every
``heartbeat.interval.ms`` until the group rebalances, the coordinator moves or the node leaves.

The machine builds each request (a kio body, at the version the driver's connection offers), reads
each response and says when the next request is due; the driver (:mod:`kanal.net.membership`) only
moves them and sleeps. Failures the node survives (the coordinator moved, the cluster is down, the
session expired) lead back to a rejoin; the node goes on serving its clients meanwhile. What it must
not survive raises a :class:`FleetError` carrying the process's exit code: a member of another
membership protocol in the group (41, spec 03), the group's ACLs refusing the node at startup, a
session timeout the cluster refuses.

Phases::

    FIND_COORDINATOR -> JOIN -> SYNC -> STABLE --(rebalance, unknown member, illegal generation)--> JOIN
          ^                                        \\--(coordinator moved or unreachable)--> FIND_COORDINATOR
          any phase --leave()--> LEAVE -> LEFT
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any

from kio.schema.errors import ErrorCode

from kanal.protocol.api import ApiKey
from kanal.protocol.entities import build, has_field, nested
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

RequestClass = Callable[[int], Any]

#: Errors after which the coordinator is looked up again.
_COORDINATOR_ERRORS = frozenset(
    {ErrorCode.not_coordinator, ErrorCode.coordinator_not_available, ErrorCode.coordinator_load_in_progress}
)
#: Errors after which the node joins again at once, keeping its member id.
_REJOIN_ERRORS = frozenset({ErrorCode.rebalance_in_progress, ErrorCode.illegal_generation})


class Phase(Enum):
    """Which request the machine sends next."""

    FIND_COORDINATOR = ApiKey.FIND_COORDINATOR
    JOIN = ApiKey.JOIN_GROUP
    SYNC = ApiKey.SYNC_GROUP
    STABLE = ApiKey.HEARTBEAT
    LEAVE = ApiKey.LEAVE_GROUP
    LEFT = -1


class NodeState(StrEnum):
    """The node's state as ``GET /gateway/v2/fleet`` shows it."""

    JOINING = "joining"  # not in a generation yet since startup
    STABLE = "stable"  # in the current generation, heartbeating
    REBALANCING = "rebalancing"  # was in a generation, joining the next one
    OUTAGE = "outage"  # the cluster or the group's coordinator does not answer: still serving clients
    LEAVING = "leaving"
    LEFT = "left"


class FleetError(Exception):
    """What the node cannot go on with; ``exit_code`` is the process's."""

    exit_code = 1


class IncompatibleMembership(FleetError):
    """A member of another membership protocol is in the group (spec 03: exit code 41)."""

    exit_code = 41


class GroupAccessDenied(FleetError):
    """The group's ACLs refuse the node at startup."""


class SessionTimeoutRefused(FleetError):
    """The cluster refuses the session timeout (outside its group.min/max.session.timeout.ms)."""

    exit_code = 2


def incompatible_message(group_id: str, detail: str) -> str:
    """Why the node stops, with the ways out (spec 03, breaking changes 2 and 3)."""
    return (
        f"membership group {group_id!r}: {detail}. This node speaks membership protocol"
        f" {MEMBERSHIP_PROTOCOL_VERSION} (protocol type {PROTOCOL_TYPE!r}, protocol {PROTOCOL_NAME!r}), and one group"
        " holds one protocol: nodes of an older Kanal are running with the same GATEWAY_GROUP_ID. To upgrade"
        " without downtime, give the new nodes another GATEWAY_GROUP_ID (with group ACLs, grant the gateway"
        " Read on it first) and drop the old group's ACL once every node is upgraded; or stop every older"
        " node before starting a new one. See docs/fleet.md"
    )


def access_denied_message(group_id: str) -> str:
    return (
        f"the backing cluster refused the membership group {group_id!r} (GROUP_AUTHORIZATION_FAILED): grant the"
        f" gateway's principal Read on the group {group_id!r} (kafka-acls --add --allow-principal"
        f" User:<gateway> --operation Read --group {group_id}), or set GATEWAY_GROUP_ID to a group it may read"
    )


@dataclass(frozen=True)
class MemberConfig:
    """How a node joins: the group, its metadata and the timings (``KAFKA_*_MS``)."""

    group_id: str
    metadata: MemberMetadata
    session_timeout_ms: int = 45000
    heartbeat_interval_ms: int = 3000
    rebalance_timeout_ms: int | None = None  # None: the session timeout (a node rejoins at its next heartbeat)
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 2000


@dataclass(frozen=True)
class Member:
    """A member of the last member list: its metadata, or why it could not be read."""

    member_id: str
    metadata: MemberMetadata | None
    error: str | None = None


@dataclass(frozen=True)
class Coordinator:
    node_id: int
    host: str
    port: int


@dataclass(frozen=True)
class FleetStatus:
    """A snapshot of what the node knows of its fleet."""

    group_id: str
    state: NodeState
    member_id: str
    generation: int
    leader_id: str
    members: tuple[Member, ...]
    node: MemberMetadata
    last_error: str | None


# -- events: what a response changed, for the driver's logs and gauge ---------------------------


@dataclass(frozen=True)
class Assigned:
    """A new member list (SyncGroup answered)."""

    generation: int
    leader: bool
    members: tuple[Member, ...]


@dataclass(frozen=True)
class Rejoining:
    """The node left its generation to join the next one."""

    reason: str


@dataclass(frozen=True)
class Unavailable:
    """The cluster or the coordinator stopped answering (the node keeps serving its clients)."""

    reason: str


@dataclass(frozen=True)
class Left:
    """The node left the group, or gave up leaving (``failure`` says why: its session then expires)."""

    failure: str | None = None


Event = Assigned | Rejoining | Unavailable | Left | None


def _build(cls: Any, **values: Any) -> Any:
    """An entity with the given fields its version has (the others are left out)."""
    return build(cls, **{k: v for k, v in values.items() if has_field(cls, k)})


def _ms(value: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


def read_member(member_id: str, blob: bytes) -> Member:
    """A member from its metadata blob; an unreadable one is kept, with the reason."""
    try:
        return Member(member_id, decode_metadata(blob))
    except MetadataError as exc:
        return Member(member_id, None, str(exc))


def check_versions(group_id: str, members: Iterable[Member]) -> None:
    """Raises :class:`IncompatibleMembership` for a member of an older membership protocol (a broker
    keeps other protocol types out of a group; this catches an older node that kept the type)."""
    for member in members:
        metadata = member.metadata
        if metadata is not None and metadata.protocol_version < MEMBERSHIP_PROTOCOL_VERSION:
            raise IncompatibleMembership(
                incompatible_message(
                    group_id,
                    f"member {member.member_id} (node {metadata.node_id} at {metadata.host}:{metadata.first_port},"
                    f" Kanal {metadata.version}) speaks membership protocol {metadata.protocol_version}",
                )
            )


class GroupMember:
    """One node's side of the membership group protocol. Times are seconds on the driver's clock."""

    def __init__(self, config: MemberConfig, now: float) -> None:
        self.config = config
        self.group_id = config.group_id
        self._metadata = encode_metadata(config.metadata)
        self.phase = Phase.FIND_COORDINATOR
        self.member_id = ""
        self.generation = -1
        self.leader_id = ""
        self.coordinator: Coordinator | None = None
        self.members: tuple[Member, ...] = ()  # the last member list
        self.last_error: str | None = None
        self._due = now
        self._backoff = 0.0
        self._failing = False  # the last call failed for want of the cluster or the coordinator
        self._synced = False  # in a generation (SyncGroup answered, no rebalance seen since)
        self._was_stable = False
        self._assignment = b""  # the leader's member list for this generation
        self._joined: tuple[str, ...] = ()  # the leader's members of this generation

    # -- what the driver asks ---------------------------------------------------------------------

    @property
    def state(self) -> NodeState:
        if self.phase is Phase.LEFT:
            return NodeState.LEFT
        if self.phase is Phase.LEAVE:
            return NodeState.LEAVING
        if self._failing:
            return NodeState.OUTAGE
        if self._synced:
            return NodeState.STABLE
        return NodeState.REBALANCING if self._was_stable else NodeState.JOINING

    @property
    def is_leader(self) -> bool:
        return bool(self.member_id) and self.member_id == self.leader_id

    @property
    def to_coordinator(self) -> bool:
        """Whether the next request goes to the coordinator (else to any bootstrap server)."""
        return self.phase is not Phase.FIND_COORDINATOR

    def due(self) -> float:
        """When the next request is due (infinity once the node left)."""
        return math.inf if self.phase is Phase.LEFT else self._due

    def request_timeout(self) -> float:
        """How long the next request may take: a JoinGroup waits for the rebalance (as Kafka's
        consumer, the rebalance timeout and 5 s more); the others a session timeout."""
        session = self.config.session_timeout_ms / 1000
        if self.phase is Phase.JOIN:
            return self.rebalance_timeout_ms / 1000 + 5.0
        return session

    @property
    def rebalance_timeout_ms(self) -> int:
        return self.config.rebalance_timeout_ms or self.config.session_timeout_ms

    def status(self) -> FleetStatus:
        members = self.members or (Member(self.member_id, self.config.metadata),)
        return FleetStatus(
            self.group_id,
            self.state,
            self.member_id,
            self.generation,
            self.leader_id,
            members,
            self.config.metadata,
            self.last_error,
        )

    def request(self, request_class: RequestClass) -> Any:
        """The next request, built with ``request_class(api_key)`` (the connection's version)."""
        phase = self.phase
        if phase is Phase.LEFT:
            raise RuntimeError("the node left the group: nothing more to send")
        cls = request_class(phase.value)
        group = self.group_id
        if phase is Phase.FIND_COORDINATOR:
            return _build(cls, key=group, key_type=0, coordinator_keys=(group,))
        if phase is Phase.JOIN:
            protocol = build(nested(cls, "protocols"), name=PROTOCOL_NAME, metadata=self._metadata)
            return _build(
                cls,
                group_id=group,
                session_timeout=_ms(self.config.session_timeout_ms),
                rebalance_timeout=_ms(self.rebalance_timeout_ms),
                member_id=self.member_id,
                protocol_type=PROTOCOL_TYPE,
                protocols=(protocol,),
                reason="gateway node joining its fleet",
            )
        if phase is Phase.SYNC:
            assignment = nested(cls, "assignments")
            assignments = tuple(build(assignment, member_id=m, assignment=self._assignment) for m in self._joined)
            return _build(
                cls,
                group_id=group,
                generation_id=self.generation,
                member_id=self.member_id,
                protocol_type=PROTOCOL_TYPE,
                protocol_name=PROTOCOL_NAME,
                assignments=assignments if self.is_leader else (),
            )
        if phase is Phase.STABLE:
            return _build(cls, group_id=group, generation_id=self.generation, member_id=self.member_id)
        if has_field(cls, "members"):  # LeaveGroup v3+: a batch of members
            identity = _build(nested(cls, "members"), member_id=self.member_id, reason="gateway node shutting down")
            return _build(cls, group_id=group, members=(identity,))
        return _build(cls, group_id=group, member_id=self.member_id)

    # -- what happened ----------------------------------------------------------------------------

    def receive(self, response: Any, now: float) -> Event:
        """Reads the answer to the last :meth:`request`."""
        api_key = int(type(response).__api_key__)
        if api_key != self.phase.value:
            raise ValueError(f"a response of api key {api_key} in phase {self.phase.name}")
        if self.phase is Phase.FIND_COORDINATOR:
            return self._found(response, now)
        if self.phase is Phase.JOIN:
            return self._joined_group(response, now)
        if self.phase is Phase.SYNC:
            return self._synced_group(response, now)
        if self.phase is Phase.STABLE:
            return self._heartbeat(response, now)
        self.phase = Phase.LEFT
        code = response.error_code
        return Left(None if code is ErrorCode.none else f"LeaveGroup: {code.name.upper()}")

    def connection_failed(self, reason: str, now: float) -> Event:
        """The call failed for want of an answer (connection refused or lost, timed out): find the
        coordinator again after a pause; the member id and generation are kept for the rejoin."""
        if self.phase in (Phase.LEAVE, Phase.LEFT):
            self.phase = Phase.LEFT
            return Left(reason)
        self.phase = Phase.FIND_COORDINATOR
        return self._retry(now, reason, outage=True)

    def leave(self, now: float) -> bool:
        """Starts leaving the group; whether a LeaveGroup is to be sent (not when the node has no
        member id or no coordinator to tell)."""
        if self.phase in (Phase.LEAVE, Phase.LEFT):
            return self.phase is Phase.LEAVE
        if not self.member_id or self.coordinator is None:
            self.phase = Phase.LEFT
            return False
        self.phase = Phase.LEAVE
        self._due = now
        return True

    def stop(self) -> None:
        """Gives up the group without a word (a fatal error, or no answer to the leave)."""
        self.phase = Phase.LEFT

    # -- transitions ------------------------------------------------------------------------------

    def _ok(self) -> None:
        self._backoff = 0.0
        self._failing = False
        self.last_error = None

    def _retry(self, now: float, reason: str, *, outage: bool = False) -> Event:
        base, cap = self.config.retry_backoff_ms / 1000, self.config.retry_backoff_max_ms / 1000
        self._backoff = min(max(self._backoff * 2, base), cap)
        self._due = now + self._backoff
        self.last_error = reason
        if outage and not self._failing:
            self._failing = True
            return Unavailable(reason)
        return None

    def _rejoin(self, now: float, reason: str, *, forget_member_id: bool = False) -> Event:
        if forget_member_id:
            self.member_id = ""
            self.generation = -1
        was_synced, self._synced = self._synced, False
        self.phase = Phase.JOIN
        self._due = now
        return Rejoining(reason) if was_synced else None

    def _coordinator_lost(self, now: float, code: ErrorCode, call: str) -> Event:
        self.phase = Phase.FIND_COORDINATOR
        if code is ErrorCode.not_coordinator:  # it moved: look it up at once
            self._due = now
            return None
        return self._retry(now, f"{call}: {code.name.upper()}", outage=True)

    def _denied(self, now: float) -> Event:
        message = access_denied_message(self.group_id)
        if not self._was_stable:
            raise GroupAccessDenied(message)
        self.phase = Phase.FIND_COORDINATOR  # an ACL removed while running: go on serving, keep asking
        return self._retry(now, message, outage=True)

    def _found(self, response: Any, now: float) -> Event:
        if has_field(type(response), "coordinators"):  # v4+: one entry per key asked
            entry = next((c for c in response.coordinators if c.key == self.group_id), None)
            if entry is None:
                return self._retry(now, "FindCoordinator: the answer names no coordinator", outage=True)
        else:
            entry = response
        code = entry.error_code
        if code is ErrorCode.group_authorization_failed:
            return self._denied(now)
        if code is not ErrorCode.none:
            return self._retry(now, f"FindCoordinator: {code.name.upper()}", outage=True)
        self.coordinator = Coordinator(int(entry.node_id), str(entry.host), int(entry.port))
        self._ok()
        # back in the generation it was in (heartbeats tell whether it still is), else a join
        self.phase = Phase.STABLE if self._synced else Phase.JOIN
        self._due = now
        return None

    def _joined_group(self, response: Any, now: float) -> Event:
        code = response.error_code
        if code is ErrorCode.member_id_required:  # KIP-394: join again with the id the broker gave
            self.member_id = str(response.member_id)
            self._due = now
            return None
        if code is ErrorCode.none:
            protocol_type = getattr(response, "protocol_type", None)
            protocol_name = response.protocol_name
            if protocol_type not in (None, PROTOCOL_TYPE) or protocol_name not in (None, "", PROTOCOL_NAME):
                raise IncompatibleMembership(
                    incompatible_message(self.group_id, f"the group runs protocol {protocol_type}/{protocol_name}")
                )
            self._ok()
            self.member_id = str(response.member_id)
            self.generation = int(response.generation_id)
            self.leader_id = str(response.leader)
            if self.is_leader:
                self._lead(response.members)
            self.phase = Phase.SYNC
            self._due = now
            return None
        if code is ErrorCode.inconsistent_group_protocol:
            raise IncompatibleMembership(
                incompatible_message(
                    self.group_id,
                    "the cluster refused this node (INCONSISTENT_GROUP_PROTOCOL): a live member of the group"
                    " speaks another protocol",
                )
            )
        if code is ErrorCode.invalid_session_timeout:
            raise SessionTimeoutRefused(
                f"the backing cluster refused KAFKA_SESSION_TIMEOUT_MS={self.config.session_timeout_ms} for the"
                f" membership group {self.group_id!r} (INVALID_SESSION_TIMEOUT): it must lie within the brokers'"
                " group.min.session.timeout.ms and group.max.session.timeout.ms (6000 and 1800000 by default)"
            )
        return self._group_error(code, now, "JoinGroup")

    def _lead(self, joined: Iterable[Any]) -> None:
        """The leader's work: the member list of the generation, the same for every member."""
        blobs = [(str(m.member_id), bytes(m.metadata)) for m in joined]
        check_versions(self.group_id, (read_member(member_id, blob) for member_id, blob in blobs))
        self._joined = tuple(member_id for member_id, _ in blobs)
        self._assignment = encode_member_list(self.generation, self.member_id, blobs)

    def _synced_group(self, response: Any, now: float) -> Event:
        code = response.error_code
        if code is not ErrorCode.none:
            return self._group_error(code, now, "SyncGroup")
        self._ok()
        self.members = self._member_list(bytes(response.assignment))
        check_versions(self.group_id, self.members)
        self._synced = self._was_stable = True
        self.phase = Phase.STABLE
        self._due = now + self.config.heartbeat_interval_ms / 1000
        return Assigned(self.generation, self.is_leader, self.members)

    def _member_list(self, blob: bytes) -> tuple[Member, ...]:
        """The members of the assignment; this node alone (and the reason kept) when there is none
        to read, so the node still shows itself."""
        myself = Member(self.member_id, self.config.metadata)
        try:
            listed = decode_member_list(blob) if blob else None
        except MetadataError as exc:
            self.last_error = f"the leader's member list is unreadable: {exc}"
            return (myself,)
        if listed is None:
            return (myself,)
        members = tuple(read_member(member_id, metadata) for member_id, metadata in listed.members)
        if not any(m.member_id == self.member_id for m in members):
            members += (myself,)
        return members

    def _heartbeat(self, response: Any, now: float) -> Event:
        code = response.error_code
        if code is ErrorCode.none:
            self._ok()
            self._due = now + self.config.heartbeat_interval_ms / 1000
            return None
        return self._group_error(code, now, "Heartbeat")

    def _group_error(self, code: ErrorCode, now: float, call: str) -> Event:
        """An error of JoinGroup, SyncGroup or Heartbeat that the node survives."""
        if code in _REJOIN_ERRORS:
            return self._rejoin(now, f"{call}: {code.name.upper()}")
        if code is ErrorCode.unknown_member_id:  # the session expired (an outage, a pause): join anew
            return self._rejoin(now, f"{call}: UNKNOWN_MEMBER_ID", forget_member_id=True)
        if code in _COORDINATOR_ERRORS:
            return self._coordinator_lost(now, code, call)
        if code is ErrorCode.group_authorization_failed:
            return self._denied(now)
        # anything else (GROUP_MAX_SIZE_REACHED, UNKNOWN_SERVER_ERROR...): join again after a pause
        event = self._rejoin(now, f"{call}: {code.name.upper()}")
        self._retry(now, f"{call}: {code.name.upper()}")
        return event


def describe_request(request_class: RequestClass, group_id: str) -> Any:
    """DescribeGroups of the group, to name what a refused node met in its log line."""
    return _build(request_class(ApiKey.DESCRIBE_GROUPS), groups=(group_id,))


def describe_detail(response: Any, group_id: str) -> str | None:
    """What a DescribeGroups answer says of the group's protocol, or None."""
    for group in response.groups:
        if group.group_id == group_id and group.error_code is ErrorCode.none and group.protocol_type:
            protocol = f", protocol {group.protocol_data!r}" if group.protocol_data else ""
            return f"the group runs protocol type {group.protocol_type!r}{protocol} with {len(group.members)} member(s)"
    return None
