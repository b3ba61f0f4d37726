"""SaslHandshake and SaslAuthenticate requests read and responses written directly.

Every login on a listener that authenticates its clients reads and answers both; through kio's
generic decoder and encoder they took about 10% of the gateway's CPU for a new connection
(profiled with bench/auth_connections.py), here a fraction of it. kio stays the reference:
tests/unit/test_sasl_messages.py checks every version against it.
"""

from __future__ import annotations

import functools
import struct

from kio.schema.errors import ErrorCode

from kanal.protocol.api import ApiKey
from kanal.protocol.headers import encode_response_header
from kanal.protocol.messages import encode_body, response_type

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


@functools.lru_cache(maxsize=32)
def _handshake_body(version: int, error_code: int, mechanisms: tuple[str, ...]) -> bytes:
    """The same few bodies answer every handshake: encoded once each."""
    cls = response_type(ApiKey.SASL_HANDSHAKE, version)
    return bytes(encode_body(cls(error_code=ErrorCode(error_code), mechanisms=mechanisms)))


def handshake_response(version: int, correlation_id: int, error_code: int, mechanisms: tuple[str, ...]) -> bytearray:
    """A SaslHandshake response frame (v0-v1, no length prefix)."""
    return bytearray(_I32.pack(correlation_id) + _handshake_body(version, error_code, mechanisms))


class MalformedSasl(ValueError):
    """A SASL request body that does not parse."""


def _read_uvarint(frame: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(frame) or shift > 28:
            raise MalformedSasl("bad unsigned varint")
        byte = frame[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _take(frame: bytes | bytearray | memoryview, pos: int, size: int) -> bytes:
    if size < 0 or pos + size > len(frame):
        raise MalformedSasl(f"a field of {size} bytes at {pos} runs past the end of the request")
    return bytes(frame[pos : pos + size])


def handshake_mechanism(frame: bytes | bytearray | memoryview, body_offset: int) -> str:
    """The mechanism a SaslHandshake request (v0-v1, never flexible) asks for."""
    if body_offset + 2 > len(frame):
        raise MalformedSasl("no mechanism")
    (size,) = _I16.unpack_from(frame, body_offset)
    return _take(frame, body_offset + 2, size).decode()


def authenticate_bytes(frame: bytes | bytearray | memoryview, body_offset: int, version: int) -> bytes:
    """The auth bytes of a SaslAuthenticate request (v0-v2; v2 is flexible)."""
    if version >= 2:
        size, pos = _read_uvarint(frame, body_offset)
        if size == 0:
            raise MalformedSasl("null auth bytes")
        return _take(frame, pos, size - 1)
    if body_offset + 4 > len(frame):
        raise MalformedSasl("no auth bytes")
    (size,) = _I32.unpack_from(frame, body_offset)
    return _take(frame, body_offset + 4, size)


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def authenticate_response(
    version: int, correlation_id: int, error_code: int, message: str | None, data: bytes, lifetime_ms: int
) -> bytearray:
    """A SaslAuthenticate response frame (v0-v2, no length prefix); ``lifetime_ms`` from v1."""
    text = None if message is None else message.encode()
    out = bytearray(encode_response_header(correlation_id, 1 if version >= 2 else 0))
    out += _I16.pack(error_code)
    if version >= 2:  # flexible: compact strings and bytes, tagged fields
        out += b"\x00" if text is None else _uvarint(len(text) + 1) + text
        out += _uvarint(len(data) + 1)
        out += data
    else:
        out += _I16.pack(-1) if text is None else _I16.pack(len(text)) + text
        out += _I32.pack(len(data))
        out += data
    if version >= 1:
        out += _I64.pack(lifetime_ms)
    if version >= 2:
        out += b"\x00"
    return out
