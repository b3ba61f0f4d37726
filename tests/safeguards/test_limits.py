"""The rate limits: ``limit-commit-offset``, ``limit-join-group`` and ``limit-connection``.

Windows are counted with an injected clock (no sleeping); through the gateway, requests are
counted (how many were refused or throttled), never timed.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import trio
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from kanal_safeguards.base import with_throttle
from kanal_safeguards.decisions import PREFIX
from kanal_safeguards.limits.requests import LimitCommitOffset, LimitCommitOffsetConfig, LimitConnection, LimitJoinGroup
from kanal_safeguards.limits.windows import SlidingWindow
from safeguard_clients import audit_events, bootstrap_of, direct, safeguards_gateway, spec, through, unique, wait_for
from wire import WireClient, api_versions_request

from kanal.api import ApiKey, ErrorCode, InterceptorConfigError, build, nested, require_request_class, response_class
from kanal.embedded import TansuBroker
from kanal.testing import FakeServices, Harness

POLICY_VIOLATION = int(ErrorCode.policy_violation)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- the counting window ---------------------------------------------------------------------------


def test_a_sliding_window_counts_per_key() -> None:
    clock = Clock()
    window = SlidingWindow(3, 60.0, clock)
    assert [window.take("g") for _ in range(4)] == [True, True, True, False]
    assert window.take("other")  # each key has its own count
    clock.now += 59.9
    assert not window.take("g")  # the three are still within the last minute
    clock.now += 0.2
    assert window.take("g")  # the first three left the window: room for three again
    assert [window.take("g") for _ in range(3)] == [True, True, False]


def test_a_sliding_window_slides_one_event_at_a_time() -> None:
    clock = Clock()
    window = SlidingWindow(2, 1.0, clock)
    assert window.take("c")
    clock.now += 0.5
    assert window.take("c")
    assert not window.take("c")
    clock.now += 0.6  # the first event is older than a second, the second is not
    assert window.take("c")
    assert not window.take("c")


def test_events_let_through_over_the_limit_still_count() -> None:
    """INFO and THROTTLE let an event over the limit through: it happened, so it counts."""
    clock = Clock()
    window = SlidingWindow(2, 60.0, clock)
    assert [window.take("g", always=True) for _ in range(4)] == [True, True, False, False]
    clock.now += 30
    assert not window.take("g", always=True)
    clock.now += 29  # the last two counted, at +0 and +30, are both within the last minute
    assert not window.take("g")
    clock.now += 2  # the one at +0 left the window
    assert window.take("g")


def test_idle_keys_are_dropped_and_a_zero_limit_refuses_everything() -> None:
    clock = Clock()
    window = SlidingWindow(1, 10.0, clock)
    for n in range(100):
        window.take(f"group-{n}")
    assert len(window) == 100
    clock.now += 11
    window.take("fresh")
    assert len(window) == 1
    assert not SlidingWindow(0, 1.0, clock).take("any")


def test_throttled_sets_the_response_throttle_time() -> None:
    commit = build(response_class(ApiKey.OFFSET_COMMIT, 8))
    assert with_throttle(commit, 2500).throttle_time == datetime.timedelta(milliseconds=2500)
    busy = build(response_class(ApiKey.OFFSET_COMMIT, 8), throttle_time=datetime.timedelta(seconds=9))
    assert with_throttle(busy, 2500) is busy  # the broker's longer throttle is kept
    old = build(response_class(ApiKey.OFFSET_COMMIT, 2))  # no throttle time in v2
    assert with_throttle(old, 2500) is old


# -- configs ---------------------------------------------------------------------------------------


def test_limit_configs_are_validated() -> None:
    config = msgspec.convert({"maximumCommitsPerMinute": 5}, LimitCommitOffsetConfig)
    assert (config.group_id, config.action.value, config.throttle_time_ms) == (".*", "BLOCK", 100)
    harness = Harness()
    with pytest.raises(InterceptorConfigError, match="maximumCommitsPerMinute"):
        harness.add(LimitCommitOffset, {})
    with pytest.raises(InterceptorConfigError, match="maximumCommitsPerMinut"):
        harness.add(LimitCommitOffset, {"maximumCommitsPerMinut": 5})
    with pytest.raises(InterceptorConfigError, match="not a valid regex"):
        harness.add(LimitJoinGroup, {"maximumJoinsPerMinute": 5, "groupId": "(["})
    with pytest.raises(InterceptorConfigError, match="OVERRIDE is not one of BLOCK, INFO, THROTTLE"):
        harness.add(LimitJoinGroup, {"maximumJoinsPerMinute": 5, "action": "OVERRIDE"})
    with pytest.raises(InterceptorConfigError, match="throttleTimeMs"):
        harness.add(LimitConnection, {"maximumConnectionsPerSecond": 5, "throttleTimeMs": -1})


# -- limit-commit-offset and limit-join-group, in the harness with a clock -------------------------


def commit_request(group: str, topic: str, offset: int, version: int = 8) -> Any:
    cls = require_request_class(ApiKey.OFFSET_COMMIT, version)
    topic_cls = nested(cls, "topics")
    part_cls = nested(topic_cls, "partitions")
    partition = build(part_cls, partition_index=0, committed_offset=offset)
    return build(
        cls,
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        topics=(build(topic_cls, name=topic, partitions=(partition,)),),
    )


def join_request(group: str, version: int = 5, instance: str | None = None) -> Any:
    cls = require_request_class(ApiKey.JOIN_GROUP, version)
    protocol = build(nested(cls, "protocols"), name="range", metadata=b"")
    fields: dict[str, Any] = {
        "group_id": group,
        "session_timeout": datetime.timedelta(seconds=6),
        "rebalance_timeout": datetime.timedelta(seconds=6),
        "member_id": "",
        "protocol_type": "consumer",
        "protocols": (protocol,),
    }
    if version >= 5:
        fields["group_instance_id"] = instance
    return build(cls, **fields)


def commit_ok(request: Any) -> Any:
    """The broker's answer to a commit: every partition committed."""
    cls = response_class(ApiKey.OFFSET_COMMIT, int(request.__version__))
    topic_cls = nested(cls, "topics")
    part_cls = nested(topic_cls, "partitions")
    topics = tuple(
        build(
            topic_cls,
            name=t.name,
            partitions=tuple(build(part_cls, partition_index=p.partition_index) for p in t.partitions),
        )
        for t in request.topics
    )
    return build(cls, topics=topics)


def test_commits_over_the_limit_are_refused_per_group_until_the_minute_passes() -> None:
    services = FakeServices()
    harness = Harness(services=services)
    policy = harness.add(LimitCommitOffset, {"maximumCommitsPerMinute": 2, "groupId": "team-.*"})
    assert isinstance(policy, LimitCommitOffset)
    clock = Clock()
    policy.window.clock = clock

    def codes(group: str) -> list[int]:
        exchange = trio.run(harness.request, commit_request(group, "t", 1), commit_ok)
        return [p.error_code for t in exchange.response.topics for p in t.partitions]

    assert [codes("team-a") for _ in range(3)] == [[0], [0], [POLICY_VIOLATION]]
    assert codes("team-b") == [0]  # another group has its own count
    assert [codes("other") for _ in range(5)] == [[0]] * 5  # groupId does not match: not limited
    clock.now += 61
    assert codes("team-a") == [0]
    [(kind, _, data)] = services.audited
    assert (kind, data["plugin"], data["action"], data["groupId"]) == (
        "SAFEGUARD",
        "limit-commit-offset",
        "BLOCK",
        "team-a",
    )
    assert data["reasons"] == ["Too many offset commits for group 'team-a': at most 2 per minute."]


def test_throttled_joins_carry_the_configured_throttle_time() -> None:
    services = FakeServices()
    harness = Harness(services=services)
    config = {"maximumJoinsPerMinute": 1, "action": "THROTTLE", "throttleTimeMs": 3210}
    policy = harness.add(LimitJoinGroup, config)
    assert isinstance(policy, LimitJoinGroup)
    policy.window.clock = Clock()

    def join_answer(request: Any) -> Any:
        return build(response_class(ApiKey.JOIN_GROUP, 5), error_code=ErrorCode.member_id_required)

    throttles = [trio.run(harness.request, join_request("g"), join_answer).response.throttle_time for _ in range(3)]
    assert throttles == [datetime.timedelta(0)] + [datetime.timedelta(milliseconds=3210)] * 2
    assert [data["action"] for _, _, data in services.audited] == ["THROTTLE", "THROTTLE"]
    assert "Too many group joins for group 'g'" in services.audited[0][2]["reasons"][0]


# -- through the gateway ---------------------------------------------------------------------------


@pytest.fixture
def topic(tansu: TansuBroker) -> Iterator[str]:
    name = unique("gl-limits")
    admin = AdminClient(direct(tansu))
    for future in admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)]).values():
        future.result(30)
    yield name


def committed(tansu: TansuBroker, group: str, topic: str) -> int:
    """The group's committed offset of partition 0, as the broker has it."""
    consumer = Consumer(direct(tansu, **{"group.id": group}))
    try:
        [tp] = consumer.committed([TopicPartition(topic, 0)], timeout=30)
        return int(tp.offset)
    finally:
        consumer.close()


def test_confluent_commits_over_the_limit_fail_with_policy_violation(tansu: TansuBroker, topic: str) -> None:
    group = unique("gl-commits")
    limit = {"maximumCommitsPerMinute": 3, "groupId": "gl-commits-.*"}
    with safeguards_gateway(tansu, [spec("commit-limit", "limit-commit-offset", limit)]) as gateway:
        consumer = Consumer(through(gateway, **{"group.id": group, "enable.auto.commit": False}))
        try:
            for offset in (1, 2, 3):
                [tp] = consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
                assert tp.error is None
            with pytest.raises(KafkaException) as refused:
                consumer.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
        finally:
            consumer.close()
        error = refused.value.args[0]
        assert error.code() == KafkaError.POLICY_VIOLATION
        assert committed(tansu, group, topic) == 3  # the fourth commit never reached the broker
        [event] = wait_for(lambda: audit_events(gateway))
        data = event["eventData"]
        assert (data["plugin"], data["action"], data["groupId"]) == ("limit-commit-offset", "BLOCK", group)
        assert data["reasons"] == [f"Too many offset commits for group '{group}': at most 3 per minute."]


def test_throttled_commits_tell_the_client_to_wait_throttle_time_ms(tansu: TansuBroker, topic: str) -> None:
    group = unique("gl-throttle")
    limit = {"maximumCommitsPerMinute": 2, "action": "THROTTLE", "throttleTimeMs": 1234}
    with safeguards_gateway(tansu, [spec("commit-throttle", "limit-commit-offset", limit)]) as gateway:
        client = WireClient(bootstrap_of(gateway), timeout=30)
        try:
            responses = [client.call(commit_request(group, topic, n), correlation_id=n) for n in range(1, 6)]
        finally:
            client.close()
        assert [r.topics[0].partitions[0].error_code for r in responses] == [0] * 5  # all let through
        assert [r.throttle_time for r in responses] == [datetime.timedelta(0)] * 2 + [
            datetime.timedelta(milliseconds=1234)
        ] * 3
        assert committed(tansu, group, topic) == 5
        events = wait_for(lambda: len(audit_events(gateway)) == 3 and audit_events(gateway))
        assert {e["eventData"]["action"] for e in events} == {"THROTTLE"}


def test_joins_over_the_limit_are_refused(tansu: TansuBroker) -> None:
    group = unique("gl-joins")
    with safeguards_gateway(tansu, [spec("join-limit", "limit-join-group", {"maximumJoinsPerMinute": 2})]) as gateway:
        codes = []
        for n in range(1, 5):
            client = WireClient(bootstrap_of(gateway), timeout=30)
            try:
                codes.append(int(client.call(join_request(group), correlation_id=n).error_code))
            finally:
                client.close()
        assert POLICY_VIOLATION not in codes[:2]  # the broker's answers (MEMBER_ID_REQUIRED for a first join)
        assert codes[2:] == [POLICY_VIOLATION, POLICY_VIOLATION]
        events = wait_for(lambda: len(audit_events(gateway)) == 2 and audit_events(gateway))
        assert [e["eventData"]["action"] for e in events] == ["BLOCK", "BLOCK"]
        assert events[0]["eventData"]["reasons"][0].startswith(f"Too many group joins for group '{group}'")
        assert PREFIX  # the client sees only the code: JoinGroup responses have no error message


# -- limit-connection ------------------------------------------------------------------------------


def open_and_ask(gateway: Any, count: int) -> list[Any]:
    """Opens ``count`` connections at once, then sends ApiVersions on each: its response, or None
    when the gateway closed the connection."""
    clients = [WireClient(bootstrap_of(gateway), timeout=30) for _ in range(count)]
    answers: list[Any] = []
    try:
        for client in clients:
            try:
                answers.append(client.call(api_versions_request(3)))
            except (ConnectionError, OSError):
                answers.append(None)
    finally:
        for client in clients:
            client.close()
    return answers


def test_connections_over_the_limit_are_closed_at_their_first_request(tansu: TansuBroker) -> None:
    limit = {"maximumConnectionsPerSecond": 3}
    with safeguards_gateway(tansu, [spec("connection-limit", "limit-connection", limit)]) as gateway:
        answers = open_and_ask(gateway, 8)
        assert sum(a is not None for a in answers) == 3
        assert all(a.error_code == 0 for a in answers if a is not None)
        events = wait_for(lambda: len(audit_events(gateway)) == 5 and audit_events(gateway))
        assert {(e["eventData"]["plugin"], e["eventData"]["action"]) for e in events} == {("limit-connection", "BLOCK")}
        # requests on open connections are not counted: an accepted connection goes on working
        survivor = WireClient(bootstrap_of(gateway), timeout=30)
        try:
            first = [survivor.call(api_versions_request(3), correlation_id=n) for n in range(1, 10)]
        except (ConnectionError, OSError):
            first = []  # this new connection came in the same second as the 8: refused too
        finally:
            survivor.close()
        assert first == [] or all(a.error_code == 0 for a in first)


def test_requests_on_open_connections_are_not_counted(tansu: TansuBroker) -> None:
    limit = {"maximumConnectionsPerSecond": 1}
    with safeguards_gateway(tansu, [spec("connection-limit", "limit-connection", limit)]) as gateway:
        client = WireClient(bootstrap_of(gateway), timeout=30)
        try:
            answers = [client.call(api_versions_request(3), correlation_id=n) for n in range(1, 21)]
        finally:
            client.close()
        assert [a.error_code for a in answers] == [0] * 20
        assert audit_events(gateway) == []


def test_throttled_connections_get_throttle_time_ms_on_their_first_response(tansu: TansuBroker) -> None:
    limit = {"maximumConnectionsPerSecond": 2, "action": "THROTTLE", "throttleTimeMs": 4321}
    with safeguards_gateway(tansu, [spec("connection-throttle", "limit-connection", limit)]) as gateway:
        clients = [WireClient(bootstrap_of(gateway), timeout=30) for _ in range(6)]
        try:
            first = [c.call(api_versions_request(3), correlation_id=1) for c in clients]
            second = [c.call(api_versions_request(3), correlation_id=2) for c in clients]
        finally:
            for c in clients:
                c.close()
        throttles = sorted(int(a.throttle_time.total_seconds() * 1000) for a in first)
        assert throttles == [0, 0, 4321, 4321, 4321, 4321]
        assert {a.throttle_time for a in second} == {datetime.timedelta(0)}  # only the first response
        events = wait_for(lambda: len(audit_events(gateway)) == 4 and audit_events(gateway))
        assert {e["eventData"]["action"] for e in events} == {"THROTTLE"}
