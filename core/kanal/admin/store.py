"""The resource store: every admin resource in one compacted topic, followed by every gateway node.

Writes go to the topic first; every node (the writer included) applies a change only when its
follower reads it back, so all nodes apply the same changes in the same order. The record key is
``[kind, name, key fields...]`` (JSON), the value the canonical manifest (JSON), a tombstone deletes.
A write returns once this node has applied it (read-your-writes), so a PUT answers with the
resource's status on this node.

The follower long-polls (Fetch with a 500 ms wait), so a change made through one node is applied by
the others well within a second. A restart reads the topic from the beginning before the node reports
ready, so it loses nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import orjson
import trio

from kanal.api.errors import LogError
from kanal.api.resources import (
    PENDING,
    READY,
    Key,
    KindRegistry,
    Manifest,
    ResourceError,
    ResourceKind,
    Status,
    invalid,
)
from kanal.api.services import LogRecord

log = logging.getLogger(__name__)

UpsertResult = Literal["CREATED", "UPDATED", "NOT_CHANGED"]
FOLLOW_WAIT = 0.5  # seconds a Fetch waits for new records
WRITE_VISIBLE_TIMEOUT = 10.0  # seconds a write waits to be applied on this node


class LogBackend(Protocol):
    """A single-partition compacted log (see :class:`~kanal.net.state_log.CompactedLog`)."""

    async def ensure_topic(self) -> None: ...

    async def append(self, key: bytes, value: bytes | None) -> int: ...

    async def end_offset(self) -> int: ...

    async def read(self, offset: int, max_wait: float = ...) -> tuple[list[LogRecord], int]: ...

    async def aclose(self) -> None: ...


class MemoryLog:
    """An in-process log with the same behaviour, for unit tests (and nodes of one process)."""

    def __init__(self) -> None:
        self.records: list[LogRecord] = []
        self._changed = trio.Event()

    async def ensure_topic(self) -> None:
        return None

    async def append(self, key: bytes, value: bytes | None) -> int:
        offset = len(self.records)
        self.records.append(LogRecord(offset, key, value, int(time.time() * 1000)))
        self._changed.set()
        self._changed = trio.Event()
        return offset

    async def end_offset(self) -> int:
        return len(self.records)

    async def read(self, offset: int, max_wait: float = FOLLOW_WAIT) -> tuple[list[LogRecord], int]:
        if offset >= len(self.records) and max_wait > 0:
            with trio.move_on_after(max_wait):
                await self._changed.wait()
        out = self.records[offset:]
        return out, offset + len(out)

    async def aclose(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Change:
    """What a write did, for the caller and the audit log."""

    kind: str
    key: Key
    result: UpsertResult | Literal["DELETED"]
    resource: Manifest


class ResourceStore:
    """The stored resources of every kind, as this node has read them from the log."""

    def __init__(self, kinds: KindRegistry, writer: LogBackend, reader: LogBackend | None = None) -> None:
        self.kinds = kinds
        self.writer = writer
        self.reader = reader if reader is not None else writer
        self._items: dict[str, dict[Key, Manifest]] = {}
        self._status: dict[str, dict[Key, Status]] = {}
        self._foreign: dict[bytes, bytes] = {}  # records of kinds no plugin on this node knows
        self.position = 0  # next offset to read
        self.loaded = trio.Event()
        self.last_contact: float | None = None  # time.monotonic() of the last successful read
        self.last_error: str | None = None
        self.applied_records = 0
        self._waiters: list[tuple[int, trio.Event]] = []
        self._write_lock = trio.Lock()

    # -- reading ---------------------------------------------------------------------------------

    def resources(self, kind: str) -> list[Manifest]:
        """The stored manifests of one kind (canonical form, without status), in name order."""
        items = self._items.get(kind, {})
        return [items[k] for k in sorted(items, key=_sort_key)]

    def get(self, kind: str, key: Key) -> Manifest | None:
        return self._items.get(kind, {}).get(key)

    def status(self, kind: ResourceKind, key: Key) -> Status | None:
        if not kind.has_status:
            return None
        return self._status.get(kind.kind, {}).get(key, PENDING)

    def count(self, kind: str) -> int:
        return len(self._items.get(kind, {}))

    def reachable(self, max_age: float = 10.0) -> bool:
        """Whether the follower read from the cluster in the last ``max_age`` seconds."""
        return self.last_contact is not None and time.monotonic() - self.last_contact <= max_age

    def with_status(self, kind: ResourceKind, manifest: Manifest) -> Manifest:
        """The manifest as the API shows it: with ``status`` when the kind reports one."""
        status = self.status(kind, kind.key_of(manifest["metadata"]))
        return manifest if status is None else {**manifest, "status": status.as_dict()}

    # -- writing ---------------------------------------------------------------------------------

    def validate(self, kind: ResourceKind, manifest: Any) -> Manifest:
        """The canonical manifest, or ResourceError (400 unless the kind says otherwise)."""
        try:
            canonical = kind.validate(manifest, self)
        except ResourceError:
            raise
        except (ValueError, TypeError, KeyError) as exc:
            raise invalid(f"{kind.kind}: {exc}") from exc
        return canonical

    async def put(self, kind: ResourceKind, manifest: Any, *, dry_run: bool = False) -> Change:
        """Validates and stores a whole resource; answers once this node has applied it."""
        canonical = self.validate(kind, manifest)
        key = kind.key_of(canonical["metadata"])
        self._check_ready()
        async with self._write_lock:
            current = self.get(kind.kind, key)
            if current == canonical:
                return Change(kind.kind, key, "NOT_CHANGED", self.with_status(kind, current))
            result: UpsertResult = "CREATED" if current is None else "UPDATED"
            if dry_run:
                return Change(kind.kind, key, result, canonical)
            await self._write(kind.storage_key(key), orjson.dumps(canonical))
        return Change(kind.kind, key, result, self.with_status(kind, self.get(kind.kind, key) or canonical))

    async def delete(self, kind: ResourceKind, key: Key, *, dry_run: bool = False) -> Change:
        """Deletes a stored resource (404 when there is none)."""
        self._check_ready()
        async with self._write_lock:
            current = self.get(kind.kind, key)
            if current is None:
                raise ResourceError(404, "Not found", f"{kind.kind} {_describe(kind, key)} does not exist")
            if not dry_run:
                await self._write(kind.storage_key(key), None)
        return Change(kind.kind, key, "DELETED", current)

    def _check_ready(self) -> None:
        if not self.loaded.is_set():
            raise ResourceError(503, "Not ready", "the gateway is still loading its state; retry shortly")

    async def _write(self, key: bytes, value: bytes | None) -> None:
        try:
            offset = await self.writer.append(key, value)
        except LogError as exc:
            raise ResourceError(503, "State unavailable", f"the change was not stored: {exc}") from exc
        await self._visible(offset)

    async def _visible(self, offset: int) -> None:
        if self.position > offset:
            return
        event = trio.Event()
        self._waiters.append((offset, event))
        with trio.move_on_after(WRITE_VISIBLE_TIMEOUT):
            await event.wait()

    # -- following -------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Creates the topic if needed, reads it to its end, applies everything, reports started, then
        follows it until cancelled. Failures are retried with a growing pause (and logged)."""
        delay = 0.2
        while True:
            try:
                await self.reader.ensure_topic()
                end = await self.reader.end_offset()
                break
            except LogError as exc:
                self._failed(exc)
                await trio.sleep(delay)
                delay = min(delay * 2, 5.0)
        started = False
        delay = 0.2
        while True:
            if not started and self.position >= end:
                self._apply(list(self.kinds))
                started = True
                self.last_contact = time.monotonic()
                self.loaded.set()
                log.info(
                    "state loaded from %s: %d resources up to offset %d",
                    getattr(self.reader, "topic", "memory"),
                    sum(len(v) for v in self._items.values()),
                    self.position,
                )
                task_status.started()
            try:
                records, next_offset = await self.reader.read(self.position, FOLLOW_WAIT)
            except LogError as exc:
                self._failed(exc)
                await trio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.2
            self.last_contact = time.monotonic()
            self.last_error = None
            self._consume(records, next_offset, apply_changes=started)

    def _failed(self, exc: Exception) -> None:
        if str(exc) != self.last_error:
            log.warning("state topic: %s (retrying)", exc)
        self.last_error = str(exc)

    def _consume(self, records: Sequence[LogRecord], next_offset: int, *, apply_changes: bool) -> None:
        changed: dict[str, ResourceKind] = {}
        for record in records:
            kind = self._record(record)
            if kind is not None:
                changed[kind.kind] = kind
        self.position = max(self.position, next_offset)
        if apply_changes and changed:
            self._apply(list(changed.values()))
        if self._waiters:
            done = [w for w in self._waiters if w[0] < self.position]
            self._waiters = [w for w in self._waiters if w[0] >= self.position]
            for _, event in done:
                event.set()

    def _record(self, record: LogRecord) -> ResourceKind | None:
        self.applied_records += 1
        try:
            parts = orjson.loads(record.key)
            kind_name, key = str(parts[0]), tuple(parts[1:])
        except (orjson.JSONDecodeError, IndexError, TypeError):
            log.warning("state topic: ignoring a record with an unreadable key at offset %d", record.offset)
            return None
        kind = self.kinds.get(kind_name)
        if kind is None:
            if record.value is None:
                self._foreign.pop(record.key, None)
            else:
                if record.key not in self._foreign:
                    log.warning("state topic: kind %s is not known on this node (plugin not installed?)", kind_name)
                self._foreign[record.key] = record.value
            return None
        items = self._items.setdefault(kind.kind, {})
        if record.value is None:
            items.pop(key, None)
            self._status.get(kind.kind, {}).pop(key, None)
            return kind
        try:
            manifest = orjson.loads(record.value)
        except orjson.JSONDecodeError:
            log.warning("state topic: ignoring an unreadable %s at offset %d", kind_name, record.offset)
            return None
        items[key] = manifest
        return kind

    def _apply(self, kinds: Sequence[ResourceKind]) -> None:
        for kind in kinds:
            resources = self.resources(kind.kind)
            try:
                statuses = kind.apply(resources, self) or {}
            except Exception as exc:
                log.exception("applying %s resources failed", kind.kind)
                statuses = {kind.key_of(r["metadata"]): Status("Failed", str(exc)) for r in resources}
            self._status[kind.kind] = {
                kind.key_of(r["metadata"]): statuses.get(kind.key_of(r["metadata"]), READY) for r in resources
            }


def _sort_key(key: Key) -> tuple[str, ...]:
    return tuple("" if part is None else part for part in key)


def _describe(kind: ResourceKind, key: Key) -> str:
    name = repr(key[0])
    extras = [f"{field}={value}" for field, value in zip(kind.key_fields, key[1:], strict=True) if value is not None]
    return name + (f" ({', '.join(extras)})" if extras else "")
