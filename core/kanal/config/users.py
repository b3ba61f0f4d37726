"""Admin API users: ``GATEWAY_ADMIN_API_USERS`` parsed, and HTTP Basic credentials checked.

The variable holds a YAML (or JSON, which is YAML) list of ``{username, password, admin}``; users
without ``admin: true`` are read-only. This module has no HTTP dependency, so the settings parser
can use it.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Sequence
from dataclasses import dataclass

import yaml

USERS_ENV = "GATEWAY_ADMIN_API_USERS"
EXAMPLE = "[{username: admin, password: <secret>, admin: true}]"


@dataclass(frozen=True, slots=True)
class AdminUser:
    """One admin API user; ``admin`` False means read-only (GET and read-only POST calls)."""

    username: str
    password: str
    admin: bool = False

    def __repr__(self) -> str:  # never print the password
        return f"AdminUser(username={self.username!r}, admin={self.admin})"


def parse_users(text: str) -> tuple[AdminUser, ...]:
    """Users from the YAML/JSON list; raises ValueError naming the entry at fault."""
    try:
        items = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"invalid YAML/JSON: {exc}") from None
    if items is None:
        return ()
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list):
        raise ValueError(f"expected a list of {{username, password, admin}}, e.g. {EXAMPLE}")
    users: list[AdminUser] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"entry {i}: expected a mapping with username, password and admin")
        unknown = set(item) - {"username", "password", "admin"}
        if unknown:
            raise ValueError(f"entry {i}: unknown key {sorted(unknown)[0]!r} (expected username, password, admin)")
        username, password, admin = item.get("username"), item.get("password"), item.get("admin", False)
        if not isinstance(username, str) or not username or ":" in username:
            raise ValueError(f"entry {i}: username is required, a non-empty string without ':'")
        if not isinstance(password, str | int) or isinstance(password, bool) or str(password) == "":
            raise ValueError(f"entry {i} ({username}): password is required, a non-empty string")
        if not isinstance(admin, bool):
            raise ValueError(f"entry {i} ({username}): admin must be true or false")
        if any(u.username == username for u in users):
            raise ValueError(f"entry {i}: user {username!r} is listed twice")
        users.append(AdminUser(username, str(password), admin))
    return tuple(users)


def basic_credentials(header: str | None) -> tuple[str, str] | None:
    """(username, password) of an ``Authorization: Basic`` header, or None."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic" or not token:
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    username, sep, password = decoded.partition(":")
    return (username, password) if sep else None


def authenticate(users: Sequence[AdminUser], header: str | None) -> AdminUser | None:
    """The user whose credentials the header carries, or None (compared in constant time)."""
    credentials = basic_credentials(header)
    if credentials is None:
        return None
    username, password = credentials
    found: AdminUser | None = None
    for user in users:
        same_name = hmac.compare_digest(user.username.encode(), username.encode())
        same_password = hmac.compare_digest(user.password.encode(), password.encode())
        if same_name and same_password:
            found = user
    return found


def basic_header(username: str, password: str) -> str:
    """The ``Authorization`` header value for these credentials."""
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
