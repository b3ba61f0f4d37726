"""Config validation: Kanal converts the config into ``TopicQuotaConfig`` before the constructor runs,
and every mistake is an InterceptorConfigError whose message starts with the key at fault.
"""

from __future__ import annotations

from typing import Any

import pytest
from kanal.api import InterceptorConfigError
from kanal.testing import Harness

from kanal_topic_quota import TopicQuota, TopicQuotaConfig


@pytest.mark.parametrize(
    ("config", "key", "detail"),
    [
        ({}, "maxTopics", "required"),
        ({"prefix": "team-a."}, "maxTopics", "required"),
        ({"maxTopics": -1}, "maxTopics", ">= 0"),
        ({"maxTopics": "3"}, "maxTopics", "Expected `int`, got `str`"),
        ({"maxTopics": 2.5}, "maxTopics", "Expected `int`, got `float`"),
        ({"maxTopics": True}, "maxTopics", "Expected `int`, got `bool`"),
        ({"maxTopics": None}, "maxTopics", "Expected `int`, got `null`"),
        ({"maxTopics": 3, "prefix": 7}, "prefix", "Expected `str`, got `int`"),
        ({"maxTopics": 3, "prefix": None}, "prefix", "Expected `str`, got `null`"),
        ({"maxTopics": 3, "max_topics": 3}, "max_topics", "unknown key (expected maxTopics, prefix)"),
    ],
)
def test_bad_config_names_the_key(config: dict[str, Any], key: str, detail: str) -> None:
    with pytest.raises(InterceptorConfigError) as info:
        Harness().add(TopicQuota, config)
    message = str(info.value)
    assert message.startswith(f"{key}: "), message
    assert detail in message


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"maxTopics": 0}, TopicQuotaConfig(maxTopics=0, prefix="")),
        ({"maxTopics": 50, "prefix": "team-a."}, TopicQuotaConfig(maxTopics=50, prefix="team-a.")),
    ],
)
def test_good_config_is_what_the_interceptor_gets(config: dict[str, Any], expected: TopicQuotaConfig) -> None:
    assert Harness().add(TopicQuota, config).config == expected


def test_operators_see_the_schema() -> None:
    """The admin API shows this schema (derived from the config type) for the plugin."""
    schema = TopicQuota.json_schema()
    assert schema is not None
    properties = schema["$defs"]["TopicQuotaConfig"]["properties"]
    assert properties["maxTopics"]["minimum"] == 0
    assert properties["prefix"]["default"] == ""
    assert schema["$defs"]["TopicQuotaConfig"]["required"] == ["maxTopics"]
