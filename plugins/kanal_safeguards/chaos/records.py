"""Chaos on records: ``chaos-duplicate-messages``, ``chaos-message-corruption`` and
``chaos-invalid-schema-id``.

Each acts on the records of the topics matching ``topic``, either as producers write them
(``target: PRODUCE``: the broker stores the changed records) or only in what consumers fetch
(``target: CONSUME``, the default: the broker keeps the records as produced). Transaction markers
and null values (tombstones) are left alone.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from kanal.api import GatewayServices, Record, RecordBatch, RecordsContext, RecordsResult, hookimpl
from kanal_safeguards.base import TopicMatcher
from kanal_safeguards.chaos.common import ChaosConfig, ChaosInterceptor, Percent, Target

__all__ = [
    "DuplicateMessages",
    "DuplicateMessagesConfig",
    "InvalidSchemaId",
    "InvalidSchemaIdConfig",
    "MessageCorruption",
    "MessageCorruptionConfig",
]

_MAX_SCHEMA_ID = 2**31 - 1  # schema ids are positive 4-byte signed integers


class _RecordsChaosConfig(ChaosConfig, kw_only=True):
    topic: str = ".*"
    target: Target = Target.CONSUME


class DuplicateMessagesConfig(_RecordsChaosConfig, kw_only=True):
    """What operators write under ``config:`` (camelCase keys)."""

    rate_in_percent: Percent = 100


class MessageCorruptionConfig(_RecordsChaosConfig, kw_only=True):
    """What operators write under ``config:`` (camelCase keys)."""

    size_in_bytes: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)] = 10
    rate_in_percent: Percent = 100


class InvalidSchemaIdConfig(_RecordsChaosConfig, kw_only=True):
    """What operators write under ``config:`` (camelCase keys)."""

    invalid_schema_id: Annotated[int, msgspec.Meta(ge=0, le=_MAX_SCHEMA_ID)] | None = None


class _RecordsChaos(ChaosInterceptor):
    """Runs :meth:`change` on the data batches of the matching topics, on the side ``target`` says."""

    config: _RecordsChaosConfig

    def __init__(self, config: _RecordsChaosConfig, services: GatewayServices) -> None:
        self._matches = TopicMatcher(config.topic)  # a bad regex fails before the counter is taken
        super().__init__(config, services)
        self._produce = config.target is Target.PRODUCE

    def change(self, batch: RecordBatch) -> int:
        """Changes the batch (marking it changed); answers how many records it changed."""
        raise NotImplementedError

    def wants_produce_records(self, topic: str) -> bool:
        return self._produce and self._matches(topic)

    @hookimpl
    def kanal_produce_records(self, ctx: RecordsContext) -> RecordsResult:
        if self._produce:
            self._apply(ctx)
        return None

    @hookimpl
    def kanal_fetch_records(self, ctx: RecordsContext) -> RecordsResult:
        if not self._produce:
            self._apply(ctx)
        return None

    def _apply(self, ctx: RecordsContext) -> None:
        if not self._matches(ctx.topic):
            return
        changed = 0
        for batch in ctx.records.batches:
            if not batch.is_control and batch.records_count:
                changed += self.change(batch)
        if changed:
            self.injected(
                ctx.connection, changed, topic=ctx.topic, partition=ctx.partition, target=self.config.target.value
            )


class DuplicateMessages(_RecordsChaos):
    """Delivers ``rateInPercent`` % of the records twice.

    CONSUME: the copy follows the original in the fetched batch, at the same offset (a fetched
    batch keeps its offsets; the consumer advances past it as before). PRODUCE: the copy is written
    too, at the next offset; batches of idempotent or transactional producers are left alone, since
    the broker checks their record counts against the producer's sequence numbers.
    """

    plugin_name: ClassVar[str] = "chaos-duplicate-messages"
    description: ClassVar[str] = "Chaos (test environments): duplicates records produced or fetched."
    config_type: ClassVar[type[DuplicateMessagesConfig]] = DuplicateMessagesConfig
    config: DuplicateMessagesConfig

    def change(self, batch: RecordBatch) -> int:
        if self._produce and batch.producer_id >= 0:
            return 0
        rate = self.config.rate_in_percent
        out: list[Record] = []
        copies = 0
        for r in batch.records():
            out.append(r)
            if self.chance(rate):
                out.append(Record(r.offset_delta, r.timestamp_delta, r.key, r.value, list(r.headers), r.attributes))
                copies += 1
        if copies:
            batch.replace_records(out)
            if self._produce:
                batch.renumber()  # brokers want dense offset deltas in a Produce request
        return copies


class MessageCorruption(_RecordsChaos):
    """Appends ``sizeInBytes`` random bytes to ``rateInPercent`` % of the record values."""

    plugin_name: ClassVar[str] = "chaos-message-corruption"
    description: ClassVar[str] = "Chaos (test environments): appends random bytes to record values."
    config_type: ClassVar[type[MessageCorruptionConfig]] = MessageCorruptionConfig
    config: MessageCorruptionConfig

    def change(self, batch: RecordBatch) -> int:
        rate, size, randbytes = self.config.rate_in_percent, self.config.size_in_bytes, self.random.randbytes
        changed = 0
        for r in batch.records():
            if r.value is not None and self.chance(rate):
                r.value = r.value + randbytes(size)
                changed += 1
        if changed:
            batch.mark_changed()
        return changed


class InvalidSchemaId(_RecordsChaos):
    """Overwrites the Confluent schema id (the 4 bytes after the magic byte 0) of the values that
    have one with ``invalidSchemaId``, or with a random id other than the original."""

    plugin_name: ClassVar[str] = "chaos-invalid-schema-id"
    description: ClassVar[str] = "Chaos (test environments): overwrites the schema id of record values."
    config_type: ClassVar[type[InvalidSchemaIdConfig]] = InvalidSchemaIdConfig
    config: InvalidSchemaIdConfig

    def change(self, batch: RecordBatch) -> int:
        fixed = self.config.invalid_schema_id
        changed = 0
        for r in batch.records():
            value = r.value
            if value is None or len(value) < 5 or value[0] != 0:
                continue  # not the Confluent wire format: no schema id to overwrite
            schema_id = fixed if fixed is not None else self._random_id(int.from_bytes(value[1:5], "big"))
            r.value = b"\x00" + schema_id.to_bytes(4, "big") + value[5:]
            changed += 1
        if changed:
            batch.mark_changed()
        return changed

    def _random_id(self, original: int) -> int:
        while True:
            schema_id = self.random.randint(1, _MAX_SCHEMA_ID)
            if schema_id != original:
                return schema_id
