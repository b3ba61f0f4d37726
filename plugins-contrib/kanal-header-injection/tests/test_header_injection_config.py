"""Config validation: every mistake is an InterceptorConfigError whose message starts with the key."""

from __future__ import annotations

from typing import Any

import pytest
from kanal.pipeline.chain import Pipeline
from kanal.pipeline.interceptor import InterceptorConfigError, InterceptorSpec
from kanal.pipeline.registry import PluginRegistry

import kanal_header_injection
from kanal_header_injection import HeaderInjection


@pytest.mark.parametrize(
    ("config", "key", "detail"),
    [
        ({}, "headers", "required"),
        ({"headers": None}, "headers", "required"),
        ({"headers": {}}, "headers", "non-empty mapping"),
        ({"headers": ["x-origin"]}, "headers", "non-empty mapping"),
        ({"headers": {"": "v"}}, "headers", "non-empty strings"),
        ({"headers": {1: "v"}}, "headers", "non-empty strings"),
        ({"headers": {"x-a": True}}, "headers.x-a", "a string, a number or null"),
        ({"headers": {"x-a": ["v"]}}, "headers.x-a", "a string, a number or null"),
        ({"headers": {"x-a": "{{clientid}}"}}, "headers.x-a", "unknown template variable {{clientid}}"),
        ({"headers": {"x-a": "{{client_address}}"}}, "headers.x-a", "unknown template variable"),
        ({"headers": {"x-a": "{{clientId}"}}, "headers.x-a", "does not start a template variable"),
        ({"headers": {"x-a": "{{ {{topic}}"}}, "headers.x-a", "does not start a template variable"),
        ({"headers": {"x-a": "${HOSTNAME}"}}, "headers.x-a", "placeholder"),
        ({"headers": {"x": "v"}, "topics": "orders"}, "topics", "non-empty list"),
        ({"headers": {"x": "v"}, "topics": []}, "topics", "non-empty list"),
        ({"headers": {"x": "v"}, "topics": ["ok", 3]}, "topics[1]", "non-empty string"),
        ({"headers": {"x": "v"}, "topics": ["ok", "orders-(eu"]}, "topics[1]", "invalid regular expression"),
        ({"headers": {"x": "v"}, "overrideIfExists": "yes"}, "overrideIfExists", "true or false"),
        ({"headers": {"x": "v"}, "override": True}, "override", "unknown key"),
    ],
)
def test_bad_config_names_the_key(config: dict[str, Any], key: str, detail: str) -> None:
    with pytest.raises(InterceptorConfigError) as info:
        HeaderInjection(config)
    message = str(info.value)
    assert message.startswith(f"{key}: "), message
    assert detail in message


@pytest.mark.parametrize(
    "config",
    [
        {"headers": {"x-origin": "kanal"}},
        {"headers": {"x-a": "}} {not a template} {{topic}}", "x-b": 1, "x-c": None}},
        {"headers": {"x": "v"}, "topics": ["orders", ".*-eu"], "overrideIfExists": False},
    ],
)
def test_good_config(config: dict[str, Any]) -> None:
    HeaderInjection(config)


def test_the_gateway_reports_the_interceptor_name_and_the_key() -> None:
    registry = PluginRegistry()
    registry.register(kanal_header_injection, "header-injection")
    spec = InterceptorSpec("add-origin", "header-injection", config={"headers": {"x-a": "{{nope}}"}})
    with pytest.raises(InterceptorConfigError, match=r"interceptor 'add-origin' \(header-injection\): headers\.x-a: "):
        Pipeline(registry).configure([spec])
