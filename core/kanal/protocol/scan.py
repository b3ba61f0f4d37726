"""Cheap scans of response frames that spare a full decode.

Produce v10+ and Fetch v16+ responses may carry KIP-951 leader hints (``node_endpoints``, top-level
tag 0) holding broker addresses the gateway must rewrite. They are rare (only after a leader
change) while the responses are the bulk of the traffic, so the gateway walks the frame's
structure, skipping record bytes by their length, and decodes only when the tag is present.
"""

from __future__ import annotations

import struct

from kanal.protocol.headers import read_uvarint, skip_tagged_fields

_I32 = struct.Struct(">i")


def _skip_compact_bytes(buf: bytes | bytearray, pos: int) -> int:
    length, pos = read_uvarint(buf, pos)
    return pos + max(length - 1, 0)


def _top_level_has_tag_zero(buf: bytes | bytearray, pos: int) -> bool:
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        if tag == 0:
            return size > 1  # an empty compact array is the single byte 0x01
        pos += size
    return False


def _fetch_has_endpoints(buf: bytes | bytearray) -> bool:
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
    return _top_level_has_tag_zero(buf, pos)


def _produce_has_endpoints(buf: bytes | bytearray, version: int) -> bool:
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
    return _top_level_has_tag_zero(buf, pos + 4)  # after throttle time


def has_node_endpoints(api_key: int, version: int, frame: bytes | bytearray) -> bool:
    """Whether a Produce v10+ or Fetch v16+ response frame carries KIP-951 node endpoints.

    Errs on the side of True when the frame does not parse as expected, so a malformed or
    unexpected response is decoded (and checked) rather than forwarded unread.
    """
    try:
        if api_key == 1 and version >= 16:
            return _fetch_has_endpoints(frame)
        if api_key == 0 and version >= 10:
            return _produce_has_endpoints(frame, version)
    except (IndexError, ValueError, struct.error):
        return True
    return False
