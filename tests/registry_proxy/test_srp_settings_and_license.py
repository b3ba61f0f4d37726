"""Settings (variables, defaults, the deprecated mapping), licenses, and every startup refusal."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import pytest
from kanal_registry_proxy.license import LicenseError, check_license, generate_keypair, issue, parse_expiry, verify
from kanal_registry_proxy.service import ProxyService
from kanal_registry_proxy.settings import VARIABLES, load_settings, parse_duration
from kanal_registry_proxy.testing.proxy import license_pair

from kanal.api import ConfigError
from registry_proxy.srp_helpers import basic

DOCS = Path(__file__).resolve().parents[2] / "docs" / "registry-proxy.md"


def env_of(base_env: dict[str, str], **changes: str | None) -> dict[str, str]:
    env = dict(base_env)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def test_defaults(base_env: dict[str, str]) -> None:
    settings = load_settings(env_of(base_env, AUTHORIZATION_MODE=None, KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:9092"))
    assert settings.authorization_mode == "reactive"
    assert settings.http_port == 8081 and settings.bind_host == "0.0.0.0"
    assert settings.guid_subject_cache_ttl == 300.0
    assert settings.topic_acl_cache_ttl == 0.5
    assert settings.topic_acl_lookup_timeout == 5.0
    assert settings.basic_auth_reload_interval == 30.0
    assert settings.basic_auth_allow_plaintext is False
    assert settings.commands_topic == "_vendor_srp_commands" and settings.events_topic == "_vendor_srp_events"
    assert load_settings(env_of(base_env, BASIC_AUTH_LOCATION=None)).basic_auth_location == "/etc/srp/basic-auth.json"


def test_durations_and_super_users(base_env: dict[str, str]) -> None:
    assert parse_duration("500ms", "X") == 0.5
    assert parse_duration("2m", "X") == 120.0
    assert parse_duration("1h", "X") == 3600.0
    assert parse_duration("7", "X") == 7.0
    with pytest.raises(ConfigError, match="AUTHORIZATION_TOPIC_ACL_CACHE_TTL"):
        load_settings(env_of(base_env, AUTHORIZATION_TOPIC_ACL_CACHE_TTL="soon"))
    settings = load_settings(env_of(base_env, AUTHORIZATION_SUPER_USERS=" ops ; break-glass;;"))
    assert settings.super_users == frozenset({"ops", "break-glass"})


@pytest.mark.parametrize(
    ("legacy", "mode", "expected"),
    [
        ("true", None, "reactive"),
        ("true", "read-only", "read-only"),
        ("false", "read-only", "read-only"),
        ("false", None, "reactive"),
    ],
)
def test_auth_use_reactive_config_is_mapped_and_authorization_mode_wins(
    base_env: dict[str, str], legacy: str, mode: str | None, expected: str
) -> None:
    env = env_of(base_env, AUTH_USE_REACTIVE_CONFIG=legacy, AUTHORIZATION_MODE=mode, KAFKA_BOOTSTRAP_SERVERS="h:1")
    settings = load_settings(env)
    assert settings.authorization_mode == expected
    assert any("deprecated" in w for w in settings.warnings)


def test_unknown_mode_and_kafka_requirements(base_env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="AUTHORIZATION_MODE"):
        load_settings(env_of(base_env, AUTHORIZATION_MODE="open"))
    for mode in ("topic-acl", "reactive"):
        with pytest.raises(ConfigError, match="KAFKA_BOOTSTRAP_SERVERS"):
            load_settings(env_of(base_env, AUTHORIZATION_MODE=mode))
    assert not load_settings(env_of(base_env, AUTHORIZATION_MODE="read-only")).needs_kafka
    for mode in ("topic-acl", "reactive"):  # hosted by the gateway: its own KAFKA_* settings
        assert load_settings(env_of(base_env, AUTHORIZATION_MODE=mode), hosted=True).needs_kafka


def test_startup_refuses_unset_auth_provider(base_env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="AUTH_PROVIDER"):
        load_settings(env_of(base_env, AUTH_PROVIDER=None))
    with pytest.raises(ConfigError, match="AUTH_PROVIDER"):
        load_settings(env_of(base_env, AUTH_PROVIDER="testing"))  # the release candidate's provider is gone


def test_startup_refuses_a_missing_license(base_env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="VENDOR_LICENSE"):
        load_settings(env_of(base_env, VENDOR_LICENSE=None))


def test_startup_refuses_an_invalid_license(base_env: dict[str, str]) -> None:
    other_token, _, _ = license_pair()  # signed by another key
    with pytest.raises(ConfigError, match="VENDOR_LICENSE: the license signature is invalid"):
        ProxyService(load_settings(env_of(base_env, VENDOR_LICENSE=other_token)))
    with pytest.raises(ConfigError, match="not a license token"):
        ProxyService(load_settings(env_of(base_env, VENDOR_LICENSE="garbage")))


def test_startup_refuses_an_expired_license(base_env: dict[str, str], license_keys: tuple[str, str, str]) -> None:
    _, _public_key, private_key = license_keys
    expired = issue(private_key.encode(), "acme", int(time.time()) - 60)
    with pytest.raises(ConfigError, match="expired"):
        ProxyService(load_settings(env_of(base_env, VENDOR_LICENSE=expired)))


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read"),
        ("{not json", "not valid JSON"),
        ('{"users": [{"username": "a", "password_hash": "nope"}]}', "not a valid bcrypt hash"),
        (
            '{"users": [{"username": "a", "password_hash": "%s"}, {"username": "a", "password_hash": "%s"}]}'
            % (("$2b$04$abcdefghijklmnopqrstuu9LhO1ifc4Ia9j9r1dzUXhdLgC9xI0ie",) * 2),
            "duplicate user",
        ),
        ('{"users": [{"username": "a", "password": "plain"}]}', "plaintext passwords are rejected"),
    ],
)
def test_startup_refuses_an_invalid_credentials_file(
    base_env: dict[str, str], tmp_path: Path, content: str | None, problem: str
) -> None:
    path = tmp_path / "creds.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=f"BASIC_AUTH_LOCATION: .*{problem}"):
        ProxyService(load_settings(env_of(base_env, BASIC_AUTH_LOCATION=str(path))))


def _metric(service: ProxyService, name: str) -> float | None:
    from prometheus_client import generate_latest

    for line in generate_latest(service.metrics.registry).decode().splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return None


def test_license_round_trip_and_expiry_metric(base_env: dict[str, str], license_keys: tuple[str, str, str]) -> None:
    token, public_key, private_key = license_keys
    found = verify(token, public_key.encode())
    assert found.licensee == "kanal tests" and found.expires_at is None and found.plan == "gateway"
    service = ProxyService(load_settings(base_env))
    assert _metric(service, "license_expiry_timestamp_seconds") is None  # no expiry: not exported
    expires = int(time.time()) + 3600
    expiring = issue(private_key.encode(), "acme", expires, plan="scale")
    service = ProxyService(load_settings(env_of(base_env, VENDOR_LICENSE=expiring)))
    assert _metric(service, "license_expiry_timestamp_seconds") == expires


def test_license_rejects_other_plans_and_tampering() -> None:
    private_pem, public_pem = generate_keypair()
    token = issue(private_pem, "acme")
    head, payload, signature = token.split(".")
    with pytest.raises(LicenseError, match="signature"):
        verify(f"{head}.{payload[:-2]}xx.{signature}", public_pem)
    with pytest.raises(LicenseError, match="plan"):
        issue(private_pem, "acme", plan="console")
    assert check_license(token, public_pem).licensee == "acme"
    end_of_day = datetime.datetime(2030, 1, 31, 23, 59, 59, tzinfo=datetime.UTC)
    assert parse_expiry("2030-01-31") == int(end_of_day.timestamp())
    assert parse_expiry("2030-01-31T12:00:00+00:00") == int(end_of_day.timestamp()) - 11 * 3600 - 3599


def test_a_running_proxy_keeps_serving_after_the_license_expires(
    base_env: dict[str, str], license_keys: tuple[str, str, str], make_proxy: object
) -> None:
    import httpx

    _, _, private_key = license_keys
    soon = issue(private_key.encode(), "acme", int(time.time()) + 2)
    proxy = make_proxy(VENDOR_LICENSE=soon)  # type: ignore[operator]
    assert httpx.get(f"{proxy.url}/schemas/types", headers=basic("alice")).status_code == 200
    time.sleep(max(0.0, (proxy.service.license.expires_at or 0) - time.time()) + 0.3)
    assert proxy.service.license.expired()
    assert httpx.get(f"{proxy.url}/schemas/types", headers=basic("alice")).status_code == 200  # still serving
    with pytest.raises(ConfigError, match="expired"):  # the next start fails
        ProxyService(load_settings(env_of(base_env, VENDOR_LICENSE=soon)))


def test_every_variable_is_documented() -> None:
    text = DOCS.read_text()
    missing = [name for name, _, _ in VARIABLES if f"`{name}`" not in text]
    assert not missing, f"undocumented variables: {missing}"
