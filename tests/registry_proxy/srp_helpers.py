"""Helpers of the registry proxy tests."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from kanal_registry_proxy.authorization import ReactiveMode
from kanal_registry_proxy.reactive import PermissionStore, application_instance
from kanal_registry_proxy.testing.proxy import ProxyThread

from kanal.admin.cli import CommandLine
from kanal.api import CliContext

USERS = {"alice": "alice-pass", "bob": "bob-pass", "root": "root-pass"}


def basic(user: str, password: str | None = None) -> dict[str, str]:
    password = USERS.get(user, "") if password is None else password
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


AVRO_ORDER = json.dumps(
    {"type": "record", "name": "Order", "namespace": "com.acme", "fields": [{"name": "id", "type": "long"}]}
)
VND = "application/vnd.schemaregistry.v1+json"


def register(url: str, subject_path: str, schema: str = AVRO_ORDER, user: str = "root", **extra: Any) -> Any:
    import httpx

    return httpx.post(
        f"{url}/subjects/{subject_path}/versions",
        content=json.dumps({"schema": schema, **extra}),
        headers={"Content-Type": VND, **basic(user)},
    )


def reactive(proxy: ProxyThread, grants: dict[str, list[tuple[str, str, list[str]]]]) -> PermissionStore:
    """Switches a proxy to reactive mode with the given grants (account -> [(pattern, name, perms)])."""
    store = PermissionStore()
    for account, resources in grants.items():
        store.apply(*application_instance(f"app-{account}", account, resources))
    proxy.service.authorization.mode = ReactiveMode(store, None)
    return store


def command_line(env: Mapping[str, str]) -> CliContext:
    """What ``kanal registry-proxy`` gets from ``kanal`` in the environment ``env``."""
    return CommandLine(env)
