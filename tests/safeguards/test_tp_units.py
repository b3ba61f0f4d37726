"""The topic safeguards on decoded kio requests, through the core's chain (``kanal.testing``): which
topics and resources go upstream, what the client gets back for every version kio knows, the
rewrites of OVERRIDE, the audit events, and the configs refused when they are applied."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from kanal_safeguards.decisions import PREFIX
from kanal_safeguards.policies.alter_config import AlterBrokerConfigPolicy, AlterTopicConfigPolicy
from kanal_safeguards.policies.create_topic import CreateTopicPolicy
from kanal_safeguards.policies.entities import Failed, merge_failed

from kanal.api import ApiKey, ErrorCode, Interceptor, InterceptorConfigError, build, nested, require_request_class
from kanal.api import response_class as response_cls
from kanal.testing import Exchange, FakeServices, Harness

CREATE_VERSIONS = range(2, 8)
ALTER_VERSIONS = range(3)
INCREMENTAL_VERSIONS = range(2)


def create_request(version: int, *topics: tuple[str, int, dict[str, str]], validate_only: bool = False) -> Any:
    cls = require_request_class(ApiKey.CREATE_TOPICS, version)
    topic_cls = nested(cls, "topics")
    config_cls = nested(topic_cls, "configs")
    return build(
        cls,
        topics=tuple(
            build(
                topic_cls,
                name=name,
                num_partitions=partitions,
                replication_factor=1,
                configs=tuple(build(config_cls, name=k, value=v) for k, v in configs.items()),
            )
            for name, partitions, configs in topics
        ),
        validate_only=validate_only,
    )


def created(request: Any) -> Any:
    """What a broker answers: every topic it got, created."""
    cls = response_cls(ApiKey.CREATE_TOPICS, int(request.__version__))
    entity = nested(cls, "topics")
    return build(cls, topics=tuple(build(entity, name=t.name, error_code=ErrorCode.none) for t in request.topics))


def alter_request(api_key: int, version: int, *resources: tuple[int, str, dict[str, str | None]], op: int = 0) -> Any:
    cls = require_request_class(api_key, version)
    resource_cls = nested(cls, "resources")
    config_cls = nested(resource_cls, "configs")
    extra = {"config_operation": op} if api_key == ApiKey.INCREMENTAL_ALTER_CONFIGS else {}
    return build(
        cls,
        resources=tuple(
            build(
                resource_cls,
                resource_type=kind,
                resource_name=name,
                configs=tuple(build(config_cls, name=k, value=v, **extra) for k, v in configs.items()),
            )
            for kind, name, configs in resources
        ),
    )


def altered(request: Any) -> Any:
    cls = response_cls(int(request.__api_key__), int(request.__version__))
    entity = nested(cls, "responses")
    return build(
        cls,
        responses=tuple(
            build(entity, resource_type=r.resource_type, resource_name=r.resource_name, error_code=ErrorCode.none)
            for r in request.resources
        ),
    )


def run(cls: type[Interceptor], config: dict[str, Any], request: Any, upstream: Any) -> tuple[Exchange, FakeServices]:
    services = FakeServices()
    harness = Harness(services=services)
    harness.add(cls, config)
    return trio.run(harness.request, request, upstream), services


def configs_of(topic: Any) -> dict[str, str | None]:
    return {c.name: c.value for c in topic.configs}


@pytest.mark.parametrize("version", CREATE_VERSIONS)
def test_a_blocked_topic_fails_alone_in_the_request_order(version: int) -> None:
    config = {"namingConvention": {"value": "app-.*"}, "numPartition": {"max": 10}}
    request = create_request(version, ("app-a", 3, {}), ("Bad", 3, {}), ("app-b", 20, {}), ("app-c", 10, {}))
    exchange, services = run(CreateTopicPolicy, config, request, created)
    assert [t.name for t in exchange.forwarded.topics] == ["app-a", "app-c"]
    topics = exchange.response.topics
    assert [(t.name, t.error_code) for t in topics] == [
        ("app-a", ErrorCode.none),
        ("Bad", ErrorCode.policy_violation),
        ("app-b", ErrorCode.policy_violation),
        ("app-c", ErrorCode.none),
    ]
    assert topics[1].error_message == f"{PREFIX} Topic name 'Bad' is invalid."
    assert topics[2].error_message == f"{PREFIX} numPartition is '20', must not be greater than '10'"
    assert [(e[2]["topic"], e[2]["action"]) for e in services.audited] == [("Bad", "BLOCK"), ("app-b", "BLOCK")]


@pytest.mark.parametrize("version", CREATE_VERSIONS)
def test_when_every_topic_is_blocked_nothing_goes_upstream(version: int) -> None:
    request = create_request(version, ("x", 1, {}), ("a", 1, {"retention.ms": "10"}), validate_only=True)
    config = {"namingConvention": {"value": "[a-w]"}, "retentionMs": {"min": 1000}}
    exchange, _ = run(CreateTopicPolicy, config, request, created)
    assert exchange.forwarded is None
    assert [(t.name, t.error_code, t.error_message) for t in exchange.response.topics] == [
        ("x", ErrorCode.policy_violation, f"{PREFIX} Topic name 'x' is invalid."),
        ("a", ErrorCode.policy_violation, f"{PREFIX} retention.ms is '10', must not be less than '1000'"),
    ]


def test_topics_outside_the_topic_regex_and_broker_defaults_are_not_checked() -> None:
    config = {"topic": "app-.*", "numPartition": {"min": 3, "max": 6}, "replicationFactor": {"min": 3}}
    request = create_request(7, ("other", 100, {}), ("app-default", -1, {}))
    default = replace(request.topics[1], replication_factor=-1)
    request = replace(request, topics=(request.topics[0], default))
    exchange, services = run(CreateTopicPolicy, config, request, created)
    assert exchange.forwarded == request
    assert [t.error_code for t in exchange.response.topics] == [ErrorCode.none, ErrorCode.none]
    assert services.audited == []


def test_override_rewrites_counts_and_configs_and_audits_both_values() -> None:
    config = {
        "numPartition": {"max": 10, "action": "OVERRIDE", "overrideValue": 10},
        "retentionMs": {"max": 60000, "action": "OVERRIDE", "overrideValue": 60000},
        "cleanupPolicy": {"values": ["delete"], "action": "OVERRIDE", "overrideValue": "delete"},
        "uncleanLeaderElectionEnable": {"value": False, "action": "OVERRIDE"},
    }
    request = create_request(
        4,
        (
            "big",
            20,
            {"retention.ms": "999999", "cleanup.policy": "compact,delete", "unclean.leader.election.enable": "true"},
        ),
    )
    exchange, services = run(CreateTopicPolicy, config, request, created)
    (topic,) = exchange.forwarded.topics
    assert topic.num_partitions == 10 and topic.replication_factor == 1
    assert configs_of(topic) == {
        "retention.ms": "60000",
        "cleanup.policy": "delete",
        "unclean.leader.election.enable": "false",
    }
    assert exchange.response.topics[0].error_code == ErrorCode.none
    ((kind, _, event),) = services.audited
    assert kind == "SAFEGUARD" and event["action"] == "OVERRIDE" and event["topic"] == "big"
    assert event["overrides"] == [
        {"field": "numPartition", "from": 20, "to": 10},
        {"field": "retention.ms", "from": 999999, "to": 60000},
        {"field": "cleanup.policy", "from": "compact,delete", "to": "delete"},
        {"field": "unclean.leader.election.enable", "from": True, "to": False},
    ]


def test_a_manual_layout_counts_and_gives_way_to_an_override() -> None:
    cls = require_request_class(ApiKey.CREATE_TOPICS, 5)
    topic_cls = nested(cls, "topics")
    assignment_cls = nested(topic_cls, "assignments")
    layout = tuple(build(assignment_cls, partition_index=i, broker_ids=(111,)) for i in range(4))
    topic = build(topic_cls, name="laid-out", num_partitions=-1, replication_factor=-1, assignments=layout, configs=())
    request = build(cls, topics=(topic,))
    config = {"numPartition": {"max": 2, "action": "OVERRIDE", "overrideValue": 2}}
    exchange, _ = run(CreateTopicPolicy, config, request, created)
    (forwarded,) = exchange.forwarded.topics
    assert (forwarded.num_partitions, forwarded.replication_factor, forwarded.assignments) == (2, 1, ())
    blocked, _ = run(CreateTopicPolicy, {"numPartition": {"max": 2}}, request, created)
    assert blocked.response.topics[0].error_message == f"{PREFIX} numPartition is '4', must not be greater than '2'"


def test_info_lets_the_request_through_unchanged_and_audits() -> None:
    config = {
        "replicationFactor": {"min": 3, "action": "INFO"},
        "blacklist": {"values": ["preallocate"], "action": "INFO"},
    }
    request = create_request(3, ("lonely", 1, {"preallocate": "true"}))
    exchange, services = run(CreateTopicPolicy, config, request, created)
    assert exchange.forwarded is request
    assert exchange.response.topics[0].error_code == ErrorCode.none
    assert [(e["action"], e["topic"], e["reasons"]) for _, _, e in services.audited] == [
        (
            "INFO",
            "lonely",
            ["replicationFactor is '1', must not be less than '3'", "Configuration 'preallocate' is not allowed."],
        )
    ]


def test_blacklist_blocks_or_removes_configs() -> None:
    request = create_request(7, ("a", 1, {"segment.bytes": "1000000", "retention.ms": "5"}))
    blocked, _ = run(CreateTopicPolicy, {"blacklist": {"values": ["segment.bytes"]}}, request, created)
    assert blocked.forwarded is None
    assert blocked.response.topics[0].error_message == f"{PREFIX} Configuration 'segment.bytes' is not allowed."
    removed, services = run(
        CreateTopicPolicy, {"blacklist": {"values": ["segment.bytes"], "action": "OVERRIDE"}}, request, created
    )
    assert configs_of(removed.forwarded.topics[0]) == {"retention.ms": "5"}
    assert services.audited[0][2]["overrides"] == [{"field": "segment.bytes", "from": "1000000", "to": None}]


def test_value_and_values_rules_read_kafka_strings() -> None:
    config = {
        "compressionType": {"values": ["zstd", "lz4"]},
        "messageTimestampType": {"value": "LogAppendTime"},
        "minCleanableDirtyRatio": {"min": 0.1, "max": 0.9},
    }
    request = create_request(
        6,
        (
            "fine",
            1,
            {"compression.type": "ZSTD", "message.timestamp.type": "LogAppendTime", "min.cleanable.dirty.ratio": "0.5"},
        ),
        ("gzip", 1, {"compression.type": "gzip"}),
        ("ct", 1, {"message.timestamp.type": "CreateTime"}),
        ("dirty", 1, {"min.cleanable.dirty.ratio": "0.95"}),
    )
    exchange, _ = run(CreateTopicPolicy, config, request, created)
    assert [t.name for t in exchange.forwarded.topics] == ["fine"]
    assert [t.error_message for t in exchange.response.topics[1:]] == [
        f"{PREFIX} compression.type is 'gzip', must be one of [zstd, lz4]",
        f"{PREFIX} message.timestamp.type is 'CreateTime', must be 'LogAppendTime'",
        f"{PREFIX} min.cleanable.dirty.ratio is '0.95', must not be greater than '0.9'",
    ]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"numPartition": {"max": 10, "action": "OVERRIDE"}},
            "numPartition: overrideValue must not be null when the action is OVERRIDE",
        ),
        (
            {"retentionMs": {"max": 10, "action": "OVERRIDE"}},
            "retentionMs: overrideValue must not be null when the action is OVERRIDE",
        ),
        (
            {"namingConvention": {"value": "a.*", "action": "OVERRIDE"}},
            "namingConvention.action: OVERRIDE is not supported here (BLOCK or INFO)",
        ),
        ({"retentionMss": {"max": 1}}, "config: Object contains unknown field `retentionMss`"),
        ({"topic": "(["}, "topic: '([' is not a valid regex"),
        ({"blacklist": {"values": ["x"], "action": "DENY"}}, "blacklist.action: Invalid enum value 'DENY'"),
    ],
)
def test_bad_create_topic_configs_are_refused_naming_the_field(config: dict[str, Any], message: str) -> None:
    with pytest.raises(InterceptorConfigError) as raised:
        Harness().add(CreateTopicPolicy, config)
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize(
    ("api_key", "version"),
    [(ApiKey.ALTER_CONFIGS, v) for v in ALTER_VERSIONS]
    + [(ApiKey.INCREMENTAL_ALTER_CONFIGS, v) for v in INCREMENTAL_VERSIONS],
)
def test_alter_topic_config_fails_only_the_offending_resources(api_key: int, version: int) -> None:
    config = {"topic": "app-.*", "retentionMs": {"min": 1000}, "blacklist": {"values": ["segment.bytes"]}}
    request = alter_request(
        api_key,
        version,
        (2, "app-ok", {"retention.ms": "5000"}),
        (2, "app-short", {"retention.ms": "10"}),
        (2, "other", {"retention.ms": "10"}),
        (4, "111", {"segment.bytes": "1"}),
        (2, "app-seg", {"segment.bytes": "1"}),
    )
    exchange, services = run(AlterTopicConfigPolicy, config, request, altered)
    assert [r.resource_name for r in exchange.forwarded.resources] == ["app-ok", "other", "111"]
    assert [(r.resource_name, r.error_code, r.error_message) for r in exchange.response.responses] == [
        ("app-ok", ErrorCode.none, None),
        ("app-short", ErrorCode.policy_violation, f"{PREFIX} retention.ms is '10', must not be less than '1000'"),
        ("other", ErrorCode.none, None),
        ("111", ErrorCode.none, None),
        ("app-seg", ErrorCode.policy_violation, f"{PREFIX} Configuration 'segment.bytes' is not allowed."),
    ]
    assert [(e["topic"], e["action"]) for _, _, e in services.audited] == [("app-short", "BLOCK"), ("app-seg", "BLOCK")]


@pytest.mark.parametrize("version", INCREMENTAL_VERSIONS)
def test_incremental_delete_is_never_refused_and_override_rewrites(version: int) -> None:
    config = {
        "retentionMs": {"max": 60000, "action": "OVERRIDE", "overrideValue": 60000},
        "blacklist": {"values": ["flush.ms"]},
    }
    deleting = alter_request(ApiKey.INCREMENTAL_ALTER_CONFIGS, version, (2, "t", {"flush.ms": None}), op=1)
    exchange, services = run(AlterTopicConfigPolicy, config, deleting, altered)
    assert exchange.forwarded is deleting and services.audited == []
    setting = alter_request(ApiKey.INCREMENTAL_ALTER_CONFIGS, version, (2, "t", {"retention.ms": "86400"}))
    exchange, services = run(AlterTopicConfigPolicy, config, setting, altered)
    ((forwarded_config,),) = [r.configs for r in exchange.forwarded.resources]
    assert (forwarded_config.name, forwarded_config.value, forwarded_config.config_operation) == (
        "retention.ms",
        "60000",
        0,
    )
    assert services.audited[0][2]["overrides"] == [{"field": "retention.ms", "from": 86400, "to": 60000}]


@pytest.mark.parametrize(
    ("api_key", "version"),
    [(ApiKey.ALTER_CONFIGS, v) for v in ALTER_VERSIONS]
    + [(ApiKey.INCREMENTAL_ALTER_CONFIGS, v) for v in INCREMENTAL_VERSIONS],
)
def test_alter_broker_config_checks_broker_resources_only(api_key: int, version: int) -> None:
    config = {
        "logRetentionMs": {"max": 600000},
        "logSegmentBytes": {"min": 1000, "action": "INFO"},
        "blacklist": {"values": ["log.dirs"]},
    }
    request = alter_request(
        api_key,
        version,
        (4, "111", {"log.retention.ms": "900000"}),
        (2, "topic", {"log.retention.ms": "900000"}),
        (4, "", {"log.segment.bytes": "10"}),
    )
    exchange, services = run(AlterBrokerConfigPolicy, config, request, altered)
    assert [r.resource_name for r in exchange.forwarded.resources] == ["topic", ""]
    assert [(r.resource_name, r.error_code, r.error_message) for r in exchange.response.responses] == [
        (
            "111",
            ErrorCode.policy_violation,
            f"{PREFIX} log.retention.ms is '900000', must not be greater than '600000'",
        ),
        ("topic", ErrorCode.none, None),
        ("", ErrorCode.none, None),
    ]
    assert [(e["broker"], e["action"]) for _, _, e in services.audited] == [("111", "BLOCK"), ("", "INFO")]
    alone = alter_request(api_key, version, (4, "111", {"log.dirs": "/x"}))
    exchange, _ = run(AlterBrokerConfigPolicy, config, alone, altered)
    assert exchange.forwarded is None
    assert exchange.response.responses[0].error_message == f"{PREFIX} Configuration 'log.dirs' is not allowed."


def test_bad_alter_configs_are_refused() -> None:
    with pytest.raises(InterceptorConfigError, match=r"^logRetentionBytes: overrideValue must not be null"):
        Harness().add(AlterBrokerConfigPolicy, {"logRetentionBytes": {"max": 1, "action": "OVERRIDE"}})
    with pytest.raises(InterceptorConfigError, match="unknown field `numPartition`"):
        Harness().add(AlterTopicConfigPolicy, {"numPartition": {"max": 1}})
    with pytest.raises(InterceptorConfigError, match="unknown field `topic`"):
        Harness().add(AlterBrokerConfigPolicy, {"topic": ".*"})


def test_merge_keeps_entries_the_request_did_not_name() -> None:
    cls = response_cls(ApiKey.CREATE_TOPICS, 2)
    entity = nested(cls, "topics")
    response = build(cls, topics=(build(entity, name="b"), build(entity, name="z")))
    merged = merge_failed(response, "topics", [Failed((("name", "a"),), "no")], [(("name", "a"),), (("name", "b"),)])
    assert [(t.name, t.error_code, t.error_message) for t in merged.topics] == [
        ("a", ErrorCode.policy_violation, "no"),
        ("b", ErrorCode.none, None),
        ("z", ErrorCode.none, None),
    ]
    assert merge_failed(response, "topics", [], []) is response


def test_validate_only_is_kept_when_some_topics_are_failed() -> None:
    request = create_request(4, ("ok", 1, {}), ("no", 50, {}), validate_only=True)
    exchange, _ = run(CreateTopicPolicy, {"numPartition": {"max": 10}}, request, created)
    assert exchange.forwarded.validate_only is True
    assert [t.name for t in exchange.forwarded.topics] == ["ok"]
    assert [t.error_code for t in exchange.response.topics] == [ErrorCode.none, ErrorCode.policy_violation]


DOC = Path(__file__).resolve().parents[2] / "docs" / "safeguards-topics.md"


def test_the_operator_doc_examples_are_accepted() -> None:
    types = {cls.plugin_name: cls for cls in (CreateTopicPolicy, AlterTopicConfigPolicy, AlterBrokerConfigPolicy)}
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    declared = [entry for block in blocks for entry in yaml.safe_load(block)["interceptors"]]
    assert sorted({entry["plugin"] for entry in declared}) == sorted(types)
    for entry in declared:
        Harness().add(types[entry["plugin"]], entry["config"])
