"""The audit log: events buffered in memory, written to the audit log topic in batches by a companion
task, read back (this node's and every other node's) into the index ``GET /gateway/v2/audit`` serves.

The task opens no connection before there is something to do: the first event creates the topic
(unless it exists) and writes; the topic is read back and followed only on a node that serves the
audit route (:meth:`AuditLog.follow_topic`, called by the admin API). A gateway without logins, admin
API or plugin decisions talks to its cluster exactly as before.

Emitting never waits: :meth:`AuditLog.emit` builds the event, indexes it and queues it. The queue is
bounded; when the cluster cannot take the events, the oldest are dropped (counted in
``gateway_audit_events_dropped_total``, with a warning at most every :data:`DROP_WARNING_INTERVAL`
seconds) rather than holding a client login or an admin call. Delivery is at least once: a batch
whose write was cut short is written again (the index drops the duplicate by id).

The topic is written and read through partition 0 with the gateway's own protocol code
(:class:`~kanal.net.state_log.CompactedLog` with ``cleanup.policy=delete``), each direction on its
own connection so a long-polling read never delays a write.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
import trio

from kanal.api.errors import LogError
from kanal.audit.events import AUTHENTICATION, AuditIndex, AuditQuery, bracketed, make_event, stamp
from kanal.net.state_log import CompactedLog

if TYPE_CHECKING:
    from kanal.api.context import Connection
    from kanal.api.services import StateLog
    from kanal.config.settings import Settings
    from kanal.metrics import GatewayMetrics

log = logging.getLogger(__name__)

__all__ = ["AuditLog", "audit_log_topic", "node_source"]

BUFFER_SIZE = 10_000  # events waiting to be written; beyond, the oldest are dropped
BATCH_SIZE = 500  # events per Produce
LINGER = 0.1  # seconds the first event of a batch waits for others (measured: a Produce per login
# event took a tenth of the gateway's CPU at 1,000 logins a second)
READ_BACK = 50_000  # records read back from the end of the topic at startup
FOLLOW_WAIT = 0.5  # seconds a read waits for new records
DROP_WARNING_INTERVAL = 10.0
SHUTDOWN_FLUSH = 2.0  # seconds shutdown waits for the last events to be written


def audit_log_topic(settings: Settings) -> str:
    """GATEWAY_AUDIT_LOG_TOPIC, by default ``_kanal_<GATEWAY_CLUSTER_ID>_auditlogs``."""
    return settings.audit_log_topic or f"_kanal_{settings.cluster_id}_auditlogs"


def node_source(host: str, port: int) -> str:
    """The ``source`` of this node's events: the address its first Kafka port is advertised at."""
    return f"kanal://{bracketed(f'{host}:{port}')}"


def _encoded(event: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(event, default=str, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # a plugin's eventData JSON cannot hold (a circular structure...)
        event["eventData"] = str(event["eventData"])
        return orjson.dumps(event, default=str)


class AuditLog:
    """One gateway node's audit log. ``writer`` and ``reader`` are two logs on the same topic (None,
    and ``enabled`` False, when GATEWAY_FEATURE_FLAGS_AUDIT=false: events are then dropped at once)."""

    def __init__(
        self,
        topic: str,
        source: str,
        metrics: GatewayMetrics,
        writer: StateLog | None,
        reader: StateLog | None,
        *,
        buffer_size: int = BUFFER_SIZE,
        read_back: int = READ_BACK,
        index: AuditIndex | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.topic = topic
        self.source = source
        self.enabled = writer is not None and reader is not None
        self.writer = writer
        self.reader = reader
        self.metrics = metrics
        self.buffer_size = buffer_size
        self.read_back = read_back
        self.index = index if index is not None else AuditIndex()
        self.loaded = trio.Event()  # set once what was in the topic when following began is indexed
        self._following = trio.Event()
        self._clock = clock
        self._pending: deque[tuple[bytes, bytes]] = deque()
        self._wake = trio.Event()
        self._created = False
        self._errors: dict[str, str] = {}
        self._dropped = 0
        self._warned_at = -math.inf
        metrics.audit_pending.set_function(lambda: len(self._pending))

    @classmethod
    def for_gateway(cls, settings: Settings, metrics: GatewayMetrics, source: str) -> AuditLog:
        """The audit log the settings describe, on the backing cluster."""
        topic = audit_log_topic(settings)
        if not settings.feature("audit", True):
            return cls(topic, source, metrics, None, None)

        def topic_log() -> CompactedLog:
            return CompactedLog(
                topic,
                settings.upstream,
                settings.upstream_connect_timeout_ms / 1000,
                settings.state_replication_factor,
                compacted=False,
                retention_ms=settings.audit_log_retention_ms,
            )

        return cls(topic, source, metrics, topic_log(), topic_log())

    # -- emitting (never waits) -------------------------------------------------------------------

    def emit(
        self,
        event_type: str,
        *,
        user: str | None,
        vcluster: str | None,
        local_address: str | None,
        remote_address: str | None,
        event_data: Any,
    ) -> dict[str, Any] | None:
        """Records one event; returns it (None when the audit log is off)."""
        if not self.enabled:
            return None
        time_text, time_ms = stamp(self._clock())
        event = make_event(
            event_type,
            source=self.source,
            user=user,
            vcluster=vcluster,
            local_address=local_address,
            remote_address=remote_address,
            event_data=event_data,
            time=time_text,
        )
        raw = _encoded(event)
        self.index.add_event(event, raw, time_ms)
        if len(self._pending) >= self.buffer_size:
            self._drop(len(self._pending) - self.buffer_size + 1)
        self._pending.append((event["id"].encode(), raw))
        self._wake.set()
        return event

    def connection_event(self, event_type: str, connection: Connection, event_data: Any) -> dict[str, Any] | None:
        """An event about a Kafka client connection: its principal, virtual cluster and addresses."""
        return self.emit(
            event_type,
            user=connection.principal,
            vcluster=connection.vcluster,
            local_address=connection.listener_address,
            remote_address=connection.client_address,
            event_data=event_data,
        )

    def authentication(self, connection: Connection, failure: str | None, user: str | None = None) -> None:
        """A login (or re-authentication): ``SUCCESS``, or the reason it was refused; ``userName`` is
        the connection's principal, else the user name the client claimed."""
        self.emit(
            AUTHENTICATION,
            user=connection.principal or user,
            vcluster=connection.vcluster,
            local_address=connection.listener_address,
            remote_address=connection.client_address,
            event_data="SUCCESS" if failure is None else failure,
        )

    def query(self, query: AuditQuery) -> list[dict[str, Any]]:
        """The newest events that match, newest first (this node's at once, others' once read)."""
        return self.index.query(query)

    def follow_topic(self) -> None:
        """Reads the end of the topic back into the index and follows it (for a node that serves
        ``GET /gateway/v2/audit``): until then the index holds only this node's events."""
        self._following.set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _drop(self, count: int) -> None:
        for _ in range(count):
            self._pending.popleft()
        self._dropped += count
        self.metrics.audit_dropped.inc(count)
        now = time.monotonic()
        if now - self._warned_at >= DROP_WARNING_INTERVAL:
            self._warned_at = now
            log.warning(
                "audit log: %d events wait to be written to %s; dropping the oldest (%d dropped so far)%s",
                len(self._pending),
                self.topic,
                self._dropped,
                f": {next(iter(self._errors.values()))}" if self._errors else "",
            )

    # -- the companion task ------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Writes and follows the topic until cancelled (started at once: the gateway never waits
        for the cluster to take audit events); at shutdown, writes what is left for a moment."""
        if self.writer is None or self.reader is None:
            task_status.started()
            return
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write_loop)
                nursery.start_soon(self._follow)
                task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                with trio.move_on_after(SHUTDOWN_FLUSH):
                    try:
                        while self._pending:
                            await self._write_batch()
                    except Exception:  # the cluster is away (or worse): what is left is reported below
                        pass
                if self._pending:
                    log.warning("audit log: %d events not written to %s at shutdown", len(self._pending), self.topic)
                await self.writer.aclose()
                await self.reader.aclose()

    async def _write_loop(self) -> None:
        delay = 0.2
        while True:
            while not self._pending:
                self._wake = trio.Event()
                await self._wake.wait()
            if len(self._pending) < BATCH_SIZE:
                await trio.sleep(LINGER)  # gather what follows: one Produce for many events
            try:
                await self._write_batch()
            except Exception as exc:  # LogError, or a bug: the audit log never stops the gateway
                self._failed("write", exc)
                await trio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self._recovered("write")
            delay = 0.2

    async def _write_batch(self) -> None:
        assert self.writer is not None
        if not self._created:
            await self.writer.ensure_topic()
            self._created = True
        batch = [self._pending.popleft() for _ in range(min(BATCH_SIZE, len(self._pending)))]
        try:
            await self.writer.append_many(batch)
        except BaseException:  # failed or cut short: written again later (at least once)
            self._pending.extendleft(reversed(batch))
            if len(self._pending) > self.buffer_size:
                self._drop(len(self._pending) - self.buffer_size)
            raise
        self.metrics.audit_written.inc(len(batch))

    async def _follow(self) -> None:
        """Indexes the last :attr:`read_back` records of the topic, then every new one."""
        assert self.reader is not None
        await self._following.wait()
        delay = 0.2
        while True:
            try:
                await self.reader.ensure_topic()
                end = await self.reader.end_offset()
                break
            except Exception as exc:  # LogError, or a bug: the audit log never stops the gateway
                self._failed("read", exc)
                await trio.sleep(delay)
                delay = min(delay * 2, 5.0)
        position = max(0, end - self.read_back)
        read = 0
        delay = 0.2
        while True:
            if not self.loaded.is_set() and position >= end:
                self.loaded.set()
                log.info("audit log: %d events read back from %s", read, self.topic)
            try:
                records, next_offset = await self.reader.read(position, FOLLOW_WAIT)
            except Exception as exc:  # LogError, or a bug: the audit log never stops the gateway
                self._failed("read", exc)
                await trio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self._recovered("read")
            delay = 0.2
            for record in records:
                if record.value is not None and self.index.add_record(record.value, record.timestamp):
                    read += 1
            position = max(position, next_offset)

    def _failed(self, direction: str, exc: Exception) -> None:
        if self._errors.get(direction) != str(exc):
            log.warning(
                "audit log: cannot %s %s: %s (retrying)",
                direction,
                self.topic,
                exc,
                exc_info=None if isinstance(exc, LogError) else exc,
            )
        self._errors[direction] = str(exc)

    def _recovered(self, direction: str) -> None:
        if self._errors.pop(direction, None) is not None:
            log.info("audit log: %s %s again", "writing to" if direction == "write" else "reading", self.topic)
