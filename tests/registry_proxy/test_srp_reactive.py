"""Reactive mode: command parsing, the permission store, and the live path over a real Kafka (Tansu)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import trio
from kanal_registry_proxy.reactive import CommandError, PermissionStore, application_instance, parse_command
from kanal_registry_proxy.testing.proxy import ProxyThread, wait_until

from kanal.api import StateLog
from registry_proxy.srp_helpers import basic, command_line, register


def test_commands_are_validated() -> None:
    key, value = application_instance("orders", "orders-app", [("PREFIXED", "orders-", ["Read", "write"])])
    instance = parse_command(key, value)
    assert instance.service_account == "orders-app"
    assert instance.grants[0].permissions == frozenset({"Read", "Write"})
    bad = [
        (b"Other/orders", value, "unknown key"),
        (b"ApplicationInstance/other", value, "does not match"),
        (key, b"{", "not JSON"),
        (key, json.dumps({"kind": "Topic"}).encode(), "ApplicationInstance"),
        (key, application_instance("orders", "", [])[1], "serviceAccount"),
        (key, application_instance("orders", "a", [("EXACT", "x", ["Read"])])[1], "patternType"),
        (key, application_instance("orders", "a", [("LITERAL", "x", ["Delete"])])[1], "not Read or Write"),
    ]
    for k, v, problem in bad:
        with pytest.raises(CommandError, match=problem):
            parse_command(k, v)


def test_permission_store_union_and_matching() -> None:
    store = PermissionStore()
    store.apply(*application_instance("a", "svc", [("LITERAL", "orders-value", ["Read"])]))
    store.apply(*application_instance("b", "svc", [("PREFIXED", "pay", ["Write"])]))
    assert store.allowed("svc", "Read", "orders-value")
    assert not store.allowed("svc", "Read", "orders-value-extra")  # LITERAL is exact
    assert store.allowed("svc", "Write", "payments-value")
    assert not store.allowed("svc", "Read", "payments-value")  # Write does not imply Read
    assert not store.allowed("other", "Read", "orders-value")
    store.apply(b"ApplicationInstance/a", None)
    assert not store.allowed("svc", "Read", "orders-value")
    with pytest.raises(CommandError):
        store.apply(*application_instance("b", "svc", [("LITERAL", "x", ["Nope"])]))
    assert store.allowed("svc", "Write", "payments-value")  # a refused command keeps the previous set


def state_log(bootstrap: str, topic: str) -> StateLog:
    return command_line({"KAFKA_BOOTSTRAP_SERVERS": bootstrap}).state_log(topic)


async def publish(bootstrap: str, topic: str, key: bytes, value: bytes | None) -> None:
    log = state_log(bootstrap, topic)
    try:
        await log.ensure_topic()
        await log.append(key, value)
    finally:
        await log.aclose()


async def read_all(bootstrap: str, topic: str) -> list[tuple[bytes, Any]]:
    log = state_log(bootstrap, topic)
    try:
        end = await log.end_offset()
        offset, found = 0, []
        while offset < end:
            records, offset = await log.read(offset, 0.1)
            found += [(r.key, json.loads(r.value) if r.value else None) for r in records]
        return found
    finally:
        await log.aclose()


@pytest.mark.integration
def test_permissions_over_kafka_apply_live_and_proxies_heartbeat(
    tansu: Any, make_proxy: Callable[..., ProxyThread]
) -> None:
    suffix = uuid.uuid4().hex[:8]
    commands, events = f"_srp_commands_{suffix}", f"_srp_events_{suffix}"
    trio.run(
        publish,
        tansu.bootstrap,
        commands,
        *application_instance("orders", "alice", [("PREFIXED", "orders-", ["Read", "Write"])]),
    )
    proxy = make_proxy(
        AUTHORIZATION_MODE="reactive",
        KAFKA_BOOTSTRAP_SERVERS=tansu.bootstrap,
        SRP_COMMANDS_TOPIC=commands,
        SRP_EVENTS_TOPIC=events,
        SRP_HEARTBEAT_INTERVAL="200ms",
        SRP_INSTANCE_ID="proxy-1",
        SCHEMA_REGISTRY_PROXY_APP_ID="srp-test",
    )
    # loaded at startup
    assert register(proxy.url, "orders-value", user="alice").status_code == 200
    assert httpx.get(f"{proxy.url}/subjects/orders-value/versions", headers=basic("bob")).status_code == 403

    # a new command applies without a restart
    trio.run(
        publish,
        tansu.bootstrap,
        commands,
        *application_instance("audit", "bob", [("LITERAL", "orders-value", ["Read"])]),
    )
    assert wait_until(
        lambda: httpx.get(f"{proxy.url}/subjects/orders-value/versions", headers=basic("bob")).status_code == 200
    )
    # an invalid command is refused and changes nothing
    trio.run(publish, tansu.bootstrap, commands, b"ApplicationInstance/audit", b'{"kind": "ApplicationInstance"}')
    # a tombstone revokes
    trio.run(publish, tansu.bootstrap, commands, b"ApplicationInstance/orders", None)
    assert wait_until(lambda: register(proxy.url, "orders-value", user="alice").status_code == 403)
    assert httpx.get(f"{proxy.url}/subjects/orders-value/versions", headers=basic("bob")).status_code == 200

    def heartbeat_seen() -> bool:
        found = dict(trio.run(read_all, tansu.bootstrap, events))
        beat = found.get(b"heartbeat/srp-test/proxy-1")
        return beat is not None and beat["type"] == "Heartbeat" and beat["applicationInstances"] == 1

    assert wait_until(heartbeat_seen)
    # The proxy writes its events in the order it reads the commands: once the tombstone's event is
    # there, the invalid command's (read before it) is too. The valid command under that key was
    # acknowledged CommandApplied earlier; the last event under the key must be the rejection.
    orders_event = b"command/srp-test/proxy-1/ApplicationInstance/orders"
    assert wait_until(lambda: orders_event in dict(trio.run(read_all, tansu.bootstrap, events)))
    found = dict(trio.run(read_all, tansu.bootstrap, events))
    rejected = found[b"command/srp-test/proxy-1/ApplicationInstance/audit"]
    assert rejected["type"] == "CommandRejected", rejected
    assert "metadata and spec objects are required" in rejected["error"]
    assert found[orders_event]["type"] == "CommandApplied"
    proxy.stop()
    stopped = dict(trio.run(read_all, tansu.bootstrap, events))[b"heartbeat/srp-test/proxy-1"]
    assert stopped["type"] == "Stopped"
