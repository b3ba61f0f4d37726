"""What an encryption or decryption interceptor does to a record, compiled from its config once.

A :class:`Target` is one thing to encrypt: the whole value, key or a matching header (``path``
None), or one JSON field of the value or key. Its ``label`` names it in the ciphertext's
associated data, so that ciphertext moved to another field, part or topic never decrypts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .crypto.ciphers import Algorithm
from .paths import FieldPath
from .templates import Template

__all__ = ["HEADER", "KEY", "VALUE", "Target", "associated_data", "path_label"]

VALUE = "value"
KEY = "key"
HEADER = "header"


@dataclass(frozen=True, slots=True, eq=False)
class Target:
    part: str  # VALUE, KEY or HEADER
    label: bytes  # b"value", b"value.card.number", b"key", b"header:<name>" (one header) ...
    path: FieldPath | None  # a JSON field of the part; None: the whole part
    template: Template  # its key: a connection's key id, or a keySecretId URI
    algorithm: Algorithm
    header: re.Pattern[str] | None = None  # headers whose name matches (HEADER payload targets)


def path_label(part: str, path: FieldPath) -> bytes:
    """The label of a field: its part and steps in one spelling (``value.list[0].x``), however the
    operator wrote the path, so a decrypter walking the record finds the same label."""
    text = part
    for step in path.steps:
        text += f"[{step}]" if isinstance(step, int) else f".{step}"
    return text.encode()


def associated_data(topic: bytes, label: bytes, identity: bytes | None) -> bytes:
    """What the ciphertext is bound to: the topic, the field, and the record's key as stored (its
    identity wherever it is copied within the topic; none for the key itself)."""
    return b"kanal\x00" + topic + b"\x00" + label + (b"\x00" if identity is None else b"\x01" + identity)
