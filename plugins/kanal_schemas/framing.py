"""Where a Kafka record says which schema its value (or key) was written with.

* a prefix of the payload: magic byte ``0`` then the id as a 4-byte big-endian integer (the Confluent
  wire format); the encoded body follows;
* a record header, ``__value_schema_id`` (``__key_schema_id`` for the key), in any of the forms
  clients write: magic byte ``1`` and a 16-byte GUID (confluent-kafka's header serializer), magic
  byte ``0`` and a 4-byte id, a bare 16-byte GUID, a bare 4-byte id, or the id or GUID as text. The
  payload is then the body alone. A header wins over a prefix, as in confluent-kafka's deserializer.

A schema reference (:data:`SchemaRef`) is an integer id or a GUID in canonical text form.
"""

from __future__ import annotations

import uuid
from typing import Final

__all__ = [
    "KEY_HEADER",
    "MAGIC",
    "VALUE_HEADER",
    "SchemaRef",
    "describe_ref",
    "frame",
    "guid_header",
    "header_ref",
    "id_header",
    "prefix_ref",
    "split",
]

MAGIC: Final = 0
GUID_MAGIC: Final = 1
VALUE_HEADER: Final = "__value_schema_id"
KEY_HEADER: Final = "__key_schema_id"

SchemaRef = int | str  # an integer id, or a GUID in canonical text form


def frame(schema_id: int, body: bytes) -> bytes:
    """``body`` in the Confluent wire format: magic byte 0, the id (4 bytes, big-endian), the body."""
    return b"\x00" + schema_id.to_bytes(4, "big") + body


def prefix_ref(payload: bytes | None) -> int | None:
    """The schema id of a payload in the Confluent wire format (magic 0 + 4-byte id), else None."""
    if payload is None or len(payload) < 5 or payload[0] != 0:
        return None
    return int.from_bytes(payload[1:5], "big")


def split(payload: bytes) -> tuple[int, bytes] | None:
    """(schema id, body) of a payload in the Confluent wire format, else None."""
    schema_id = prefix_ref(payload)
    return None if schema_id is None else (schema_id, payload[5:])


def id_header(schema_id: int) -> bytes:
    """A schema id header value as confluent-kafka writes it (magic 0 + 4-byte id)."""
    return b"\x00" + schema_id.to_bytes(4, "big")


def guid_header(guid: str) -> bytes:
    """A schema GUID header value as confluent-kafka writes it (magic 1 + the 16 bytes)."""
    return b"\x01" + uuid.UUID(guid).bytes


def header_ref(raw: bytes | None) -> SchemaRef | None:
    """The schema reference a ``__value_schema_id``/``__key_schema_id`` header value holds, else None."""
    if raw is None:
        return None
    n = len(raw)
    if n >= 17 and raw[0] == GUID_MAGIC:
        return str(uuid.UUID(bytes=bytes(raw[1:17])))
    if n == 5 and raw[0] == MAGIC:
        return int.from_bytes(raw[1:5], "big")
    if n == 16:
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            text = ""
        if not text.isdigit():
            return str(uuid.UUID(bytes=bytes(raw)))
    if n == 4:
        return int.from_bytes(raw, "big")
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    if text.isdigit():
        return int(text)
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None


def describe_ref(ref: SchemaRef) -> str:
    """``schema id 7`` or ``schema GUID ...``: how messages name a reference."""
    return f"schema id {ref}" if isinstance(ref, int) else f"schema GUID {ref}"
