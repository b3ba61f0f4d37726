"""Reactive mode: permissions distributed over Kafka, applied live; heartbeats for discovery.

Two compacted, single-partition topics on the backing cluster:

``_vendor_srp_commands`` (``SRP_COMMANDS_TOPIC``), written by the management console (or
``kanal registry-proxy permissions apply``), read by every proxy from the start. One record per
application instance; key ``ApplicationInstance/<name>``, value (UTF-8 JSON)::

    {"apiVersion": "kanal.io/v1", "kind": "ApplicationInstance",
     "metadata": {"name": "orders-prod"},
     "spec": {"serviceAccount": "orders-app",
              "resources": [{"type": "SUBJECT", "name": "orders-", "patternType": "PREFIXED",
                             "permissions": ["Read", "Write"]}]}}

A null value (tombstone) deletes the instance's permissions. ``patternType`` is LITERAL (the exact
subject; the name ``*`` matches every subject) or PREFIXED; ``permissions`` lists Read and/or Write
(Write does not imply Read). A principal's permissions are the union over the instances whose
``serviceAccount`` it is. An invalid record is refused (logged, counted, answered with a
``CommandRejected`` event) and leaves the previous permissions of that instance in force.

``_vendor_srp_events`` (``SRP_EVENTS_TOPIC``), written by the proxies. Key
``heartbeat/<appId>/<instanceId>``, every ``SRP_HEARTBEAT_INTERVAL``::

    {"type": "Heartbeat", "appId": "schema-registry-proxy", "instanceId": "host:8081",
     "version": "1.0.0", "mode": "reactive", "authProvider": "basic", "startedAt": "...Z",
     "at": "...Z", "intervalMs": 10000, "commandsOffset": 42, "applicationInstances": 3}

``"type": "Stopped"`` under the same key when the proxy shuts down; and, under
``command/<appId>/<instanceId>/<command key>``, ``{"type": "CommandApplied"|"CommandRejected",
"command": key, "offset": n, "at": ..., "error": ...}`` for each command read while running.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
import trio

from kanal.api import LogError, LogRecord, StateLog
from kanal_registry_proxy import __version__
from kanal_registry_proxy.metrics import ProxyMetrics

log = logging.getLogger(__name__)

KEY_PREFIX = "ApplicationInstance/"
PERMISSIONS = ("Read", "Write")
_NAME = re.compile(r"^[A-Za-z0-9._-][A-Za-z0-9._:@/-]{0,252}$")


class CommandError(ValueError):
    """A command record that cannot be applied."""


@dataclass(frozen=True, slots=True)
class SubjectGrant:
    pattern_type: str  # LITERAL or PREFIXED
    name: str
    permissions: frozenset[str]

    def covers(self, subject: str) -> bool:
        if self.pattern_type == "PREFIXED":
            return subject.startswith(self.name)
        return self.name == "*" or self.name == subject


@dataclass(frozen=True, slots=True)
class ApplicationInstance:
    name: str
    service_account: str
    grants: tuple[SubjectGrant, ...]


def parse_command(key: bytes, value: bytes) -> ApplicationInstance:
    """An ApplicationInstance from one commands record, or CommandError."""
    try:
        name_from_key = key.decode("utf-8")
    except UnicodeDecodeError:
        raise CommandError("the key is not UTF-8") from None
    if not name_from_key.startswith(KEY_PREFIX):
        raise CommandError(f"unknown key {name_from_key!r} (expected {KEY_PREFIX}<name>)")
    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise CommandError(f"not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("kind") != "ApplicationInstance":
        raise CommandError('expected an object with "kind": "ApplicationInstance"')
    metadata, spec = document.get("metadata"), document.get("spec")
    if not isinstance(metadata, dict) or not isinstance(spec, dict):
        raise CommandError("metadata and spec objects are required")
    name = metadata.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise CommandError("metadata.name must be a name of letters, digits and . _ - : @ /")
    if name_from_key != KEY_PREFIX + name:
        raise CommandError(f"the key {name_from_key!r} does not match metadata.name {name!r}")
    account = spec.get("serviceAccount")
    if not isinstance(account, str) or not account:
        raise CommandError("spec.serviceAccount must be a non-empty string")
    resources = spec.get("resources", [])
    if not isinstance(resources, list):
        raise CommandError("spec.resources must be a list")
    grants: list[SubjectGrant] = []
    for index, item in enumerate(resources):
        where = f"spec.resources[{index}]"
        if not isinstance(item, dict):
            raise CommandError(f"{where}: expected an object")
        if str(item.get("type", "SUBJECT")).upper() != "SUBJECT":
            continue  # other resource kinds (topics, groups) are for other services
        subject, pattern = item.get("name"), str(item.get("patternType", "LITERAL")).upper()
        if not isinstance(subject, str) or not subject:
            raise CommandError(f"{where}.name must be a non-empty string")
        if pattern not in ("LITERAL", "PREFIXED"):
            raise CommandError(f"{where}.patternType must be LITERAL or PREFIXED")
        permissions = item.get("permissions")
        if not isinstance(permissions, list) or not permissions:
            raise CommandError(f"{where}.permissions must list Read and/or Write")
        canonical: set[str] = set()
        for permission in permissions:
            found = next(
                (p for p in PERMISSIONS if isinstance(permission, str) and p.lower() == permission.lower()), None
            )
            if found is None:
                raise CommandError(f"{where}.permissions: {permission!r} is not Read or Write")
            canonical.add(found)
        grants.append(SubjectGrant(pattern, subject, frozenset(canonical)))
    return ApplicationInstance(name, account, tuple(grants))


class PermissionStore:
    """The application instances known, and the decisions they give."""

    def __init__(self) -> None:
        self.instances: dict[str, ApplicationInstance] = {}
        self._by_account: dict[str, tuple[SubjectGrant, ...]] = {}
        self._decisions: dict[tuple[str, str, str], bool] = {}

    def apply(self, key: bytes, value: bytes | None) -> str:
        """Applies one commands record; returns the instance name. Raises CommandError."""
        if value is None:
            name = key.decode("utf-8", "replace")
            if not name.startswith(KEY_PREFIX):
                raise CommandError(f"unknown key {name!r} (expected {KEY_PREFIX}<name>)")
            self.instances.pop(name[len(KEY_PREFIX) :], None)
            self._rebuild()
            return name[len(KEY_PREFIX) :]
        instance = parse_command(key, value)
        self.instances[instance.name] = instance
        self._rebuild()
        return instance.name

    def _rebuild(self) -> None:
        by_account: dict[str, list[SubjectGrant]] = {}
        for instance in self.instances.values():
            by_account.setdefault(instance.service_account, []).extend(instance.grants)
        self._by_account = {account: tuple(grants) for account, grants in by_account.items()}
        self._decisions = {}

    def allowed(self, principal: str, permission: str, subject: str) -> bool:
        key = (principal, permission, subject)
        decision = self._decisions.get(key)
        if decision is None:
            decision = any(
                permission in grant.permissions and grant.covers(subject)
                for grant in self._by_account.get(principal, ())
            )
            if len(self._decisions) > 100_000:
                self._decisions = {}
            self._decisions[key] = decision
        return decision


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class ReactiveSync:
    """Follows the commands topic into a :class:`PermissionStore` and heartbeats on the events topic.

    The two topics are state logs of the backing cluster: the gateway's (``services.state_log``) when
    it hosts the proxy, the command line's (``cli.state_log``) alone. :meth:`run` closes them.
    """

    def __init__(
        self,
        store: PermissionStore,
        commands: StateLog,
        events: StateLog,
        *,
        app_id: str,
        instance_id: str,
        heartbeat_interval: float = 10.0,
        auth_provider: str = "",
        metrics: ProxyMetrics | None = None,
    ) -> None:
        self.store = store
        self.commands = commands
        self.events = events
        self.commands_topic = commands.topic
        self.events_topic = events.topic
        self.app_id = app_id
        self.instance_id = instance_id
        self.heartbeat_interval = heartbeat_interval
        self.auth_provider = auth_provider
        self.metrics = metrics
        self.offset = 0
        self.loaded = trio.Event()
        self.started_at = _now()

    def _apply(self, record: LogRecord, live: bool, acks: list[tuple[bytes, bytes]]) -> None:
        key = record.key.decode("utf-8", "replace")
        error: str | None
        try:
            name = self.store.apply(record.key, record.value)
        except CommandError as exc:
            log.error(
                "reactive command %s at offset %d refused: %s",
                key,
                record.offset,
                exc,
                extra={"event": "permissions_refused", "command": key, "offset": record.offset},
            )
            outcome, error = "rejected", str(exc)
        else:
            log.info(
                "permissions of application instance %s %s",
                name,
                "deleted" if record.value is None else "applied",
                extra={"event": "permissions_changed", "command": key, "offset": record.offset},
            )
            outcome, error = "applied", None
        if self.metrics is not None:
            self.metrics.reactive_commands.labels(outcome).inc()
            self.metrics.reactive_sets.set(len(self.store.instances))
        if live:
            event: dict[str, Any] = {
                "type": "CommandApplied" if outcome == "applied" else "CommandRejected",
                "appId": self.app_id,
                "instanceId": self.instance_id,
                "command": key,
                "offset": record.offset,
                "at": _now(),
            }
            if error is not None:
                event["error"] = error
            acks.append((f"command/{self.app_id}/{self.instance_id}/{key}".encode(), orjson.dumps(event)))

    def heartbeat(self, kind: str = "Heartbeat") -> tuple[bytes, bytes]:
        value = {
            "type": kind,
            "appId": self.app_id,
            "instanceId": self.instance_id,
            "version": __version__,
            "mode": "reactive",
            "authProvider": self.auth_provider,
            "startedAt": self.started_at,
            "at": _now(),
            "intervalMs": int(self.heartbeat_interval * 1000),
            "commandsOffset": self.offset,
            "applicationInstances": len(self.store.instances),
        }
        return f"heartbeat/{self.app_id}/{self.instance_id}".encode(), orjson.dumps(value)

    async def _retrying(self, what: str, action: Any) -> Any:
        delay = 0.5
        while True:
            try:
                return await action()
            except (LogError, OSError) as exc:
                log.warning("reactive mode: %s failed (%s); retrying in %.1f s", what, exc, delay)
                await trio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def load(self, commands: StateLog) -> None:
        """Reads the commands topic up to its end (the permissions in force at startup)."""
        await self._retrying("creating the commands topic", commands.ensure_topic)
        end: int = await self._retrying("reading the end of the commands topic", commands.end_offset)
        while self.offset < end:
            records, self.offset = await self._retrying(
                "reading the commands topic", lambda: commands.read(self.offset, 0.1)
            )
            for record in records:
                self._apply(record, False, [])
        self.loaded.set()
        log.info(
            "reactive mode: %d application instances loaded from %s",
            len(self.store.instances),
            self.commands_topic,
            extra={"event": "permissions_loaded", "offset": self.offset},
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        commands, events = self.commands, self.events
        try:
            await self.load(commands)
            await self._retrying("creating the events topic", events.ensure_topic)
            task_status.started()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._follow, commands, events)
                nursery.start_soon(self._heartbeats, events)
        finally:
            with trio.CancelScope(shield=True):
                with trio.move_on_after(2):
                    with contextlib.suppress(LogError, OSError):
                        await events.append(*self.heartbeat("Stopped"))
                await commands.aclose()
                await events.aclose()

    async def _follow(self, commands: StateLog, events: StateLog) -> None:
        while True:
            records, next_offset = await self._retrying(
                "reading the commands topic", lambda: commands.read(self.offset, 1.0)
            )
            acks: list[tuple[bytes, bytes]] = []
            for record in records:
                self._apply(record, True, acks)
            self.offset = next_offset
            for key, value in acks:
                try:
                    await events.append(key, value)
                except (LogError, OSError) as exc:
                    log.warning("reactive mode: cannot write an event: %s", exc)

    async def _heartbeats(self, events: StateLog) -> None:
        while True:
            try:
                await events.append(*self.heartbeat())
            except (LogError, OSError) as exc:
                log.warning("reactive mode: heartbeat not written: %s", exc)
            await trio.sleep(self.heartbeat_interval)


def application_instance(
    name: str, service_account: str, resources: Iterable[tuple[str, str, Iterable[str]]]
) -> tuple[bytes, bytes]:
    """A commands record: ``resources`` holds (patternType, subject name, permissions)."""
    document = {
        "apiVersion": "kanal.io/v1",
        "kind": "ApplicationInstance",
        "metadata": {"name": name},
        "spec": {
            "serviceAccount": service_account,
            "resources": [
                {"type": "SUBJECT", "name": subject, "patternType": pattern, "permissions": list(permissions)}
                for pattern, subject, permissions in resources
            ],
        },
    }
    return (KEY_PREFIX + name).encode(), orjson.dumps(document)
