"""``large-batch``: a claim check per record batch. On produce, every batch of at least
``minimumSizeInBytes`` (its size as sent: header and records, compressed when the producer
compressed it) on the matching topics goes whole, as its wire bytes, to an object store; Kafka gets
a batch of the *same record count* instead: its first record carries a reference (marked by the
header ``kanal.large-batch``), the others are empty placeholders. On fetch, such a batch is replaced
by the stored one, framed with the header the broker wrote (offsets, leader epoch, timestamp type).

Why the same record count: the broker gives a batch of N records N offsets, and the producer, the
consumers and the idempotence checks all count on it. A batch replaced by one record would give the
records after it other offsets than the producer was told, make restored records overlap the next
batch's offsets, and break the producer's sequence numbers (the broker expects the next batch at
``baseSequence + N``). With N records, every header field the broker checks stays as the producer
sent it (producer id, epoch, base sequence, transactional bit, offset and timestamp deltas), each
placeholder keeps its record's timestamp (time indexes and ``offsetsForTimes`` stay right), and the
restored batch has exactly the offsets the broker assigned.

Failures never lose a record nor leave a reference without its object (see
:mod:`kanal_safeguards.claim_check.common`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar, Final

from kanal.api import (
    CorruptRecordError,
    ErrorCode,
    Interceptor,
    PartitionError,
    RecordBatch,
    RecordsContext,
    RecordSpan,
    RecordsResult,
    encode_varint,
    hookimpl,
    record_spans,
    records_area,
)
from kanal_safeguards.claim_check.common import ClaimCheck, Reference, marker

__all__ = ["INTERCEPTORS", "MARKER", "BatchReference", "LargeBatch"]

log = logging.getLogger(__name__)

#: The header of the first record of a batch that is in the store; its value is the object key.
MARKER: Final = "kanal.large-batch"
_MARKER_BYTES: Final = MARKER.encode()
_NULL: Final = encode_varint(-1)
_NO_HEADERS: Final = encode_varint(0)
_MARKER_FIELD: Final = encode_varint(1) + encode_varint(len(_MARKER_BYTES)) + _MARKER_BYTES  # one header, its key


@dataclass(frozen=True, slots=True)
class BatchReference(Reference):
    """What the first record of a stored batch holds: the layout of :class:`Reference` with the
    magic ``KANAL-LB`` (4B 41 4E 41 4C 2D 4C 42); ``size`` and ``sha256`` are those of the whole
    batch as the producer sent it (its wire bytes)."""

    MAGIC: ClassVar[bytes] = b"KANAL-LB"


def _record(timestamp_delta: int, offset_delta: int, value: bytes | None = None, header: bytes | None = None) -> bytes:
    """One record's wire bytes: no key, ``value`` (None: null), and the marker header with value
    ``header`` when given."""
    parts = [b"\x00", encode_varint(timestamp_delta), encode_varint(offset_delta), _NULL]
    parts += [_NULL] if value is None else [encode_varint(len(value)), value]
    if header is None:
        parts.append(_NO_HEADERS)
    else:
        parts += [_MARKER_FIELD, encode_varint(len(header)), header]
    body = b"".join(parts)
    return encode_varint(len(body)) + body


@dataclass(slots=True)
class _Large:
    """A produced batch going to the store: as sent, and the spans of its records."""

    batch: RecordBatch  # the batch in the request
    sent: RecordBatch  # the same, as the bytes the store gets
    spans: list[RecordSpan]


class LargeBatch(ClaimCheck):
    """Moves large record batches to an object store on produce and back on fetch."""

    plugin_name: ClassVar[str] = "large-batch"
    description: ClassVar[str] = "Keeps large record batches in S3 (or a directory), with a reference batch in Kafka."
    logger: ClassVar[logging.Logger] = log
    subject: ClassVar[str] = "large batch"

    @hookimpl
    async def kanal_produce_records(self, ctx: RecordsContext) -> RecordsResult:
        """Stores the large batches of this partition, all or none, then puts reference batches in
        their place."""
        if not self._matches(ctx.topic):
            return None
        minimum = self.config.minimum_size_in_bytes
        large: list[_Large] = []
        for batch in ctx.records.batches:
            if batch.is_control:
                continue
            # what goes to the broker (an interceptor before this one may have changed the batch)
            sent = RecordBatch.from_bytes(batch.to_bytes()) if batch.changed() else batch
            data, start = records_area(sent)
            try:
                if _MARKER_BYTES in data and any(marker(r, MARKER) is not None for r in sent.records()):
                    return PartitionError(
                        ErrorCode.invalid_record, f"the record header {MARKER} is reserved for the gateway"
                    )
                if sent.size < minimum or sent.records_count <= 0:
                    continue
                sent.check_crc()  # (the broker checks the batch it gets, which is not this one)
                spans = record_spans(data, start, sent.records_count, len(data))
            except (CorruptRecordError, ValueError) as exc:
                return PartitionError(ErrorCode.corrupt_message, f"a record batch is corrupt: {exc}")
            large.append(_Large(batch, sent, spans))
        if not large:
            return None
        references = await self._store_all(
            ctx.topic, ctx.partition, [item.sent.to_bytes() for item in large], BatchReference
        )
        if isinstance(references, PartitionError):
            return references
        for item, reference in zip(large, references, strict=True):
            first, *rest = item.spans
            key = reference.key.encode("utf-8")
            area = b"".join(
                [_record(first[4], first[5], reference.encode(), key), *(_record(s[4], s[5]) for s in rest)]
            )
            ctx.records.replace(item.batch, item.sent.with_records(area, len(item.spans)))
        return None

    def _reference(self, topic: str, partition: int, batch: RecordBatch) -> BatchReference | None:
        """The reference of a fetched batch whose first record holds one; None for other batches
        (a batch with the marker header but no valid reference in its first record is left as it
        is, with a warning)."""
        data, _ = records_area(batch)
        if _MARKER_BYTES not in data:
            return None
        records = batch.records()
        marked = [r for r in records if marker(r, MARKER) is not None]
        if not marked:
            return None
        header = marker(records[0], MARKER)
        reference = BatchReference.decode(records[0].value, header) if records[0].offset_delta == 0 else None
        if reference is None:
            log.warning(
                "large-batch: %s-%d offset %d has the %s header but no valid batch reference: left as it is",
                topic,
                partition,
                batch.offset_of(marked[0]),
                MARKER,
            )
        return reference

    @hookimpl
    async def kanal_fetch_records(self, ctx: RecordsContext) -> RecordsResult:
        """Puts the stored batches of this partition back in place of their reference batches, or
        fails it (retriably) when it cannot."""
        if not self._matches(ctx.topic):
            return None

        def find(batch: RecordBatch) -> list[tuple[RecordBatch, Reference]]:
            reference = self._reference(ctx.topic, ctx.partition, batch)
            return [] if reference is None else [(batch, reference)]

        todo = self._restorable(ctx, find)
        if not todo:
            return None
        loaded = await self._load_all([reference for _, reference in todo])
        if isinstance(loaded, str):
            return self._store_failed(ctx.topic, ctx.partition, "fetch failed", loaded)
        restored: list[bytes] = []
        for (batch, reference), data in zip(todo, loaded, strict=True):
            framed = _restore(batch, data)
            if framed is None:
                offsets = f"{batch.base_offset}..{batch.next_offset - 1}"
                failure = f"object {reference.key} is not the batch of offsets {offsets}"
                return self._store_failed(ctx.topic, ctx.partition, "fetch failed", failure)
            restored.append(framed)
        for (batch, _), framed in zip(todo, restored, strict=True):
            ctx.records.replace(batch, framed)
        return None


def _restore(fetched: RecordBatch, stored: bytes) -> bytes | None:
    """The stored batch framed as the broker framed its reference batch, or None when it does not
    fit it (another record count or offset range: it was never this batch's).

    From the broker's header: the offsets, leader epoch, timestamp type and ``maxTimestamp`` (set by
    the broker with LogAppendTime), producer id, epoch and sequence. From the stored one: its
    records area and codec, untouched (nothing is recompressed), and ``baseTimestamp``, which its
    records' timestamp deltas count from.
    """
    try:
        batch = RecordBatch.from_bytes(stored)
    except CorruptRecordError:
        return None
    if (
        batch.is_control
        or batch.records_count != fetched.records_count
        or batch.last_offset_delta != fetched.last_offset_delta
    ):
        return None
    batch.base_offset = fetched.base_offset
    batch.partition_leader_epoch = fetched.partition_leader_epoch
    batch.attributes = (fetched.attributes & ~7) | batch.compression
    batch.max_timestamp = fetched.max_timestamp
    batch.producer_id = fetched.producer_id
    batch.producer_epoch = fetched.producer_epoch
    batch.base_sequence = fetched.base_sequence
    return batch.to_bytes()


INTERCEPTORS: list[type[Interceptor]] = [LargeBatch]
