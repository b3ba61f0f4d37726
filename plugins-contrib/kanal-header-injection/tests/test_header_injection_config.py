"""Config validation: every mistake is an InterceptorConfigError whose message starts with the key.

Kanal checks the config against the plugin's JSON schema before the constructor runs (types,
required and unknown keys, empty values); the constructor checks the rest (templates, regexes).
"""

from __future__ import annotations

from typing import Any

import pytest
from header_injection_helpers import header_injection
from kanal.api import InterceptorConfigError, InterceptorSpec
from kanal.pipeline.chain import Pipeline
from kanal.pipeline.registry import PluginRegistry
from kanal.testing import FakeServices

import kanal_header_injection


@pytest.mark.parametrize(
    ("config", "key", "detail"),
    [
        # refused by Kanal, from the schema
        ({}, "headers", "required"),
        ({"headers": None}, "headers", "not of type 'object'"),
        ({"headers": {}}, "headers", "should be non-empty"),
        ({"headers": ["x-origin"]}, "headers", "not of type 'object'"),
        ({"headers": {"": "v"}}, "headers", "'' should be non-empty"),
        ({"headers": {1: "v"}}, "headers", "1 is not of type 'string'"),
        ({"headers": {"x-a": True}}, "headers.x-a", "not of type 'string', 'number', 'null'"),
        ({"headers": {"x-a": ["v"]}}, "headers.x-a", "not of type 'string', 'number', 'null'"),
        ({"headers": {"x": "v"}, "topics": "orders"}, "topics", "not of type 'array'"),
        ({"headers": {"x": "v"}, "topics": []}, "topics", "should be non-empty"),
        ({"headers": {"x": "v"}, "topics": ["ok", 3]}, "topics.1", "not of type 'string'"),
        ({"headers": {"x": "v"}, "topics": ["ok", ""]}, "topics.1", "should be non-empty"),
        ({"headers": {"x": "v"}, "overrideIfExists": "yes"}, "overrideIfExists", "not of type 'boolean'"),
        ({"headers": {"x": "v"}, "override": True}, "override", "unknown key"),
        # refused by the constructor
        ({"headers": {"x-a": "{{clientid}}"}}, "headers.x-a", "unknown template variable {{clientid}}"),
        ({"headers": {"x-a": "{{client_address}}"}}, "headers.x-a", "unknown template variable"),
        ({"headers": {"x-a": "{{clientId}"}}, "headers.x-a", "does not start a template variable"),
        ({"headers": {"x-a": "{{ {{topic}}"}}, "headers.x-a", "does not start a template variable"),
        ({"headers": {"x-a": "${HOSTNAME}"}}, "headers.x-a", "placeholder"),
        ({"headers": {"x": "v"}, "topics": ["ok", "orders-(eu"]}, "topics.1", "invalid regular expression"),
    ],
)
def test_bad_config_names_the_key(config: dict[str, Any], key: str, detail: str) -> None:
    with pytest.raises(InterceptorConfigError) as info:
        header_injection(config)
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
    header_injection(config)


@pytest.mark.parametrize(
    ("config", "where"),
    [
        ({"headers": {"x-a": "{{nope}}"}}, r"headers\.x-a: "),  # the constructor's check
        ({"headers": {"x-a": True}}, r"headers\.x-a: "),  # the schema's
    ],
)
def test_the_gateway_reports_the_interceptor_name_and_the_key(config: dict[str, Any], where: str) -> None:
    registry = PluginRegistry()
    registry.register(kanal_header_injection, "contrib-header-injection")
    spec = InterceptorSpec("add-origin", "contrib-header-injection", config=config)
    with pytest.raises(
        InterceptorConfigError, match=r"interceptor 'add-origin' \(contrib-header-injection\): " + where
    ):
        Pipeline(registry, lambda plugin: FakeServices()).configure([spec])
