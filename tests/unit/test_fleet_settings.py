"""The fleet's settings: the group id, the rack, the membership timings (``KAFKA_*`` client
properties) and the variables of earlier releases that are refused, naming what replaces them."""

from __future__ import annotations

import pytest

from kanal.api.errors import ConfigError
from kanal.config.settings import REMOVED, build_settings


def test_the_group_id_defaults_to_the_cluster_ids_fleet_group() -> None:
    assert build_settings({}).fleet_group_id == "kanal_gateway-fleet"
    assert build_settings({"GATEWAY_CLUSTER_ID": "payments"}).fleet_group_id == "kanal_payments-fleet"
    settings = build_settings({"GATEWAY_CLUSTER_ID": "payments", "GATEWAY_GROUP_ID": "fleet-3"})
    assert settings.fleet_group_id == "fleet-3"
    assert build_settings({}, {"gateway": {"groupId": "from-yaml", "rackId": "zone-b"}}).rack_id == "zone-b"


def test_the_timings_are_kafka_client_properties_with_kafkas_defaults() -> None:
    upstream = build_settings({}).upstream
    assert (upstream.heartbeat_interval_ms, upstream.session_timeout_ms) == (3000, 45000)
    upstream = build_settings({"KAFKA_HEARTBEAT_INTERVAL_MS": "500", "KAFKA_SESSION_TIMEOUT_MS": "6000"}).upstream
    assert (upstream.heartbeat_interval_ms, upstream.session_timeout_ms) == (500, 6000)
    upstream = build_settings({}, {"kafka": {"session.timeout.ms": 10000}}).upstream
    assert upstream.session_timeout_ms == 10000


@pytest.mark.parametrize(
    "env,key,problem",
    [
        ({"KAFKA_SESSION_TIMEOUT_MS": "soon"}, "KAFKA_SESSION_TIMEOUT_MS", "expected milliseconds"),
        ({"KAFKA_HEARTBEAT_INTERVAL_MS": "0"}, "KAFKA_HEARTBEAT_INTERVAL_MS", "between 1 and"),
        (
            {"KAFKA_HEARTBEAT_INTERVAL_MS": "6000", "KAFKA_SESSION_TIMEOUT_MS": "6000"},
            "KAFKA_HEARTBEAT_INTERVAL_MS",
            "lower than the session timeout (KAFKA_SESSION_TIMEOUT_MS=6000)",
        ),
        ({"GATEWAY_GROUP_ID": " "}, "GATEWAY_GROUP_ID", "must not be empty"),
    ],
)
def test_bad_values_fail_at_startup_naming_the_variable(env: dict[str, str], key: str, problem: str) -> None:
    with pytest.raises(ConfigError) as failed:
        build_settings(env)
    assert failed.value.key == key and problem in failed.value.problem


@pytest.mark.parametrize("name", sorted(REMOVED))
def test_removed_variables_fail_at_startup_naming_the_replacement(name: str) -> None:
    with pytest.raises(ConfigError) as failed:
        build_settings({name: "30000"})
    assert failed.value.key == name
    assert f"tuned by {REMOVED[name]} now" in failed.value.problem and f"unset {name}" in failed.value.problem


def test_removed_variables_are_refused_in_the_config_file_too() -> None:
    with pytest.raises(ConfigError) as failed:
        build_settings({}, {"gateway": {"consumerGroupPollIntervalMs": 100}})
    assert failed.value.key == "gateway.consumerGroupPollIntervalMs"
    assert "KAFKA_HEARTBEAT_INTERVAL_MS" in failed.value.problem


def test_the_replacements_are_the_ones_the_issue_names() -> None:
    assert REMOVED == {
        "GATEWAY_CONSUMER_GROUP_MEMBERSHIP_TIMEOUT_MS": "KAFKA_SESSION_TIMEOUT_MS",
        "GATEWAY_CONSUMER_GROUP_POLL_INTERVAL_MS": "KAFKA_HEARTBEAT_INTERVAL_MS",
        "GATEWAY_INIT_CONSUMER_GROUP_MEMBERSHIP_TIMEOUT_MS": "KAFKA_SESSION_TIMEOUT_MS",
    }
