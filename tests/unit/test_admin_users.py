"""GATEWAY_ADMIN_API_USERS parsing and HTTP Basic checks."""

from __future__ import annotations

import pytest

from kanal.api.errors import ConfigError
from kanal.config.settings import build_settings
from kanal.config.users import AdminUser, authenticate, basic_credentials, basic_header, parse_users


def test_yaml_and_json_lists_parse() -> None:
    assert parse_users("[{username: a, password: x, admin: true}, {username: b, password: 12}]") == (
        AdminUser("a", "x", True),
        AdminUser("b", "12", False),
    )
    assert parse_users('[{"username": "a", "password": "x"}]') == (AdminUser("a", "x"),)
    assert parse_users("") == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[{username: a}]", "password is required"),
        ("[{password: x}]", "username is required"),
        ("[{username: a, password: x, admin: maybe}]", "admin must be true or false"),
        ("[{username: a, password: x, role: root}]", "unknown key 'role'"),
        ("[{username: a, password: x}, {username: a, password: y}]", "listed twice"),
        ("just text", "expected a list"),
        ("[{username: 'a:b', password: x}]", "without ':'"),
    ],
)
def test_bad_lists_name_the_entry(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_users(text)


def test_settings_error_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="GATEWAY_ADMIN_API_USERS"):
        build_settings({"KAFKA_BOOTSTRAP_SERVERS": "h:1", "GATEWAY_ADMIN_API_USERS": "[{username: a}]"})


def test_passwords_never_show_in_repr() -> None:
    assert "secret" not in repr(AdminUser("a", "secret", True))
    settings = build_settings(
        {"KAFKA_BOOTSTRAP_SERVERS": "h:1", "GATEWAY_ADMIN_API_USERS": "[{username: a, password: secret}]"}
    )
    assert "secret" not in repr(settings)


def test_basic_authentication() -> None:
    users = (AdminUser("a", "pw:with:colons", True), AdminUser("b", "x"))
    assert basic_credentials(basic_header("a", "pw:with:colons")) == ("a", "pw:with:colons")
    assert authenticate(users, basic_header("a", "pw:with:colons")) == users[0]
    assert authenticate(users, basic_header("b", "x")) == users[1]
    assert authenticate(users, basic_header("b", "y")) is None
    assert authenticate(users, "Bearer abc") is None
    assert authenticate(users, "Basic !!!") is None
    assert authenticate(users, None) is None
