"""``consumer-group-policy`` and ``client-id-policy``: JoinGroup and client id checks, in the
harness (decisions, overrides, audit) and through the gateway with real clients."""

from __future__ import annotations

import datetime
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from kanal_safeguards.decisions import PREFIX
from kanal_safeguards.policies.client_id import ClientIdPolicy, render
from kanal_safeguards.policies.consumer_group import ConsumerGroupPolicy
from kio.schema.list_groups.v4.request import ListGroupsRequest
from safeguard_clients import audit_events, bootstrap_of, direct, safeguards_gateway, spec, through, unique, wait_for
from wire import WireClient

from kanal.api import (
    ApiKey,
    Connection,
    ErrorCode,
    InterceptorConfigError,
    build,
    nested,
    require_request_class,
    response_class,
)
from kanal.embedded import TansuBroker
from kanal.testing import FakeServices, Harness

POLICY_VIOLATION = int(ErrorCode.policy_violation)


def join_request(
    group: str, *, version: int = 5, member: str = "", instance: str | None = None, session_ms: int = 6000
) -> Any:
    cls = require_request_class(ApiKey.JOIN_GROUP, version)
    protocol = build(nested(cls, "protocols"), name="range", metadata=b"")
    fields: dict[str, Any] = {
        "group_id": group,
        "session_timeout": datetime.timedelta(milliseconds=session_ms),
        "rebalance_timeout": datetime.timedelta(seconds=6),
        "member_id": member,
        "protocol_type": "consumer",
        "protocols": (protocol,),
    }
    if version >= 5:
        fields["group_instance_id"] = instance
    return build(cls, **fields)


def join_answer(request: Any) -> Any:
    return build(response_class(ApiKey.JOIN_GROUP, int(request.__version__)), error_code=ErrorCode.member_id_required)


def through_harness(config: dict[str, Any], request: Any) -> tuple[Any, list[dict[str, Any]]]:
    """The exchange of ``request`` through a consumer-group-policy, and the audit data."""
    services = FakeServices()
    harness = Harness(services=services)
    harness.add(ConsumerGroupPolicy, config)
    exchange = trio.run(harness.request, request, join_answer)
    return exchange, [data for _, _, data in services.audited]


# -- consumer-group-policy ---------------------------------------------------------------------------


def test_a_group_id_against_the_convention_is_refused_at_join() -> None:
    config = {"groupId": {"value": "team-.*"}}
    exchange, audited = through_harness(config, join_request("rogue"))
    assert exchange.forwarded is None and exchange.response.error_code == POLICY_VIOLATION
    assert audited == [
        {"plugin": "consumer-group-policy", "action": "BLOCK", "groupId": "rogue", "memberId": "",
         "reasons": ["GroupId 'rogue' is invalid."]}
    ]  # fmt: skip
    exchange, audited = through_harness(config, join_request("team-a"))
    assert exchange.forwarded is not None and exchange.response.error_code == ErrorCode.member_id_required
    assert audited == []


def test_a_consumer_without_group_instance_id_gets_the_configured_action() -> None:
    """Fixed in 3.22.0: reported with the rule's action, never UNKNOWN_SERVER_ERROR."""
    block = {"groupInstanceId": {"value": "static-.*"}}
    for request in (join_request("g"), join_request("g", version=4)):  # v4 cannot even carry one
        exchange, audited = through_harness(block, request)
        assert exchange.response.error_code == POLICY_VIOLATION
        assert audited[0]["reasons"] == ["GroupInstanceId is not set (group.instance.id), must match 'static-.*'."]
    exchange, _ = through_harness(block, join_request("g", instance="static-1"))
    assert exchange.forwarded is not None
    exchange, _ = through_harness(block, join_request("g", instance="dynamic-1"))
    assert exchange.response.error_code == POLICY_VIOLATION
    exchange, audited = through_harness(
        {"groupInstanceId": {"value": "static-.*", "action": "INFO"}}, join_request("g")
    )
    assert exchange.forwarded is not None and [a["action"] for a in audited] == ["INFO"]


def test_member_ids_are_checked_once_the_broker_named_them() -> None:
    config = {"memberId": {"value": "app-.*"}}
    exchange, audited = through_harness(config, join_request("g"))  # a first join: no member id yet
    assert exchange.forwarded is not None and audited == []
    exchange, audited = through_harness(config, join_request("g", member="rdkafka-1234"))
    assert exchange.response.error_code == POLICY_VIOLATION
    assert audited[0]["reasons"] == ["MemberId 'rdkafka-1234' is invalid."]


def test_timeouts_are_overridden_and_audited_with_both_values() -> None:
    config = {
        "sessionTimeoutMs": {"min": 6000, "max": 30000, "action": "OVERRIDE", "overrideValue": 10000},
        "rebalanceTimeoutMs": {"max": 60000},
    }
    exchange, audited = through_harness(config, join_request("g", session_ms=45000))
    assert exchange.forwarded.session_timeout == datetime.timedelta(seconds=10)
    assert exchange.forwarded.rebalance_timeout == datetime.timedelta(seconds=6)
    assert audited == [
        {"plugin": "consumer-group-policy", "action": "OVERRIDE", "groupId": "g", "memberId": "",
         "reasons": ["sessionTimeoutMs is '45000', must not be greater than '30000'"],
         "overrides": [{"field": "sessionTimeoutMs", "from": 45000, "to": 10000}]}
    ]  # fmt: skip
    exchange, audited = through_harness(config, join_request("g", session_ms=20000))
    assert exchange.forwarded.session_timeout == datetime.timedelta(seconds=20) and audited == []


def test_consumer_group_configs_are_validated() -> None:
    harness = Harness()
    with pytest.raises(InterceptorConfigError, match="overrideValue must not be null"):
        harness.add(ConsumerGroupPolicy, {"sessionTimeoutMs": {"max": 1, "action": "OVERRIDE"}})
    with pytest.raises(InterceptorConfigError, match="not a valid regex"):
        harness.add(ConsumerGroupPolicy, {"groupId": {"value": "(["}})
    with pytest.raises(InterceptorConfigError, match="groupIds"):
        harness.add(ConsumerGroupPolicy, {"groupIds": {"value": ".*"}})
    with pytest.raises(InterceptorConfigError, match="groupId: action OVERRIDE"):
        harness.add(ConsumerGroupPolicy, {"groupId": {"value": ".*", "action": "OVERRIDE"}})


def test_a_confluent_consumer_with_a_bad_group_id_cannot_join(tansu: TansuBroker) -> None:
    topic, group = unique("gl-cg"), unique("rogue")
    admin = AdminClient(direct(tansu))
    for future in admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)]).values():
        future.result(30)
    policy = {"groupId": {"value": "team-.*"}, "groupInstanceId": {"value": "static-.*"}}
    with safeguards_gateway(tansu, [spec("groups", "consumer-group-policy", policy)]) as gateway:
        settings = {"group.id": group, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
        consumer = Consumer(through(gateway, **settings))
        errors: list[KafkaError] = []
        try:
            consumer.subscribe([topic])

            def refused() -> bool:
                message = consumer.poll(0.2)
                if message is not None and message.error() is not None:
                    errors.append(message.error())
                return bool(errors)

            wait_for(refused, timeout=60)
        finally:
            consumer.close()
        assert errors[0].code() == KafkaError.POLICY_VIOLATION
        data = wait_for(lambda: audit_events(gateway))[0]["eventData"]
        assert (data["action"], data["groupId"]) == ("BLOCK", group)
        assert data["reasons"] == [
            f"GroupId '{group}' is invalid.",
            "GroupInstanceId is not set (group.instance.id), must match 'static-.*'.",
        ]
        # the same check on the wire: a dynamic member of a good group, refused with the policy code
        client = WireClient(bootstrap_of(gateway), timeout=30)
        try:
            assert client.call(join_request("team-a")).error_code == POLICY_VIOLATION
        finally:
            client.close()


# -- client-id-policy --------------------------------------------------------------------------------


def test_client_id_templates_render_and_configs_are_validated() -> None:
    connection = Connection(1, "10.1.2.3:5555", "127.0.0.1:6969", 0, principal="alice")
    assert render("clientId-{{userIp}}-{{user}}-{{clientId}}-x", connection, "app") == "clientId-10.1.2.3-alice-app-x"
    assert len(render("{{uuid}}", connection, None)) == 36
    harness = Harness()
    with pytest.raises(InterceptorConfigError, match=r"unknown template variable \{\{userIP\}\}"):
        harness.add(ClientIdPolicy, {"clientIdTemplate": "x-{{userIP}}"})
    with pytest.raises(InterceptorConfigError, match="clientIdTemplate must not be null when the action is OVERRIDE"):
        harness.add(ClientIdPolicy, {"action": "OVERRIDE"})
    with pytest.raises(InterceptorConfigError, match="not a valid regex"):
        harness.add(ClientIdPolicy, {"namingConvention": "(["})


def test_override_sends_the_request_upstream_with_the_rendered_client_id() -> None:
    harness = Harness()
    config = {"namingConvention": "app-.*", "action": "OVERRIDE", "clientIdTemplate": "app-{{clientId}}-{{userIp}}"}
    harness.add(ClientIdPolicy, config)
    request = ListGroupsRequest(states_filter=())
    exchange = trio.run(partial(harness.request, request, client_id="laptop"))
    assert exchange.client_id == "app-laptop-127.0.0.1"
    kept = trio.run(partial(harness.request, request, client_id="app-ok"))
    assert kept.client_id == "app-ok"
    [(kind, _, data)] = harness.services.audited
    assert (kind, data["action"], data["overrides"]) == (
        "SAFEGUARD",
        "OVERRIDE",
        [{"field": "clientId", "from": "laptop", "to": "app-laptop-127.0.0.1"}],
    )


def test_the_broker_sees_the_overridden_client_id(tansu: TansuBroker) -> None:
    """Two gateways in a row: the first rewrites the client id, the second lets through only
    rewritten ids, so a topic is created only if the rewritten id is what went on the wire."""
    guard = [spec("only-rewritten", "client-id-policy", {"namingConvention": "app-.*"})]
    rewrite = {"namingConvention": "app-.*", "action": "OVERRIDE", "clientIdTemplate": "app-{{clientId}}"}
    with safeguards_gateway(tansu, guard) as inner:
        upstream = SimpleNamespace(bootstrap=bootstrap_of(inner), node_id=tansu.node_id)
        with safeguards_gateway(upstream, [spec("rewrite", "client-id-policy", rewrite)]) as outer:  # type: ignore[arg-type]
            name = unique("gl-cid-override")
            create_topic(bootstrap_of(outer), "laptop", name)
            assert name in AdminClient(direct(tansu)).list_topics(timeout=30).topics
            with pytest.raises(KafkaException):  # the inner gateway alone refuses the raw id
                create_topic(bootstrap_of(inner), "laptop", unique("gl-cid-raw"))


def create_topic(bootstrap: str, client_id: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": client_id})
    futures = admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])
    for future in futures.values():
        future.result(30)


def test_requests_of_a_client_id_against_the_convention_are_refused(tansu: TansuBroker) -> None:
    config = {"namingConvention": "app-[a-z]+-[0-9]+"}
    with safeguards_gateway(tansu, [spec("client-ids", "client-id-policy", config)]) as gateway:
        bad = unique("gl-cid-bad")
        with pytest.raises(KafkaException) as refused:
            create_topic(bootstrap_of(gateway), "my laptop", bad)
        error = refused.value.args[0]
        assert error.code() == KafkaError.POLICY_VIOLATION
        assert error.str() == f"{PREFIX} ClientId 'my laptop' is invalid."
        good = unique("gl-cid-good")
        create_topic(bootstrap_of(gateway), "app-billing-1", good)
        topics = AdminClient(direct(tansu)).list_topics(timeout=30).topics
        assert good in topics and bad not in topics
        [event] = wait_for(lambda: audit_events(gateway))  # once per connection and client id
        data = event["eventData"]
        assert (data["plugin"], data["action"], data["clientId"]) == ("client-id-policy", "BLOCK", "my laptop")


def test_info_lets_a_bad_client_id_through_and_audits_it(tansu: TansuBroker) -> None:
    config = {"namingConvention": "app-.*", "action": "INFO"}
    with safeguards_gateway(tansu, [spec("client-ids", "client-id-policy", config)]) as gateway:
        name = unique("gl-cid-info")
        create_topic(bootstrap_of(gateway), "scratch", name)
        assert name in AdminClient(direct(tansu)).list_topics(timeout=30).topics
        events = wait_for(lambda: audit_events(gateway))
        assert {(e["eventData"]["action"], e["eventData"]["clientId"]) for e in events} == {("INFO", "scratch")}
