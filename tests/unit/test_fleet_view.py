"""``GET /gateway/v2/fleet`` and the ``gateway_fleet_members`` gauge, on the real admin app (quart-trio's
test client) with a membership driven through its state machine, without a broker."""

from __future__ import annotations

import base64
from typing import Any

import trio
from kio.schema.errors import ErrorCode
from prometheus_client.parser import text_string_to_metric_families

from kanal.admin.service import build_admin
from kanal.admin.store import MemoryLog
from kanal.config.settings import build_settings
from kanal.gateway import Gateway
from kanal.net.membership import FleetMembership
from kanal.pipeline.registry import PluginRegistry
from kanal.protocol.api import ApiKey, response_class
from kanal.protocol.entities import build, nested
from kanal.protocol.member_metadata import MemberMetadata, encode_member_list, encode_metadata
from kanal.protocol.membership import MemberConfig

USERS = "[{username: admin, password: secret, admin: true}, {username: viewer, password: look}]"
VIEWER = {"Authorization": "Basic " + base64.b64encode(b"viewer:look").decode()}


def node(name: str, port: int) -> MemberMetadata:
    return MemberMetadata(name, "127.0.0.1", port, port + 2, port + 100, "rack-1", "0.1.0", 1_700_000_000_000)


def gateway_with_fleet() -> tuple[Gateway, FleetMembership]:
    settings = build_settings({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "GATEWAY_ADMIN_API_USERS": USERS})
    gateway = Gateway(settings, PluginRegistry())
    config = MemberConfig("kanal_gateway-fleet", node("me", 7000), session_timeout_ms=6000, heartbeat_interval_ms=500)
    gateway.fleet = FleetMembership(
        config, settings.upstream, 1.0, 1 << 20, on_members=gateway.metrics.fleet_members.set
    )
    return gateway, gateway.fleet


def get(gateway: Gateway, *paths: str, headers: dict[str, str] = VIEWER) -> list[Any]:
    """The answers (status, JSON or text) to GETs of ``paths`` on the gateway's admin app (built once)."""
    api = build_admin(gateway, writer=MemoryLog())
    answers: list[Any] = []

    async def main() -> None:
        async with api.app.test_app() as app:
            client = app.test_client()
            for path in paths:
                response = await client.get(path, headers=headers)
                body = await response.get_data(as_text=True)
                answers.append(
                    (response.status_code, await response.get_json() if "json" in response.content_type else body)
                )

    trio.run(main)
    return answers


def join_as_follower(fleet: FleetMembership) -> None:
    """The membership through a join in which another node leads a group of two."""
    member = fleet.member
    find = response_class(ApiKey.FIND_COORDINATOR, 6)
    entry = build(nested(find, "coordinators"), key="kanal_gateway-fleet", node_id=1, host="b", port=9092)
    member.receive(build(find, coordinators=(entry,)), 0.0)
    joined = response_class(ApiKey.JOIN_GROUP, 9)
    member.receive(build(joined, generation_id=4, leader="m-other", member_id="m-me", protocol_name="v1"), 0.0)
    members = [("m-other", encode_metadata(node("other", 8000))), ("m-me", encode_metadata(node("me", 7000)))]
    sync = response_class(ApiKey.SYNC_GROUP, 5)
    event = member.receive(build(sync, assignment=encode_member_list(4, "m-other", members)), 0.0)
    fleet._report(event, member.state)


def test_before_joining_the_node_shows_itself_joining() -> None:
    gateway, _ = gateway_with_fleet()
    [(status, body)] = get(gateway, "/gateway/v2/fleet")
    assert status == 200
    assert (body["groupId"], body["state"], body["generation"], body["leader"]) == (
        "kanal_gateway-fleet",
        "joining",
        -1,
        None,
    )
    assert (body["protocolType"], body["protocol"], body["membershipProtocolVersion"]) == ("kanal-fleet", "v1", 1)
    [me] = body["members"]
    assert (me["self"], me["state"], me["nodeId"], me["ports"], me["rack"]) == (
        True,
        "joining",
        "me",
        {"first": 7000, "last": 7002, "http": 7100},
        "rack-1",
    )
    assert me["startTime"] == "2023-11-14T22:13:20.000+00:00"


def test_members_and_the_gauge_follow_the_member_list() -> None:
    gateway, fleet = gateway_with_fleet()
    join_as_follower(fleet)
    [(status, body), (_, metrics)] = get(gateway, "/gateway/v2/fleet", "/metrics")
    assert status == 200 and body["state"] == "stable" and body["generation"] == 4 and body["leader"] == "m-other"
    assert [(m["nodeId"], m["self"], m["leader"], m["state"]) for m in body["members"]] == [
        ("other", False, True, "stable"),
        ("me", True, False, "stable"),
    ]
    gauges = {s.name: s.value for f in text_string_to_metric_families(metrics) for s in f.samples}
    assert gauges["gateway_fleet_members"] == 2


def test_during_an_outage_the_node_says_so_and_keeps_the_last_list() -> None:
    gateway, fleet = gateway_with_fleet()
    join_as_follower(fleet)
    fleet.member.connection_failed("connection refused", 1.0)
    [(_, body)] = get(gateway, "/gateway/v2/fleet")
    assert (body["state"], body["lastError"]) == ("outage", "connection refused")
    assert [(m["nodeId"], m["state"]) for m in body["members"]] == [("other", "stable"), ("me", "outage")]


def test_a_member_with_unreadable_metadata_is_listed_with_the_reason() -> None:
    gateway, fleet = gateway_with_fleet()
    join_as_follower(fleet)
    fleet.member.receive(build(response_class(ApiKey.HEARTBEAT, 4), error_code=ErrorCode.rebalance_in_progress), 1.0)
    joined = response_class(ApiKey.JOIN_GROUP, 9)
    fleet.member.receive(build(joined, generation_id=5, leader="m-x", member_id="m-me", protocol_name="v1"), 1.0)
    blob = encode_member_list(5, "m-x", [("m-x", b"not ours"), ("m-me", encode_metadata(node("me", 7000)))])
    fleet.member.receive(build(response_class(ApiKey.SYNC_GROUP, 5), assignment=blob), 1.0)
    [(_, body)] = get(gateway, "/gateway/v2/fleet")
    odd = body["members"][0]
    assert odd["memberId"] == "m-x" and "not Kanal member metadata" in odd["error"] and "nodeId" not in odd


def test_a_node_without_membership_answers_404_and_credentials_are_required() -> None:
    settings = build_settings({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "GATEWAY_ADMIN_API_USERS": USERS})
    gateway = Gateway(settings, PluginRegistry(), fleet=False)
    [(status, body)] = get(gateway, "/gateway/v2/fleet")
    assert status == 404 and "does not join a membership group" in body["msg"]
    other, _ = gateway_with_fleet()
    [(anonymous, _)] = get(other, "/gateway/v2/fleet", headers={})
    assert anonymous == 401


def test_the_openapi_document_describes_the_fleet_route() -> None:
    gateway, _ = gateway_with_fleet()
    [(_, document)] = get(gateway, "/openapi.json")
    operation = document["paths"]["/gateway/v2/fleet"]["get"]
    schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert "members" in schema["properties"] and "403" not in operation["responses"]  # read-only users may
