"""Request headers v0-v2 and response headers v0-v1, parsed and patched without kio.

The gateway reads every request header, so this is hand-written: fixed offsets for api key,
version and correlation id, a legacy nullable string for the client id, and tagged fields
for flexible versions.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Protocol

from kanal.protocol.api import request_header_version

_HDR = struct.Struct(">hhi")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class Indexable(Protocol):
    """Bytes that can be read one at a time by index (bytes, bytearray, memoryview)."""

    def __getitem__(self, index: int, /) -> int: ...

    def __len__(self) -> int: ...


class InvalidHeader(ValueError):
    """A frame too short or malformed to hold a request header."""


@dataclass(slots=True)
class RequestHeader:
    """The parsed request header and where the body starts in the frame."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_version: int
    body_offset: int


def read_uvarint(buf: Indexable, pos: int) -> tuple[int, int]:
    """Reads an unsigned varint; returns (value, new position)."""
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise InvalidHeader("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise InvalidHeader("varint too long")


def skip_tagged_fields(buf: Indexable, pos: int) -> int:
    """Skips a tagged-field section; returns the position after it."""
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
    if pos > len(buf):
        raise InvalidHeader("truncated tagged fields")
    return pos


def peek_request(frame: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """(api key, api version, correlation id) of a request frame."""
    if len(frame) < 8:
        raise InvalidHeader(f"request frame of {len(frame)} bytes is shorter than a header")
    key, version, corr = _HDR.unpack_from(frame, 0)
    return key, version, corr


def parse_request_header(frame: bytes | bytearray | memoryview) -> RequestHeader:
    """Parses the whole request header of a frame."""
    key, version, corr = peek_request(frame)
    hv = request_header_version(key, version)
    pos = 8
    client_id: str | None = None
    if hv >= 1:
        if len(frame) < 10:
            raise InvalidHeader("truncated client id")
        (n,) = _I16.unpack_from(frame, 8)
        pos = 10
        if n >= 0:
            if pos + n > len(frame):
                raise InvalidHeader("truncated client id")
            client_id = bytes(frame[pos : pos + n]).decode("utf-8", "replace")
            pos += n
    if hv >= 2:
        pos = skip_tagged_fields(frame, pos)
    return RequestHeader(key, version, corr, client_id, hv, pos)


def set_request_correlation_id(frame: bytearray, correlation_id: int) -> None:
    """Patches the correlation id of a request frame in place."""
    _I32.pack_into(frame, 4, correlation_id)


def response_correlation_id(frame: bytes | bytearray | memoryview) -> int:
    """The correlation id of a response frame."""
    if len(frame) < 4:
        raise InvalidHeader("response frame shorter than its correlation id")
    value: int = _I32.unpack_from(frame, 0)[0]
    return value


def set_response_correlation_id(frame: bytearray, correlation_id: int) -> None:
    """Patches the correlation id of a response frame in place."""
    _I32.pack_into(frame, 0, correlation_id)


def response_body_offset(frame: bytes | bytearray | memoryview, header_version: int) -> int:
    """Where the body of a response frame starts."""
    if header_version == 0:
        return 4
    return skip_tagged_fields(frame, 4)


def encode_request_header(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None, header_version: int
) -> bytes:
    """Encodes a request header (the tagged-field section is always empty)."""
    out = _HDR.pack(api_key, api_version, correlation_id)
    if header_version >= 1:
        if client_id is None:
            out += _I16.pack(-1)
        else:
            raw = client_id.encode()
            out += _I16.pack(len(raw)) + raw
    if header_version >= 2:
        out += b"\x00"
    return out


def encode_response_header(correlation_id: int, header_version: int) -> bytes:
    """Encodes a response header (the tagged-field section is always empty)."""
    return _I32.pack(correlation_id) + (b"\x00" if header_version >= 1 else b"")


def produce_acks(frame: bytes | bytearray | memoryview, header: RequestHeader) -> int:
    """The acks field of a Produce request, read without decoding the body.

    acks=0 means the broker sends no response, which the gateway must know to keep responses
    in order.
    """
    pos = _produce_acks_offset(frame, header)
    acks: int = _I16.unpack_from(frame, pos)[0]
    return acks


def produce_wait_offset(frame: bytes | bytearray | memoryview, header: RequestHeader) -> int:
    """Where a Produce request's ``timeout_ms`` (how long the broker may wait for replicas) is."""
    pos = _produce_acks_offset(frame, header) + 2
    if pos + 4 > len(frame):
        raise InvalidHeader("truncated Produce request")
    return pos


def _produce_acks_offset(frame: bytes | bytearray | memoryview, header: RequestHeader) -> int:
    pos = header.body_offset
    if header.api_version >= 3:  # transactional_id comes first
        pos = _string_span(frame, pos, header.header_version >= 2)[1]
    if pos + 2 > len(frame):
        raise InvalidHeader("truncated Produce request")
    return pos


def produce_topics(frame: bytes | bytearray | memoryview, header: RequestHeader) -> list[str | uuid.UUID] | None:
    """The topics of a Produce request (names; ids from v13), read without decoding it, or None when
    ``frame`` (possibly only the start of a large request) does not hold them all.

    The records of a topic come before the next topic's name, so a request for one topic (any
    number of its partitions) is answered from its first bytes; for several, the walk skips the
    records of all but the last topic and needs them in ``frame``.
    """
    version = header.api_version
    flexible = header.header_version >= 2
    end = len(frame)
    try:
        pos = header.body_offset
        if version >= 3:  # transactional_id
            pos = _string_span(frame, pos, flexible)[1]
        pos += 6  # acks, timeout
        count, pos = _array_length(frame, pos, flexible)
        topics: list[str | uuid.UUID] = []
        for i in range(count):
            if version >= 13:
                if pos + 16 > end:
                    return None
                topics.append(uuid.UUID(bytes=bytes(frame[pos : pos + 16])))
                pos += 16
            else:
                start, pos = _string_span(frame, pos, flexible)
                if pos > end:
                    return None
                topics.append(bytes(frame[start:pos]).decode("utf-8"))
            if i == count - 1:
                return topics
            partitions, pos = _array_length(frame, pos, flexible)
            for _ in range(partitions):
                pos += 4  # index
                if flexible:
                    n, pos = read_uvarint(frame, pos)
                    pos += max(n - 1, 0)
                    pos = skip_tagged_fields(frame, pos)
                else:
                    if pos + 4 > end:
                        return None
                    pos += 4 + max(_I32.unpack_from(frame, pos)[0], 0)
            if flexible:
                pos = skip_tagged_fields(frame, pos)
    except (InvalidHeader, IndexError, struct.error, UnicodeDecodeError):
        return None
    return topics


def _array_length(frame: bytes | bytearray | memoryview, pos: int, flexible: bool) -> tuple[int, int]:
    if flexible:
        n, pos = read_uvarint(frame, pos)
        return max(n - 1, 0), pos
    if pos + 4 > len(frame):
        raise InvalidHeader("truncated array length")
    count: int = _I32.unpack_from(frame, pos)[0]
    return max(count, 0), pos + 4


def _string_span(frame: bytes | bytearray | memoryview, pos: int, flexible: bool) -> tuple[int, int]:
    """Where the text of the (nullable) string at ``pos`` starts and ends (a null string: empty)."""
    if flexible:
        n, start = read_uvarint(frame, pos)
        return start, start + max(n - 1, 0)
    if pos + 2 > len(frame):
        raise InvalidHeader("truncated string length")
    length: int = _I16.unpack_from(frame, pos)[0]
    return pos + 2, pos + 2 + max(length, 0)
