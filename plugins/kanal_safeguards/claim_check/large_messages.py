"""``large-message``: a claim check. On produce, every record value of at least
``minimumSizeInBytes`` on the matching topics goes to an object store (S3, or a local directory for
development); Kafka gets a small reference instead, marked by the header ``kanal.large-message``.
On fetch, marked records get their value back from the store and lose the header.

Failures never lose a record nor leave a reference without its object (see
:mod:`kanal_safeguards.claim_check.common`). The reference format is documented byte by byte in
``docs/safeguards-large-messages.md`` and in :class:`Reference`.
"""

from __future__ import annotations

import logging
from typing import ClassVar, Final

from kanal.api import (
    NONE,
    ErrorCode,
    Interceptor,
    PartitionError,
    Record,
    RecordBatch,
    RecordsContext,
    RecordsResult,
    hookimpl,
    records_area,
)
from kanal_safeguards.claim_check.common import (
    STORE_FAILED,
    ClaimCheck,
    ClaimCheckConfig,
    Reference,
    S3Config,
    build_store,
    marker,
)

__all__ = [
    "INTERCEPTORS",
    "MARKER",
    "STORE_FAILED",
    "LargeMessage",
    "LargeMessageConfig",
    "Reference",
    "S3Config",
    "build_store",
]

log = logging.getLogger(__name__)

#: The header that marks a record whose value is in the store; its value is the object key (UTF-8).
MARKER: Final = "kanal.large-message"
_MARKER_BYTES: Final = MARKER.encode()

#: The config of ``large-message`` (the keys both claim-check types share).
LargeMessageConfig = ClaimCheckConfig


def _marker(record: Record) -> bytes | None:
    """The marker header's value, or None when the record has none."""
    return marker(record, MARKER)


class LargeMessage(ClaimCheck):
    """Moves large record values to an object store on produce and back on fetch."""

    plugin_name: ClassVar[str] = "large-message"
    description: ClassVar[str] = "Keeps large record values in S3 (or a directory), with a reference in Kafka."
    logger: ClassVar[logging.Logger] = log
    subject: ClassVar[str] = "large message"

    @hookimpl
    async def kanal_produce_records(self, ctx: RecordsContext) -> RecordsResult:
        """Stores the large values of this partition, all or none, then puts references in place."""
        if not self._matches(ctx.topic):
            return None
        minimum = self.config.minimum_size_in_bytes
        large: list[tuple[RecordBatch, Record, bytes]] = []
        for batch in ctx.records.batches:
            if batch.is_control:
                continue
            data, start = records_area(batch)
            marked = _MARKER_BYTES in data  # a cheap test before reading any header
            if len(data) - start < minimum and not marked:
                continue  # no value of this batch can be large
            for record in batch.records():
                if marked and _marker(record) is not None:
                    return PartitionError(
                        ErrorCode.invalid_record, f"the record header {MARKER} is reserved for the gateway"
                    )
                value = record.value
                if value is not None and len(value) >= minimum:
                    large.append((batch, record, value))
        if not large:
            return None
        references = await self._store_all(ctx.topic, ctx.partition, [value for _, _, value in large], Reference)
        if isinstance(references, PartitionError):
            return references
        changed: dict[int, RecordBatch] = {}
        for (batch, record, _), reference in zip(large, references, strict=True):
            record.value = reference.encode()
            record.headers = [*record.headers, (MARKER, reference.key.encode("utf-8"))]
            changed[id(batch)] = batch
        for batch in changed.values():
            batch.mark_changed()
        return None

    def _references(self, topic: str, partition: int, batch: RecordBatch) -> list[tuple[Record, Reference]]:
        """The marked records of a fetched batch with their references (a marked record without a
        valid reference is left as it is, with a warning)."""
        data, _ = records_area(batch)
        if _MARKER_BYTES not in data:
            return []
        found: list[tuple[Record, Reference]] = []
        for record in batch.records():
            header = _marker(record)
            if header is None:
                continue
            reference = Reference.decode(record.value, header)
            if reference is None:
                log.warning(
                    "large-message: %s-%d offset %d has the %s header but no valid reference: left as it is",
                    topic,
                    partition,
                    batch.offset_of(record),
                    MARKER,
                )
                continue
            found.append((record, reference))
        return found

    @hookimpl
    async def kanal_fetch_records(self, ctx: RecordsContext) -> RecordsResult:
        """Restores the marked records of this partition, or fails it (retriably) when it cannot."""
        if not self._matches(ctx.topic):
            return None
        todo = self._restorable(
            ctx,
            lambda batch: [
                ((batch, record), reference) for record, reference in self._references(ctx.topic, ctx.partition, batch)
            ],
        )
        if not todo:
            return None
        values = await self._load_all([reference for _, reference in todo])
        if isinstance(values, str):
            return self._store_failed(ctx.topic, ctx.partition, "fetch failed", values)
        changed: dict[int, RecordBatch] = {}
        for ((batch, record), _), value in zip(todo, values, strict=True):
            record.value = value
            record.headers = [(key, header) for key, header in record.headers if key != MARKER]
            changed[id(batch)] = batch
        for batch in changed.values():
            batch.compression = NONE  # (recompressing megabytes would hold up the gateway's loop)
            batch.mark_changed()
        return None


INTERCEPTORS: list[type[Interceptor]] = [LargeMessage]
