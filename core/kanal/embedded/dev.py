"""What ``kanal dev`` sets up beside the embedded broker: an admin user and a free admin port."""

from __future__ import annotations

import json
import secrets
import socket
from collections.abc import MutableMapping

from kanal.config.users import USERS_ENV
from kanal.embedded.tansu import free_port

__all__ = ["dev_admin_user", "dev_http_port"]


def dev_admin_user(env: MutableMapping[str, str]) -> str | None:
    """For ``kanal dev``: sets a generated admin user unless ``GATEWAY_ADMIN_API_USERS`` is set, and
    returns the line that tells it."""
    if env.get(USERS_ENV):
        return None
    password = secrets.token_urlsafe(12)
    env[USERS_ENV] = json.dumps([{"username": "admin", "password": password, "admin": True}])
    return (
        f"Kanal dev: admin API user 'admin', password '{password}' "
        f"(export KANAL_USER=admin KANAL_PASSWORD={password}); set {USERS_ENV} to choose your own"
    )


def dev_http_port(env: MutableMapping[str, str]) -> None:
    """For ``kanal dev``: 8888 when free, else a free port (unless ``GATEWAY_HTTP_PORT`` is set)."""
    if env.get("GATEWAY_HTTP_PORT"):
        return
    try:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 8888))
        env["GATEWAY_HTTP_PORT"] = "8888"
    except OSError:
        env["GATEWAY_HTTP_PORT"] = str(free_port())
