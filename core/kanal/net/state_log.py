"""A compacted single-partition topic on the backing cluster, spoken with the gateway's own protocol code.

The gateway already speaks Kafka, so its state topics need no client library: CreateTopics with
``cleanup.policy=compact``, Produce with a record batch from :func:`kanal.protocol.records.encode_batch`,
Fetch (long-polling) to follow. Calls go to the partition leader, found through Metadata on a bootstrap
server; any failure drops the connections, and the next call finds the leader again.

Two :class:`CompactedLog` objects are used per gateway: one that writes, one that follows; each owns
its own connection, so a long-polling Fetch never delays a write or the gateway's other control calls.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Sequence
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from kanal.api.errors import LogError, UpstreamError
from kanal.api.services import LogRecord
from kanal.config.upstream import UpstreamSettings
from kanal.net.upstream import Bootstrap, BrokerCalls, UnsupportedVersion, reason
from kanal.protocol.entities import build, has_field, nested
from kanal.protocol.records import Record, RecordSet, encode_batch

log = logging.getLogger(__name__)

_FETCH_MAX_BYTES = 16 * 1024 * 1024


def _build(cls: Any, **values: Any) -> Any:
    return build(cls, **{k: v for k, v in values.items() if has_field(cls, k)})


async def _open(address: tuple[str, int], upstream: UpstreamSettings, timeout: float) -> BrokerCalls:
    return await BrokerCalls.open(address, upstream, timeout, _FETCH_MAX_BYTES + 1024 * 1024, "kanal-state")


class CompactedLog:
    """Partition 0 of one compacted topic: create it, append to it, read it from an offset."""

    def __init__(
        self,
        topic: str,
        upstream: UpstreamSettings,
        timeout: float = 10.0,
        replication_factor: int = -1,
        *,
        compacted: bool = True,
        retention_ms: int | None = None,
    ) -> None:
        self.topic = topic
        self.replication_factor = replication_factor
        # cleanup.policy and retention.ms of the topic ensure_topic creates
        self.configs = {"cleanup.policy": "compact" if compacted else "delete"}
        if retention_ms is not None:
            self.configs["retention.ms"] = str(retention_ms)
        self.upstream = upstream
        self.timeout = timeout
        self._leader: BrokerCalls | None = None
        self._bootstrap = Bootstrap(upstream.bootstrap_servers)
        self._turn = trio.Lock()  # one call at a time on the connection: tasks may share a log

    async def _bootstrap_connection(self) -> BrokerCalls:
        try:
            return await self._bootstrap.connect(lambda address: _open(address, self.upstream, self.timeout))
        except UpstreamError as exc:
            raise LogError(f"cannot reach the backing cluster: {exc}") from exc

    async def _connection(self) -> BrokerCalls:
        """The connection to the partition leader (a bootstrap server while the topic does not exist)."""
        if self._leader is not None:
            return self._leader
        boot = await self._bootstrap_connection()
        try:
            cls = boot.request_class(3)
            topics = (_build(nested(cls, "topics"), name=self.topic),)
            metadata = await boot.call(_build(cls, topics=topics, allow_auto_topic_creation=False), self.timeout)
            brokers = {int(b.node_id): (str(b.host), int(b.port)) for b in metadata.brokers}
            leader: int | None = None
            for topic in metadata.topics:
                if topic.name == self.topic and topic.error_code == ErrorCode.none:
                    leader = next((int(p.leader_id) for p in topic.partitions if p.partition_index == 0), None)
        except BaseException:
            await boot.aclose()
            raise
        if leader is None or leader not in brokers:
            self._leader = boot  # the topic is missing: creating it works through any broker
            return boot
        await boot.aclose()
        self._leader = await _open(brokers[leader], self.upstream, self.timeout)
        return self._leader

    async def _call(self, make: Any, timeout: float | None = None) -> Any:
        """Calls ``make(connection)``'s request on the leader; on a broken connection (a broker closes
        idle ones) reconnects and tries once more. Writes are idempotent here: the same key and value
        written twice leave the same state. Calls from several tasks take turns."""
        async with self._turn:
            return await self._call_now(make, timeout)

    async def _call_now(self, make: Any, timeout: float | None) -> Any:
        for attempt in (1, 2):
            try:
                connection = await self._connection()
                return await connection.call(make(connection), timeout or self.timeout)
            except LogError:
                await self.reset()
                raise
            except UnsupportedVersion as exc:
                await self.reset()
                raise LogError(str(exc)) from exc
            except (
                OSError,  # UpstreamError included
                ConnectionError,
                trio.BrokenResourceError,
                trio.ClosedResourceError,
                trio.TooSlowError,
            ) as exc:
                await self.reset()
                if attempt == 2 or isinstance(exc, trio.TooSlowError):
                    raise LogError(f"state topic {self.topic}: {reason(exc)}") from exc
        raise AssertionError("unreachable")

    async def reset(self) -> None:
        """Drops the connection; the next call finds the leader again."""
        if self._leader is not None:
            leader, self._leader = self._leader, None
            await leader.aclose()

    async def aclose(self) -> None:
        await self.reset()

    # -- the calls ----------------------------------------------------------------------------------

    async def ensure_topic(self) -> None:
        """Creates the topic (one partition, with the log's cleanup policy) unless it exists."""

        def make(connection: BrokerCalls) -> Any:
            cls = connection.request_class(19)
            topic_cls = nested(cls, "topics")
            config_cls = nested(topic_cls, "configs")
            topic = _build(
                topic_cls,
                name=self.topic,
                num_partitions=1,
                replication_factor=self.replication_factor,
                configs=tuple(_build(config_cls, name=name, value=value) for name, value in self.configs.items()),
            )
            return _build(cls, topics=(topic,), timeout=_ms(self.timeout))

        reply = await self._call(make)
        await self.reset()  # the leader is known only now
        for result in reply.topics:
            if result.error_code not in (ErrorCode.none, ErrorCode.topic_already_exists):
                raise LogError(
                    f"cannot create the state topic {self.topic}: {result.error_code.name}"
                    + (f" ({result.error_message})" if result.error_message else "")
                )

    async def append(self, key: bytes, value: bytes | None) -> int:
        """Writes one record (acks=all) and returns its offset."""
        return await self.append_many([(key, value)])

    async def append_many(self, items: Sequence[tuple[bytes, bytes | None]]) -> int:
        """Writes records (key, value) in one batch (acks=all); returns the first offset."""
        now = int(time.time() * 1000)
        records = [Record(offset_delta=i, key=k, value=v) for i, (k, v) in enumerate(items)]
        batch = encode_batch(records, base_timestamp=now)

        def make(connection: BrokerCalls) -> Any:
            cls = connection.request_class(0)
            topic_cls = nested(cls, "topic_data")
            partition_cls = nested(topic_cls, "partition_data")
            data = _build(topic_cls, name=self.topic, partition_data=(_build(partition_cls, index=0, records=batch),))
            return _build(cls, acks=-1, timeout=_ms(self.timeout), topic_data=(data,))

        reply = await self._call(make)
        for topic in reply.responses:
            for partition in topic.partition_responses:
                if partition.error_code != ErrorCode.none:
                    await self.reset()
                    raise LogError(f"cannot write to the topic {self.topic}: {partition.error_code.name}")
                return int(partition.base_offset)
        raise LogError(f"the broker did not answer for the topic {self.topic}")

    async def end_offset(self) -> int:
        """The offset after the last record (the high watermark)."""

        def make(connection: BrokerCalls) -> Any:
            cls = connection.request_class(2)
            topic_cls = nested(cls, "topics")
            partition_cls = nested(topic_cls, "partitions")
            partition = _build(partition_cls, partition_index=0, timestamp=-1)
            topic = _build(topic_cls, name=self.topic, partitions=(partition,))
            return _build(cls, replica_id=-1, isolation_level=1, topics=(topic,))

        reply = await self._call(make)
        for topic in reply.topics:
            for partition in topic.partitions:
                if partition.error_code != ErrorCode.none:
                    await self.reset()
                    raise LogError(f"cannot read the end of the state topic {self.topic}: {partition.error_code.name}")
                return int(partition.offset)
        raise LogError(f"the broker did not answer for the state topic {self.topic}")

    async def read(self, offset: int, max_wait: float = 0.5) -> tuple[list[LogRecord], int]:
        """Records from ``offset`` on, and the offset to read next. Waits up to ``max_wait`` seconds
        when there is nothing new. An offset below the log start (compacted or deleted away) restarts
        at the log start."""

        def make(connection: BrokerCalls) -> Any:
            cls = connection.request_class(1)
            topic_cls = nested(cls, "topics")
            partition_cls = nested(topic_cls, "partitions")
            partition = _build(partition_cls, partition=0, fetch_offset=offset, partition_max_bytes=_FETCH_MAX_BYTES)
            return _build(
                cls,
                replica_id=-1,
                max_wait=_ms(max_wait),
                min_bytes=1,
                max_bytes=_FETCH_MAX_BYTES,
                isolation_level=1,
                session_epoch=-1,
                topics=(_build(topic_cls, topic=self.topic, partitions=(partition,)),),
            )

        reply = await self._call(make, self.timeout + max_wait)
        if reply.error_code != ErrorCode.none:
            await self.reset()
            raise LogError(f"cannot read the state topic {self.topic}: {reply.error_code.name}")
        for topic in reply.responses:
            for partition in topic.partitions:
                code = partition.error_code
                if code == ErrorCode.offset_out_of_range:
                    start = int(partition.log_start_offset)
                    log.warning("state topic %s: offset %d is gone, reading from %d", self.topic, offset, start)
                    return [], max(start, offset + 1) if start >= 0 else offset
                if code != ErrorCode.none:
                    await self.reset()
                    raise LogError(f"cannot read the state topic {self.topic}: {code.name}")
                return _records(partition.records, offset)
        return [], offset  # some brokers leave out a partition with nothing to return


def _records(data: Any, offset: int) -> tuple[list[LogRecord], int]:
    out: list[LogRecord] = []
    next_offset = offset
    if not data:
        return out, next_offset
    for batch in RecordSet.parse(data).batches:
        if batch.is_control:
            next_offset = max(next_offset, batch.next_offset)
            continue
        for record in batch.records():
            at = batch.offset_of(record)
            if at < offset or record.key is None:
                continue
            value = None if record.value is None else bytes(record.value)
            out.append(LogRecord(at, bytes(record.key), value, batch.timestamp_of(record)))
        next_offset = max(next_offset, batch.next_offset)
    return out, next_offset


def _ms(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=int(seconds * 1000))
