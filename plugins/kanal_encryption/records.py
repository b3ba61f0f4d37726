"""Writing a record with a new key, value or headers, from the walked bytes of the original.

The core's ``write_record`` replaces a record's value (compiled, the common case); a record whose
key or headers change too is written here from its span: its attributes and deltas copied, the rest
encoded anew.
"""

from __future__ import annotations

from collections.abc import Sequence

from kanal.api import RecordSpan, encode_varint, write_record

__all__ = ["SAME", "encode_headers", "write_changed", "write_parts"]

_NULL = encode_varint(-1)


class Same:
    """Keep the original part."""

    __slots__ = ()


SAME = Same()


def _part(value: bytes | None) -> bytes:
    return _NULL if value is None else encode_varint(len(value)) + value


def encode_headers(headers: Sequence[tuple[bytes, bytes | None]]) -> bytes:
    """A record's header section: the count, then each key and value (None: null)."""
    out = bytearray(encode_varint(len(headers)))
    for key, value in headers:
        out += encode_varint(len(key))
        out += key
        out += _part(value)
    return bytes(out)


def write_parts(
    out: bytearray,
    b: bytes,
    span: RecordSpan,
    key: bytes | Same | None = SAME,
    value: bytes | Same | None = SAME,
    headers: bytes | Same = SAME,
) -> None:
    """Appends the record of ``span`` with the parts given replaced (``headers``: a whole header
    section, from :func:`encode_headers`)."""
    body, end, key_at, key_end, value_end = span[1], span[2], span[6], span[7], span[9]
    key_length_at = key_end - 1 if key_at < 0 else key_at - len(encode_varint(key_end - key_at))
    head = b[body:key_length_at]  # attributes, timestamp delta, offset delta
    key_part = b[key_length_at:key_end] if isinstance(key, Same) else _part(key)
    value_part = b[key_end:value_end] if isinstance(value, Same) else _part(value)  # (its length starts at key_end)
    header_part = b[value_end:end] if isinstance(headers, Same) else headers
    out += encode_varint(len(head) + len(key_part) + len(value_part) + len(header_part))
    out += head
    out += key_part
    out += value_part
    out += header_part


def write_changed(
    out: bytearray,
    b: bytes,
    span: RecordSpan,
    key: bytes | Same | None = SAME,
    value: bytes | Same | None = SAME,
    headers: bytes | Same = SAME,
) -> None:
    """Appends the record of ``span`` as cheaply as its changes allow: copied when none, the
    compiled ``write_record`` when only the value changed, else :func:`write_parts`."""
    if isinstance(key, Same) and isinstance(headers, Same):
        if isinstance(value, Same):
            out += b[span[0] : span[2]]
        else:
            write_record(out, b, span, value)
    else:
        write_parts(out, b, span, key, value, headers)
