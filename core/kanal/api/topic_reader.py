"""Reading topics of the backing cluster with the gateway's own Kafka client, for plugins and the
console: list topics, resolve offsets (the start, the end, a time), fetch records from partition
leaders. Reading is bounded by the caller (bytes per partition, a wait): nothing here loads a topic
whole.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any, Final

from kio.schema.errors import ErrorCode

from kanal.api.services import KafkaClient
from kanal.protocol.api import ApiKey
from kanal.protocol.entities import build, has_field, nested
from kanal.protocol.records import RecordSet

__all__ = ["EARLIEST", "LATEST", "Partition", "TopicReader"]

Partition = tuple[str, int]  # (topic, partition)
#: ListOffsets' special timestamps: the log start offset and the end (the next offset).
EARLIEST: Final = -2
LATEST: Final = -1
_MAX_BYTES: Final = 8 * 1024 * 1024


def _build(cls: Any, **values: Any) -> Any:
    return build(cls, **{k: v for k, v in values.items() if has_field(cls, k)})


def _in_range(position: int, part: Any) -> int:
    """Where to go on after OFFSET_OUT_OF_RANGE: the log start when the records were deleted, the
    end when the position is past it (a topic since recreated); -1 when the answer does not tell."""
    start = int(getattr(part, "log_start_offset", -1))
    end = int(getattr(part, "high_watermark", -1))
    if position < start:
        return start
    if 0 <= end < position:
        return end
    return -1


class TopicReader:
    """Reads partitions of the cluster ``client`` is connected to. Leaders are learnt from Metadata
    (:meth:`topics`, :meth:`partitions`); each ListOffsets and Fetch goes to the leaders, one request
    per leader. ``watermarks`` keeps, per partition, what its last Fetch answer said: (log start
    offset, high watermark, last stable offset)."""

    def __init__(self, client: KafkaClient, timeout: float = 10.0) -> None:
        self.client = client
        self.timeout = timeout
        self.leaders: dict[Partition, int] = {}
        self.watermarks: dict[Partition, tuple[int, int, int]] = {}
        #: per partition, the error code of its last Fetch answer (0 once it is not an error)
        self.errors: dict[Partition, int] = {}

    async def topics(self) -> dict[str, list[int]]:
        """Every topic of the cluster (internal ones left out) and its partitions."""
        reply = await self.client.metadata(None)
        out: dict[str, list[int]] = {}
        for topic in reply.topics:
            if topic.error_code != ErrorCode.none or not topic.name or getattr(topic, "is_internal", False):
                continue
            out[str(topic.name)] = self._learn(str(topic.name), topic.partitions)
        return out

    async def partitions(self, topic: str) -> tuple[int, list[int]]:
        """(error code, partitions) of one topic."""
        reply = await self.client.metadata([topic])
        for item in reply.topics:
            if str(item.name) == topic:
                if item.error_code != ErrorCode.none:
                    return int(item.error_code), []
                return 0, self._learn(topic, item.partitions)
        return int(ErrorCode.unknown_topic_or_partition), []

    async def end_offsets(self, partitions: Iterable[Partition]) -> dict[Partition, int]:
        """The end (next) offset of each partition."""
        return await self.list_offsets(partitions, LATEST)

    def _learn(self, topic: str, partitions: Iterable[Any]) -> list[int]:
        found = []
        for p in partitions:
            found.append(int(p.partition_index))
            self.leaders[(topic, int(p.partition_index))] = int(p.leader_id)
        return sorted(found)

    def _by_leader(self, partitions: Iterable[Partition]) -> dict[int, list[Partition]]:
        by_leader: dict[int, list[Partition]] = {}
        for tp in partitions:
            by_leader.setdefault(self.leaders.get(tp, -1), []).append(tp)
        return by_leader

    async def list_offsets(
        self, partitions: Iterable[Partition], timestamp: int, isolation_level: int = 0
    ) -> dict[Partition, int]:
        """ListOffsets at ``timestamp`` (:data:`LATEST`, :data:`EARLIEST`, else milliseconds: the first
        offset whose timestamp is at or after it, -1 when there is none); partitions in error are
        left out."""
        out: dict[Partition, int] = {}
        cls = self.client.request_class(ApiKey.LIST_OFFSETS)
        topic_cls = nested(cls, "topics")
        part_cls = nested(topic_cls, "partitions")
        for leader, tps in self._by_leader(partitions).items():
            topics: dict[str, list[Any]] = {}
            for topic, p in tps:
                topics.setdefault(topic, []).append(_build(part_cls, partition_index=p, timestamp=timestamp))
            body = _build(
                cls,
                replica_id=-1,
                isolation_level=isolation_level,
                topics=tuple(_build(topic_cls, name=t, partitions=tuple(ps)) for t, ps in topics.items()),
            )
            reply = await self.client.call(body, node_id=leader if leader >= 0 else None, timeout=self.timeout)
            for topic in reply.topics:
                for part in topic.partitions:
                    if part.error_code == ErrorCode.none:
                        out[(str(topic.name), int(part.partition_index))] = int(part.offset)
        return out

    async def fetch(
        self,
        positions: dict[Partition, int],
        max_wait: float = 0.5,
        partition_bytes: int = _MAX_BYTES,
        isolation_level: int = 1,
    ) -> dict[Partition, tuple[RecordSet, int]]:
        """Records of the partitions from their positions (one Fetch per leader): (records, next
        offset) per partition, at most about ``partition_bytes`` of each (a broker may return one
        batch past it). A position out of range answers no records and the offset to go on from."""
        out: dict[Partition, tuple[RecordSet, int]] = {}
        cls = self.client.request_class(ApiKey.FETCH)
        topic_cls = nested(cls, "topics")
        part_cls = nested(topic_cls, "partitions")
        for leader, tps in self._by_leader(positions).items():
            topics: dict[str, list[Any]] = {}
            for topic, p in tps:
                topics.setdefault(topic, []).append(
                    _build(
                        part_cls, partition=p, fetch_offset=positions[(topic, p)], partition_max_bytes=partition_bytes
                    )
                )
            body = _build(
                cls,
                replica_id=-1,
                max_wait=datetime.timedelta(milliseconds=int(max_wait * 1000)),
                min_bytes=1,
                max_bytes=max(partition_bytes, _MAX_BYTES),
                isolation_level=isolation_level,
                session_epoch=-1,
                topics=tuple(_build(topic_cls, topic=t, partitions=tuple(ps)) for t, ps in topics.items()),
            )
            reply = await self.client.call(
                body, node_id=leader if leader >= 0 else None, timeout=self.timeout + max_wait
            )
            for topic in reply.responses:
                for part in topic.partitions:
                    tp = (str(topic.topic), int(part.partition_index))
                    self.errors[tp] = int(part.error_code)
                    if part.error_code != ErrorCode.none:
                        if part.error_code == ErrorCode.offset_out_of_range:
                            out[tp] = (RecordSet.parse(None), _in_range(positions[tp], part))
                        continue
                    self.watermarks[tp] = (
                        int(getattr(part, "log_start_offset", -1)),
                        int(getattr(part, "high_watermark", -1)),
                        int(getattr(part, "last_stable_offset", -1)),
                    )
                    records = RecordSet.parse(part.records)
                    next_offset = positions[tp]
                    for batch in records.batches:
                        next_offset = max(next_offset, batch.next_offset)
                    out[tp] = (records, next_offset)
        return out
