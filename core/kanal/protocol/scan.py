"""Cheap scans of response frames that spare a full decode.

Produce v10+ and Fetch v16+ responses may carry KIP-951 leader hints (``node_endpoints``, top-level
tag 0) holding broker addresses the gateway must rewrite. They are rare (only after a leader
change) while the responses are the bulk of the traffic, so the gateway walks the frame's
structure, skipping record bytes by their length, and decodes only when the tag is present.

The scans read single bytes by index, so they also work on a :class:`ChunkedView` over the chunks
of a response that is being forwarded while it arrives.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from kanal.protocol.headers import Indexable, InvalidHeader, read_uvarint, skip_tagged_fields

# A tag no version of Produce or Fetch defines: clients skip unknown tagged fields.
NEUTRAL_TAG = 0x7F


class ChunkedView:
    """Random access by index over consecutive chunks, from ``offset`` on, without joining them."""

    __slots__ = ("_chunks", "_length", "_offset", "_starts")

    def __init__(self, chunks: Sequence[bytes | bytearray | memoryview], offset: int = 0) -> None:
        self._chunks = chunks
        self._starts: list[int] = []
        total = 0
        for chunk in chunks:
            self._starts.append(total)
            total += len(chunk)
        self._offset = offset
        self._length = total - offset

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int, /) -> int:
        if not 0 <= index < self._length:
            raise IndexError(index)
        at = index + self._offset
        i = bisect_right(self._starts, at) - 1
        return self._chunks[i][at - self._starts[i]]


def _skip_compact_bytes(buf: Indexable, pos: int) -> int:
    length, pos = read_uvarint(buf, pos)
    return pos + max(length - 1, 0)


def _tag_zero_position(buf: Indexable, pos: int) -> int | None:
    """Position of the tag-0 entry in a tagged-field section, when present and not empty."""
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        entry = pos
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        if tag == 0:
            return entry if size > 1 else None  # an empty compact array is the single byte 0x01
        pos += size
    if pos > len(buf):
        raise InvalidHeader("truncated tagged fields")
    return None


def _fetch_tail(buf: Indexable) -> int:
    pos = skip_tagged_fields(buf, 4) + 4 + 2 + 4  # header; throttle, error code, session id
    topics, pos = read_uvarint(buf, pos)
    for _ in range(max(topics - 1, 0)):
        pos += 16  # topic id
        partitions, pos = read_uvarint(buf, pos)
        for _ in range(max(partitions - 1, 0)):
            pos += 4 + 2 + 8 + 8 + 8
            aborted, pos = read_uvarint(buf, pos)
            for _ in range(max(aborted - 1, 0)):
                pos = skip_tagged_fields(buf, pos + 16)
            pos += 4  # preferred read replica
            pos = _skip_compact_bytes(buf, pos)  # records
            pos = skip_tagged_fields(buf, pos)
        pos = skip_tagged_fields(buf, pos)
    return pos


def _produce_tail(buf: Indexable, version: int) -> int:
    pos = skip_tagged_fields(buf, 4)
    topics, pos = read_uvarint(buf, pos)
    for _ in range(max(topics - 1, 0)):
        pos = pos + 16 if version >= 13 else _skip_compact_bytes(buf, pos)  # topic id or name
        partitions, pos = read_uvarint(buf, pos)
        for _ in range(max(partitions - 1, 0)):
            pos += 4 + 2 + 8 + 8 + 8
            errors, pos = read_uvarint(buf, pos)
            for _ in range(max(errors - 1, 0)):
                pos = skip_tagged_fields(buf, _skip_compact_bytes(buf, pos + 4))
            pos = _skip_compact_bytes(buf, pos)  # error message
            pos = skip_tagged_fields(buf, pos)
        pos = skip_tagged_fields(buf, pos)
    return pos + 4  # throttle time


def node_endpoints_position(api_key: int, version: int, frame: Indexable) -> int | None:
    """Where the KIP-951 node endpoints entry of a Produce v10+ / Fetch v16+ response frame starts
    (the position of its tag), or None when it has none. Raises InvalidHeader (or IndexError) on a
    frame that does not parse."""
    if api_key == 1 and version >= 16:
        return _tag_zero_position(frame, _fetch_tail(frame))
    if api_key == 0 and version >= 10:
        return _tag_zero_position(frame, _produce_tail(frame, version))
    return None


def has_node_endpoints(api_key: int, version: int, frame: Indexable) -> bool:
    """Whether a response frame carries KIP-951 node endpoints.

    Errs on the side of True when the frame does not parse as expected, so a malformed or
    unexpected response is decoded (and checked) rather than forwarded unread.
    """
    try:
        return node_endpoints_position(api_key, version, frame) is not None
    except (IndexError, ValueError):
        return True
