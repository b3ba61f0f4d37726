"""Decrypting the records of one fetched batch.

An encrypted part is found by its envelope (the magic bytes at its start; a JSON field holds it as
base64 text, whose first characters are fixed too), so the decrypter needs no record of what was
encrypted: every envelope it may open, or only the fields listed. A part that does not decrypt
(its key shredded, the KMS down, bytes tampered with) is left as stored, or fails the fetch, as
the policy says.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from kanal.api import RecordBatch, RecordSpan, record_headers, record_spans, records_area, write_record

from .crypto.ciphers import DecryptError
from .crypto.envelope import MAGIC, TEXT_MAGIC, Envelope, Opener, parse
from .kms.base import KmsError
from .records import SAME, encode_headers, write_parts
from .targets import KEY, VALUE, associated_data

__all__ = ["DecryptionFailed", "OpenerSource", "Selection", "decrypt_batch"]

_TEXT_MAGIC = TEXT_MAGIC.encode()  # how a base64 envelope in a JSON field starts


class DecryptionFailed(Exception):
    """A part could not be decrypted and the policy is ``fail_fetch``."""


class OpenerSource(Protocol):
    def opener_now(self, envelope: Envelope) -> Opener | None: ...

    async def opener(self, envelope: Envelope) -> Opener: ...


@dataclass(frozen=True, slots=True)
class Selection:
    """What to decrypt; None: every envelope of that part (``payload`` names the whole part)."""

    value: frozenset[str] | None = None
    key: frozenset[str] | None = None
    headers: frozenset[str] | None = None
    fail_fetch: bool = False

    def wants(self, names: frozenset[str] | None, name: str) -> bool:
        return names is None or name in names


#: Called for each part left encrypted (the part's label, the reason): audit and metrics.
OnFailure = Callable[[str, Exception], None]


async def decrypt_batch(
    selection: Selection, topic: str, batch: RecordBatch, openers: OpenerSource, failed: OnFailure
) -> tuple[bytes | None, int]:
    """The batch's bytes with what it may decrypt in clear (None: nothing was encrypted), and how
    many parts were decrypted. Raises DecryptionFailed (``fail_fetch``)."""
    area, start = records_area(batch)
    count = batch.records_count
    spans = record_spans(area, start, count, len(area))
    topic_b = topic.encode()
    out = bytearray()
    decrypted = 0
    opener = _Opening(selection, topic_b, openers, failed)
    for span in spans:
        await _record(opener, area, span, out)
    decrypted = opener.count
    return (batch.with_records(out, count) if decrypted else None), decrypted


class _Opening:
    """Opens the envelopes of one batch, counting them and applying the failure policy."""

    __slots__ = ("count", "failed", "openers", "selection", "topic")

    def __init__(self, selection: Selection, topic: bytes, openers: OpenerSource, failed: OnFailure) -> None:
        self.selection = selection
        self.topic = topic
        self.openers = openers
        self.failed = failed
        self.count = 0

    async def open(self, data: bytes, label: bytes, identity: bytes | None) -> bytes | None:
        """The clear bytes of an envelope, or None when ``data`` is not one or stays encrypted."""
        try:
            envelope = parse(data)
            if envelope is None:
                return None
            opener = self.openers.opener_now(envelope)
            if opener is None:
                opener = await self.openers.opener(envelope)
            clear = opener.open(envelope, associated_data(self.topic, label, identity))
        except (ValueError, DecryptError, KmsError) as exc:  # (EnvelopeError, a key this gateway cannot reach)
            if self.selection.fail_fetch:
                raise DecryptionFailed(f"{label.decode('utf-8', 'replace')}: {exc}") from exc
            self.failed(label.decode("utf-8", "replace"), exc)
            return None
        self.count += 1
        return clear


async def _record(opening: _Opening, area: bytes, span: RecordSpan, out: bytearray) -> None:
    selection = opening.selection
    key = None if span[6] < 0 else area[span[6] : span[7]]
    value = None if span[8] < 0 else area[span[8] : span[9]]
    new_key: Any = SAME
    if key is not None and selection.key != frozenset():
        clear = await _part(opening, KEY, key, None, selection.key)
        if clear is not None:
            new_key = clear
    new_value: Any = SAME
    if value is not None and selection.value != frozenset():
        clear = await _part(opening, VALUE, value, key, selection.value)
        if clear is not None:
            new_value = clear
    headers: Any = SAME
    if span[10] and selection.headers != frozenset():
        headers = await _headers(opening, area, span, key)
    if headers is SAME and new_key is SAME:
        if new_value is SAME:
            out += area[span[0] : span[2]]
        else:
            write_record(out, area, span, new_value)
    else:
        write_parts(out, area, span, new_key, new_value, headers)


async def _part(
    opening: _Opening, part: str, data: bytes, identity: bytes | None, names: frozenset[str] | None
) -> bytes | None:
    """The part in clear (whole, or with its fields), or None when it stays as stored."""
    if data.startswith(MAGIC):
        if names is not None and "payload" not in names:
            return None
        return await opening.open(data, part.encode(), identity)
    if _TEXT_MAGIC not in data:
        return None  # no field can hold an envelope: not parsed
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    changed = await _fields(opening, document, part, identity, names)
    return orjson.dumps(document) if changed else None


async def _fields(
    opening: _Opening, node: Any, path: str, identity: bytes | None, names: frozenset[str] | None
) -> bool:
    """Decrypts the envelopes among the strings of ``node`` in place (labels as the encrypter wrote
    them: ``value.a[0].b``); whether any was."""
    items: Any = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    changed = False
    for step, child in list(items):
        label = f"{path}[{step}]" if isinstance(step, int) else f"{path}.{step}"
        if isinstance(child, str):
            if not child.startswith(TEXT_MAGIC):
                continue
            if names is not None and label.split(".", 1)[1] not in names:
                continue
            try:
                raw = base64.b64decode(child, validate=True)
            except ValueError:
                continue
            clear = await opening.open(raw, label.encode(), identity)
            if clear is not None:
                node[step] = orjson.loads(clear)
                changed = True
        elif isinstance(child, (dict, list)):
            changed = await _fields(opening, child, label, identity, names) or changed
    return changed


async def _headers(opening: _Opening, area: bytes, span: RecordSpan, identity: bytes | None) -> Any:
    names = opening.selection.headers
    result: list[tuple[bytes, bytes | None]] = []
    changed = False
    for name, value in record_headers(area, span[9], span[2]):
        if (
            value is not None
            and value.startswith(MAGIC)
            and (names is None or name.decode("utf-8", "replace") in names)
        ):
            clear = await opening.open(value, b"header:" + name, identity)
            if clear is not None:
                result.append((name, clear))
                changed = True
                continue
        result.append((name, value))
    return encode_headers(result) if changed else SAME
