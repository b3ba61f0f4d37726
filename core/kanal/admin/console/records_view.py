"""How the console shows a record's key and value, sans-I/O: JSON pretty-printed, text as text,
anything else as a short hex preview, and values in a schema registry's framing (a zero byte and a
four-byte schema id) named as such for a plugin's decoder to read. Long values are cut, saying so:
a page never holds more than :data:`MAX_SHOWN` characters of one value."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

import orjson

__all__ = ["MAX_SHOWN", "Shown", "framed_schema_id", "show_bytes", "show_decoded"]

MAX_SHOWN: Final = 4000
_HEX_BYTES: Final = 64


@dataclass(frozen=True, slots=True)
class Shown:
    """A key or value as the page shows it: ``kind`` (json, text, binary, null, or a decoder's
    name), the ``text`` (escaped by the page) and whether it was cut."""

    kind: str
    text: str
    cut: bool = False


def _cut(text: str) -> tuple[str, bool]:
    return (text[:MAX_SHOWN], True) if len(text) > MAX_SHOWN else (text, False)


def show_decoded(kind: str, value: Any) -> Shown:
    """A value a decoder read (JSON-like data), pretty-printed."""
    text, cut = _cut(json.dumps(value, indent=2, ensure_ascii=False, default=str))
    return Shown(kind, text, cut)


def framed_schema_id(value: bytes | None) -> int | None:
    """The schema id of a value in a schema registry's wire format (magic 0, 4-byte id), or None."""
    if value is None or len(value) < 5 or value[0] != 0:
        return None
    return int.from_bytes(value[1:5], "big")


def show_bytes(value: bytes | None) -> Shown:
    """A key or value no decoder read: JSON, then UTF-8 text, then hex."""
    if value is None:
        return Shown("null", "null")
    if value[:1] in (b"{", b"[") or value[:1].isdigit() or value[:1] in (b'"', b"-", b"t", b"f", b"n"):
        try:
            return show_decoded("json", orjson.loads(value))
        except orjson.JSONDecodeError:
            pass
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        schema = framed_schema_id(value)
        head = value[:_HEX_BYTES].hex(" ")
        label = f"schema id {schema}, {len(value)} bytes" if schema is not None else f"{len(value)} bytes"
        return Shown("binary", f"{label}: {head}", len(value) > _HEX_BYTES)
    if all(c.isprintable() or c in "\t\r\n" for c in text):
        shown, cut = _cut(text)
        return Shown("text", shown, cut)
    return Shown("binary", f"{len(value)} bytes: {value[:_HEX_BYTES].hex(' ')}", len(value) > _HEX_BYTES)
