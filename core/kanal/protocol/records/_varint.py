"""Zigzag varints as Kafka records use them, for the batch codec (plugins use ``values.encode_varint``
and the record walk)."""

from __future__ import annotations

from typing import Final

from .errors import CorruptRecordError


def zigzag_bytes(n: int) -> bytes:
    """Zigzag varint/varlong encoding of a signed 64-bit value."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


ZIGZAG_TABLE_SIZE: Final = 1 << 14
# The encodings of -1 .. ZIGZAG_TABLE_SIZE - 1, at index n + 1: a list lookup beats the encoder loop.
ZIGZAG_TABLE: Final[list[bytes]] = [zigzag_bytes(n) for n in range(-1, ZIGZAG_TABLE_SIZE)]


def read_zigzag(b: bytes, p: int) -> tuple[int, int]:
    """Decodes the zigzag varint at ``b[p]``; returns (value, next position)."""
    x = b[p]
    if x < 0x80:
        return (x >> 1) ^ -(x & 1), p + 1
    r = x & 0x7F
    s = 7
    p += 1
    while True:
        x = b[p]
        p += 1
        r |= (x & 0x7F) << s
        if x < 0x80:
            return (r >> 1) ^ -(r & 1), p
        s += 7
        if s > 63:
            raise CorruptRecordError("varint longer than 10 bytes")
