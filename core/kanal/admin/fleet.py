"""``GET /gateway/v2/fleet``: the members of this node's fleet, as its membership group shows them.

This node's own state is live (joining, stable, rebalancing, outage, leaving); the others are as the
last member list the group's leader handed out says (they were ``stable`` in that generation).
``internalLoadBalancing`` shows what this node's answers spread clients over: the nodes they may
name now and the brokers' racks (the inputs of :mod:`kanal.protocol.balance`).
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from kanal.protocol.balance import LoadBalancer
from kanal.protocol.member_metadata import MEMBERSHIP_PROTOCOL_VERSION, PROTOCOL_NAME, PROTOCOL_TYPE, MemberMetadata
from kanal.protocol.membership import FleetStatus, Member, NodeState

if TYPE_CHECKING:
    from kanal.admin.app import AdminApi

#: The response's JSON schema, for the OpenAPI document.
FLEET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "groupId": {"type": "string", "description": "GATEWAY_GROUP_ID"},
        "protocolType": {"type": "string", "const": PROTOCOL_TYPE},
        "protocol": {"type": "string", "description": "the one protocol this node offers (v<membership version>)"},
        "membershipProtocolVersion": {"type": "integer"},
        "state": {"type": "string", "enum": [s.value for s in NodeState], "description": "this node's"},
        "generation": {"type": "integer", "description": "the group generation of the member list (-1: none)"},
        "memberId": {"type": "string", "description": "this node's member id ('' before it joined)"},
        "leader": {"type": ["string", "null"], "description": "the member id of the group's leader"},
        "lastError": {"type": ["string", "null"]},
        "internalLoadBalancing": {
            "type": "object",
            "description": "GATEWAY_FEATURE_FLAGS_INTERNAL_LOAD_BALANCING and what answers spread clients over",
            "properties": {
                "enabled": {"type": "boolean"},
                "leaving": {"type": "boolean", "description": "this node is shutting down: answers name others"},
                "nodes": {
                    "type": "array",
                    "description": "the nodes answers may name now (empty: this node alone answers with itself)",
                    "items": {
                        "type": "object",
                        "properties": {
                            "host": {"type": "string"},
                            "ports": {
                                "type": "object",
                                "properties": {"first": {"type": "integer"}, "last": {"type": "integer"}},
                            },
                            "rack": {"type": ["string", "null"]},
                        },
                    },
                },
                "brokerRacks": {
                    "type": "object",
                    "description": "backing broker id -> rack, as Metadata announces them",
                    "additionalProperties": {"type": ["string", "null"]},
                },
            },
        },
        "members": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "memberId": {"type": "string"},
                    "self": {"type": "boolean"},
                    "leader": {"type": "boolean"},
                    "state": {"type": "string"},
                    "nodeId": {"type": "string"},
                    "host": {"type": "string"},
                    "ports": {
                        "type": "object",
                        "properties": {
                            "first": {"type": "integer"},
                            "last": {"type": "integer"},
                            "http": {"type": "integer"},
                        },
                    },
                    "rack": {"type": ["string", "null"]},
                    "version": {"type": "string"},
                    "protocolVersion": {"type": "integer"},
                    "startTime": {"type": "string", "format": "date-time"},
                    "error": {"type": "string", "description": "why the member's metadata could not be read"},
                },
            },
        },
    },
}


def _time(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="milliseconds")


def _metadata(metadata: MemberMetadata) -> dict[str, Any]:
    return {
        "nodeId": metadata.node_id,
        "host": metadata.host,
        "ports": {"first": metadata.first_port, "last": metadata.last_port, "http": metadata.http_port},
        "rack": metadata.rack,
        "version": metadata.version,
        "protocolVersion": metadata.protocol_version,
        "startTime": _time(metadata.start_time_ms),
    }


def _member(member: Member, status: FleetStatus) -> dict[str, Any]:
    mine = member.metadata is not None and member.metadata.node_id == status.node.node_id
    out: dict[str, Any] = {
        "memberId": member.member_id,
        "self": mine,
        "leader": bool(member.member_id) and member.member_id == status.leader_id,
        "state": status.state.value if mine else NodeState.STABLE.value,
    }
    if member.metadata is not None:
        out.update(_metadata(member.metadata))
    else:
        out["error"] = member.error or "unreadable metadata"
    return out


def balancing_view(balancer: LoadBalancer | None) -> dict[str, Any]:
    """What this node's answers spread clients over (``enabled`` false: every answer names it)."""
    if balancer is None:
        return {"enabled": False}
    return {
        "enabled": True,
        "leaving": balancer.leaving,
        "unreachable": sorted(
            f"{n.host}:{n.first_port}" for n in balancer.members if n.identity in balancer.unreachable
        ),
        "nodes": [
            {"host": n.host, "ports": {"first": n.first_port, "last": n.last_port}, "rack": n.rack}
            for n in (balancer.nodes if balancer.balancing else ())
        ],
        "brokerRacks": {str(broker): rack for broker, rack in sorted(balancer.racks.items())},
    }


def fleet_view(status: FleetStatus, balancer: LoadBalancer | None = None) -> dict[str, Any]:
    """The JSON body of ``GET /gateway/v2/fleet``."""
    members = [_member(m, status) for m in status.members]
    if not any(m["self"] for m in members):  # (not in the last list: joining, or left)
        members.insert(
            0,
            {
                "memberId": status.member_id,
                "self": True,
                "leader": False,
                "state": status.state.value,
                **_metadata(status.node),
            },
        )
    return {
        "groupId": status.group_id,
        "protocolType": PROTOCOL_TYPE,
        "protocol": PROTOCOL_NAME,
        "membershipProtocolVersion": MEMBERSHIP_PROTOCOL_VERSION,
        "state": status.state.value,
        "generation": status.generation,
        "memberId": status.member_id,
        "leader": status.leader_id or None,
        "lastError": status.last_error,
        "internalLoadBalancing": balancing_view(balancer),
        "members": members,
    }


def add_routes(api: AdminApi) -> None:
    """Registers ``GET /gateway/v2/fleet`` (open to read-only users)."""
    from kanal.admin.app import API_PREFIX, error_response, json_response

    gateway = api.gateway

    async def fleet() -> Any:
        """The members of this node's fleet (its membership group GATEWAY_GROUP_ID) and their metadata.

        This node's state is live: joining, stable, rebalancing, outage (the cluster does not answer;
        the node still serves its clients), leaving. The other members are as the last member list of
        the group says.
        """
        membership = gateway.fleet
        if membership is None:
            return error_response(404, "Not found", "this node does not join a membership group")
        return json_response(fleet_view(membership.status(), membership.balancer))

    api.app.add_url_rule(f"{API_PREFIX}/fleet", "fleet", fleet, methods=["GET"])
    api.read_only_endpoints.add("fleet")
