"""The config shapes every policy shares: what each rule accepts, the reason it gives, and the
configs refused when they are applied."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from kanal_safeguards.decisions import PREFIX, Action, Decisions, Violation, violation_message
from kanal_safeguards.rules import RangeRule, RegexRule, ValueRule, ValuesRule

from kanal.testing import FakeServices


def convert(data: dict[str, Any], kind: type[Any]) -> Any:
    return msgspec.convert(data, kind)


def test_a_range_gives_the_documented_reason() -> None:
    rule = convert({"min": 1, "max": 10}, RangeRule)
    assert rule.check("numPartition", 5) is None
    low = rule.check("numPartition", 0)
    assert low == Violation("numPartition is '0', must not be less than '1'", Action.BLOCK, "numPartition", 0, None)
    high = rule.check("numPartition", 11)
    assert high is not None and high.reason == "numPartition is '11', must not be greater than '10'"
    assert rule.check("numPartition", None) is None  # a value the request does not set
    retention = convert({"max": 3600000}, RangeRule).check("retention.ms", 86400000)
    assert (
        retention is not None and retention.reason == "retention.ms is '86400000', must not be greater than '3600000'"
    )


def test_override_needs_an_override_value() -> None:
    with pytest.raises(msgspec.ValidationError, match="overrideValue must not be null"):
        convert({"max": 10, "action": "OVERRIDE"}, RangeRule)
    rule = convert({"max": 10, "action": "OVERRIDE", "overrideValue": 10}, RangeRule)
    violation = rule.check("numPartition", 20)
    assert violation is not None and violation.action is Action.OVERRIDE and violation.override == 10
    with pytest.raises(msgspec.ValidationError, match="overrideValue must not be null"):
        convert({"values": ["delete"], "action": "OVERRIDE"}, ValuesRule)


def test_unknown_keys_actions_and_inverted_ranges_are_refused() -> None:
    with pytest.raises(msgspec.ValidationError, match="unknown field `maximum`"):
        convert({"maximum": 1}, RangeRule)
    with pytest.raises(msgspec.ValidationError, match="Invalid enum value 'DENY'"):
        convert({"max": 1, "action": "DENY"}, RangeRule)
    with pytest.raises(msgspec.ValidationError, match=r"min \(5\) is greater than max \(1\)"):
        convert({"min": 5, "max": 1}, RangeRule)
    with pytest.raises(msgspec.ValidationError, match="not a valid regex"):
        convert({"value": "(["}, RegexRule)


def test_values_regexes_and_required_values() -> None:
    compressions = convert({"values": ["GZIP", "zstd"]}, ValuesRule)
    assert compressions.check("compression", "gzip") is None
    bad = compressions.check("compression", "snappy")
    assert bad is not None and bad.reason == "compression is 'snappy', must be one of [GZIP, zstd]"
    naming = convert({"value": "team-[a-z]+"}, RegexRule)
    assert naming.check("GroupId", "team-a") is None
    invalid = naming.check("GroupId", "x")
    assert invalid is not None and invalid.reason == "GroupId 'x' is invalid."
    acks = convert({"value": -1, "action": "INFO"}, ValueRule)
    assert acks.check("acks", -1) is None
    info = acks.check("acks", 1)
    assert info is not None and info.action is Action.INFO and info.reason == "acks is '1', must be '-1'"


def test_decisions_block_message_and_audit() -> None:
    services = FakeServices()
    decisions = Decisions()
    decisions.add(Violation("a is '1', must be '2'", Action.BLOCK, "a", 1))
    decisions.add(Violation("b is 'x', must be 'y'", Action.INFO, "b", "x"))
    decisions.add(Violation("c is '9', must not be greater than '5'", Action.OVERRIDE, "c", 9, 5))
    decisions.add(None)
    assert decisions.blocked
    assert decisions.message == f"{PREFIX} a is '1', must be '2'"
    assert violation_message(["x.", "y."]) == f"{PREFIX} x. y."
    decisions.audit(services, None, "create-topic-policy", topic="t")
    assert [(kind, data["action"]) for kind, _, data in services.audited] == [
        ("SAFEGUARD", "BLOCK"),
        ("SAFEGUARD", "INFO"),
        ("SAFEGUARD", "OVERRIDE"),
    ]
    assert services.audited[2][2]["overrides"] == [{"field": "c", "from": 9, "to": 5}]
    assert services.audited[0][2]["topic"] == "t"
