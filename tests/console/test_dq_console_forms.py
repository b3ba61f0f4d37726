"""The data-quality console's forms and the manifests they stand for (no gateway: the store checks
the manifests; these tests check what the forms build and show)."""

from __future__ import annotations

import pytest
from kanal_dataquality.console.forms import (
    alert_fields,
    alert_manifest,
    block_refusal,
    policy_fields,
    policy_manifest,
    rule_fields,
    rule_manifest,
    sample_body,
    slug,
    with_action,
)


def test_a_technical_id_is_made_from_the_display_name() -> None:
    assert slug("Positive amount") == "positive-amount"
    assert slug("  Über  Orders (v2)! ") == "ber-orders-v2"
    assert rule_manifest({"displayName": "Positive amount", "expression": "true"}, None)["metadata"] == {
        "name": "positive-amount"
    }


def test_a_rule_form_round_trips() -> None:
    form = {"displayName": "Shape", "type": "JsonSchema", "expression": '{"type": "object"}', "description": " "}
    manifest = rule_manifest(form, {"metadata": {"name": "shape", "labels": {"team": "a"}}, "spec": {}}, "shape")
    assert manifest["metadata"] == {"name": "shape", "labels": {"team": "a"}}  # what the form hides is kept
    assert manifest["spec"] == {"type": "JsonSchema", "displayName": "Shape", "schema": '{"type": "object"}'}
    stored = {**manifest, "spec": {**manifest["spec"], "schema": {"type": "object"}}}
    assert rule_fields(stored)["expression"] == '{\n  "type": "object"\n}'
    assert rule_fields(None)["type"] == "Cel"


def test_the_sample_s_headers_are_lines_or_json() -> None:
    assert sample_body({"key": "", "value": '{"a": 1}', "headers": "trace-id: abc\n\nx: 1: 2"}) == {
        "value": '{"a": 1}',
        "headers": {"trace-id": "abc", "x": "1: 2"},
    }
    assert sample_body({"headers": '{"a": "b", "n": 1}'}) == {"headers": {"a": "b", "n": "1"}}
    with pytest.raises(ValueError, match="line 1"):
        sample_body({"headers": "no colon here"})
    with pytest.raises(ValueError, match="JSON object"):
        sample_body({"headers": "{broken"})


def test_a_policy_form_round_trips_and_keeps_the_actions() -> None:
    form = {
        "displayName": "Orders",
        "group": "team",
        "rule:a": "on",
        "rule:b": "on",
        "targets": "orders\npay-*\nlegacy:old\n",
        "csrf": "t",
    }
    new = policy_manifest(form, None, "gw")
    assert new["metadata"] == {"name": "orders", "group": "team"}
    assert new["spec"]["rules"] == ["a", "b"]
    assert new["spec"]["targets"] == [
        {"cluster": "gw", "topic": "orders"},
        {"cluster": "gw", "topic": "pay-*"},
        {"cluster": "legacy", "topic": "old"},
    ]
    assert new["spec"]["actions"] == {"block": {"enabled": False}, "mark": {"enabled": False}}
    stored = {
        "metadata": {"name": "orders", "group": "team"},
        "spec": {
            "displayName": "Orders",
            "rules": ["a"],
            "targets": [
                {"cluster": "gw", "topic": "orders", "patternType": "LITERAL"},
                {"cluster": "gw", "topic": "pay-", "patternType": "PREFIXED"},
                {"cluster": "legacy", "topic": "old", "patternType": "LITERAL"},
            ],
            "actions": {"block": {"enabled": True}, "shadow": {"enabled": True}},
        },
    }
    assert policy_fields(stored, "gw")["targets"] == "orders\npay-*\nlegacy:old"
    edited = policy_manifest(form, stored, "gw", "orders")
    assert edited["spec"]["actions"] == stored["spec"]["actions"]
    assert with_action(stored, "mark", True)["spec"]["actions"]["mark"] == {"enabled": True}
    assert "mark" not in stored["spec"]["actions"]  # a copy


@pytest.mark.parametrize(
    ("enabled", "enable", "typed", "refused"),
    [
        (False, True, "BLOCK", None),
        (False, True, " BLOCK ", None),
        (False, True, "block", "Type BLOCK (in capitals) to enable Block; you typed 'block'"),
        (False, True, "", "the field was empty"),
        (False, True, "UNBLOCK", "Type BLOCK"),
        (True, False, "UNBLOCK", None),
        (True, False, "BLOCK", "Type UNBLOCK (in capitals) to disable Block"),
        (True, True, "BLOCK", "already enabled"),
        (False, False, "UNBLOCK", "already disabled"),
    ],
)
def test_block_needs_the_typed_word(enabled: bool, enable: bool, typed: str, refused: str | None) -> None:
    answer = block_refusal(enabled, enable, typed)
    if refused is None:
        assert answer is None
    else:
        assert answer is not None and refused in answer


def test_an_alert_s_window_is_shown_in_its_unit() -> None:
    form = {"name": "a", "policyName": "p", "triggerAfter": "5", "within": "2", "unit": "hours", "destination": ""}
    manifest = alert_manifest(form, None)
    assert manifest["spec"]["withinInSeconds"] == "7200" and "destination" not in manifest["spec"]
    stored = {**manifest, "spec": {**manifest["spec"], "triggerAfter": 5, "withinInSeconds": 7200}}
    assert (alert_fields(stored)["within"], alert_fields(stored)["unit"]) == ("2", "hours")
    webhook = {"type": "Webhook", "url": "https://hooks.example/x", "headers": {"Authorization": "t"}}
    stored["spec"]["destination"] = webhook
    again = alert_manifest({**form, "destination": "Webhook", "url": "https://hooks.example/y"}, stored, "a")
    assert again["spec"]["destination"] == {**webhook, "url": "https://hooks.example/y"}  # headers kept
    assert alert_fields(None, "p", "team")["group"] == "team"
