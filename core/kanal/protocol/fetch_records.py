"""Where the records of a Fetch response are, and a copy with some of them replaced.

A Fetch response is mostly record sets, and records hooks (decryption, masking) change only those:
decoding the whole response with kio and encoding it again costs about a quarter of the gateway's
time on a decrypted consume. So for Fetch v12+ (flexible) the gateway walks the frame once to find
each partition's error code and records (:func:`fetch_records`), lets the hooks work on the record
sets, and splices the new ones in (:func:`splice_records`): the rest of the frame is copied as it is.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from typing import NamedTuple

from kanal.protocol.headers import InvalidHeader, read_uvarint, skip_tagged_fields

__all__ = ["FIRST_VERSION", "PartitionRecords", "RecordsEdit", "TopicRecords", "fetch_records", "splice_records"]

FIRST_VERSION = 12  # the first flexible Fetch response (topic names until v12, ids from v13)
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

Frame = bytes | bytearray | memoryview


class PartitionRecords(NamedTuple):
    partition: int
    error_at: int  # where the partition's error code (int16) is
    error_code: int
    length_at: int  # where the records' compact length starts
    start: int  # where the record bytes start; -1: null records
    end: int  # where they end (and the partition's tagged fields start)


class TopicRecords(NamedTuple):
    name: str | None  # (v12)
    topic_id: uuid.UUID | None  # (v13+)
    id_at: int  # where the topic id is (-1 before v13): ids keep their length, so they are patched in place
    partitions: tuple[PartitionRecords, ...]


class RecordsEdit(NamedTuple):
    """What becomes of one partition: new record bytes (None: as they are) and error code (None: as it is)."""

    partition: PartitionRecords
    records: bytes | None
    error_code: int | None = None


def fetch_records(frame: Frame, version: int) -> list[TopicRecords]:
    """The topics, partitions and record sets of a whole Fetch v12+ response frame (response header
    included). Raises InvalidHeader for a frame that does not parse, or a version before v12."""
    if version < FIRST_VERSION:
        raise InvalidHeader(f"Fetch v{version} responses are not walked (flexible versions only)")
    try:
        return _walk(frame, version)
    except InvalidHeader:
        raise
    except (IndexError, struct.error, ValueError) as exc:
        raise InvalidHeader(f"malformed Fetch v{version} response") from exc


def _walk(frame: Frame, version: int) -> list[TopicRecords]:
    pos = skip_tagged_fields(frame, 4)  # after the correlation id
    pos += 10  # throttle_time_ms, error_code, session_id
    topics: list[TopicRecords] = []
    count, pos = read_uvarint(frame, pos)
    for _ in range(count - 1):
        name = topic_id = None
        id_at = -1
        if version >= 13:
            id_at = pos
            topic_id = uuid.UUID(bytes=bytes(frame[pos : pos + 16]))
            pos += 16
        else:
            size, pos = read_uvarint(frame, pos)
            name = bytes(frame[pos : pos + size - 1]).decode()
            pos += size - 1
        partitions = []
        n, pos = read_uvarint(frame, pos)
        for _ in range(n - 1):
            partition = _I32.unpack_from(frame, pos)[0]
            error_at = pos + 4
            error_code = _I16.unpack_from(frame, error_at)[0]
            pos += 30  # partition_index, error_code, high_watermark, last_stable_offset, log_start_offset
            aborted, pos = read_uvarint(frame, pos)  # (nullable: 0 is null)
            for _ in range(aborted - 1):
                pos = skip_tagged_fields(frame, pos + 16)  # producer_id, first_offset
            pos += 4  # preferred_read_replica
            length_at = pos
            size, pos = read_uvarint(frame, pos)
            start, end = (-1, pos) if size == 0 else (pos, pos + size - 1)
            if end > len(frame):
                raise InvalidHeader("a record set runs past the end of the frame")
            partitions.append(PartitionRecords(partition, error_at, error_code, length_at, start, end))
            pos = skip_tagged_fields(frame, end)
        topics.append(TopicRecords(name, topic_id, id_at, tuple(partitions)))
        pos = skip_tagged_fields(frame, pos)
    pos = skip_tagged_fields(frame, pos)
    if pos != len(frame):
        raise InvalidHeader(f"{len(frame) - pos} bytes after the Fetch response")
    return topics


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def splice_records(frame: Frame, edits: Sequence[RecordsEdit]) -> bytearray:
    """A copy of ``frame`` with the edits applied (in frame order, as :func:`fetch_records` gives the
    partitions); every other byte is copied as it is."""
    view = memoryview(frame)
    out = bytearray()
    prev = 0
    for partition, records, error_code in edits:
        if error_code is not None:
            out += view[prev : partition.error_at]
            out += _I16.pack(error_code)
            prev = partition.error_at + 2
        if records is not None:
            out += view[prev : partition.length_at]
            out += _uvarint(len(records) + 1)
            out += records
            prev = partition.end
    out += view[prev:]
    return out
