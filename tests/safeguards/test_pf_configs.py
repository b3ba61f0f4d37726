"""The configs of the produce, fetch, read-only, schema id and header removal safeguards: those
refused when they are applied (each naming the field at fault, as the admin API and the config file
report it) and those accepted."""

from __future__ import annotations

import re
from typing import Any

import pytest
from kanal_safeguards.base import TopicMatcher, with_throttle
from kanal_safeguards.policies.fetch_policy import FetchPolicy
from kanal_safeguards.policies.header_removal import HeaderRemoval
from kanal_safeguards.policies.produce_policy import ProducePolicy
from kanal_safeguards.policies.read_only import ReadOnlyTopic
from kanal_safeguards.policies.schema_id import TopicRequiredSchemaId, has_schema_id

from kanal.api import Interceptor, InterceptorConfigError, build, response_class
from kanal.testing import Harness

REFUSED: list[tuple[type[Interceptor], dict[str, Any], str]] = [
    (ProducePolicy, {"acks": {"value": -1, "action": "OVERRIDE"}}, "acks.action: OVERRIDE is not supported"),
    (
        ProducePolicy,
        {"compressions": {"values": ["GZIP"], "action": "OVERRIDE", "overrideValue": "GZIP"}},
        "compressions.action: OVERRIDE",
    ),
    (ProducePolicy, {"version": {"min": 3, "action": "OVERRIDE", "overrideValue": 3}}, "version.action: OVERRIDE"),
    (ProducePolicy, {"acks": {"value": 2}}, "acks.value: 2 is not an acks setting"),
    (ProducePolicy, {"compressions": {"values": ["brotli"]}}, "compressions.values: unknown compression 'brotli'"),
    (ProducePolicy, {"recordHeaderRequired": {"value": "yes"}}, "recordHeaderRequired.value: expected true or false"),
    (ProducePolicy, {"topic": "(["}, "topic: '([' is not a valid regex"),
    (ProducePolicy, {"ack": {"value": 1}}, "unknown field `ack`"),
    (ProducePolicy, {"version": {"min": 9, "max": 3}}, "version: min (9) is greater than max (3)"),
    (ProducePolicy, {"throttleTimeMs": -1}, "throttleTimeMs: Expected `int` >= 0"),
    (
        FetchPolicy,
        {"isolationLevel": {"value": "committed"}},
        "isolationLevel.value: 'committed' is not an isolation level",
    ),
    (FetchPolicy, {"maxWaitMs": {"max": 10, "action": "OVERRIDE", "overrideValue": 10}}, "maxWaitMs.action: OVERRIDE"),
    (FetchPolicy, {"rackIdRequired": {"value": 1}}, "rackIdRequired.value: expected true or false"),
    (FetchPolicy, {"fetchMaxBytes": {"maximum": 1}}, "unknown field `maximum`"),
    (ReadOnlyTopic, {"action": "OVERRIDE"}, "action: OVERRIDE is not supported by read-only-topic (use BLOCK, INFO)"),
    (ReadOnlyTopic, {"action": "THROTTLE"}, "action: THROTTLE is not supported"),
    (ReadOnlyTopic, {"topics": "x"}, "unknown field `topics`"),
    (TopicRequiredSchemaId, {"action": "OVERRIDE"}, "action: OVERRIDE is not supported"),
    (TopicRequiredSchemaId, {"schemaIdRequired": "true"}, "schemaIdRequired: Expected `bool`"),
    (HeaderRemoval, {}, "headerKeyRegex: required"),
    (HeaderRemoval, {"headerKeyRegex": "(["}, "headerKeyRegex: '([' is not a valid regex"),
    (HeaderRemoval, {"headerKeyRegex": "x", "topic": "*"}, "topic: '*' is not a valid regex"),
]


@pytest.mark.parametrize(("kind", "config", "message"), REFUSED)
def test_refused_configs_name_the_field(kind: type[Interceptor], config: dict[str, Any], message: str) -> None:
    with pytest.raises(InterceptorConfigError, match=re.escape(message)):
        Harness().add(kind, config)


def test_documented_configs_are_accepted() -> None:
    harness = Harness()
    harness.add(
        ProducePolicy,
        {
            "topic": "orders-.*",
            "acks": {"value": -1, "action": "BLOCK"},
            "recordHeaderRequired": {"value": True, "action": "INFO"},
            "compressions": {"values": ["NONE", "zstd"], "action": "THROTTLE"},
            "idempotenceRequired": {"value": True},
            "transactionRequired": {"value": False},
            "version": {"min": 7, "max": 11},
            "throttleTimeMs": 500,
        },
    )
    harness.add(
        FetchPolicy,
        {
            "isolationLevel": {"value": "read_committed"},
            "rackIdRequired": {"value": True, "action": "INFO"},
            "fetchMaxBytes": {"max": 52428800},
            "fetchMinBytes": {"min": 1},
            "maxWaitMs": {"min": 10, "max": 1000, "action": "THROTTLE"},
            "version": {"min": 4},
        },
    )
    harness.add(ReadOnlyTopic, {"topic": "archive-.*", "action": "INFO"})
    harness.add(TopicRequiredSchemaId, {"topic": "avro-.*", "schemaIdRequired": True})
    harness.add(HeaderRemoval, {"topic": ".*", "headerKeyRegex": "internal\\..*"})


def test_topic_regex_matches_the_whole_name() -> None:
    matches = TopicMatcher("orders-.*")
    assert matches("orders-eu") and not matches("old-orders-eu") and not matches(None)
    assert TopicMatcher(".*")("__consumer_offsets")  # internal topics too: be explicit


def test_schema_id_prefix() -> None:
    assert has_schema_id(b"\x00\x00\x00\x00\x07avro")
    assert not has_schema_id(b"\x00\x00\x07")  # too short for an id
    assert not has_schema_id(b'{"json": 1}')


def test_throttle_raises_throttle_time_only() -> None:
    response = build(response_class(0, 9))
    assert with_throttle(response, 250).throttle_time.total_seconds() == 0.25
    slower = with_throttle(with_throttle(response, 900), 250)
    assert slower.throttle_time.total_seconds() == 0.9  # the broker's own longer throttle is kept
