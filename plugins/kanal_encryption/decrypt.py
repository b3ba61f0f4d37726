"""Decrypting the records of one fetched batch.

An encrypted part is found by its envelope (the magic bytes at its start; a JSON field holds it as
base64 text, whose first characters are fixed too), so the decrypter needs no record of what was
encrypted: every envelope it may open, or only the fields listed. A part that does not decrypt
(its key shredded, the KMS down, bytes tampered with) is left as stored, or fails the fetch, as
the policy says.

The pass over the records is synchronous: the batch's data keys are looked up once each (a batch
mostly shares one), and a key not yet unwrapped stops the pass at that record, which is retried
once the KMS has answered. So the per-record cost is parse, decrypt and write, nothing more.

With a schema registry, a Confluent-framed Avro part is decoded with its writer schema (fetched
before the pass, once per id), its string and bytes fields holding envelopes and the fields whose
envelopes ride in ``kanal.enc.<label>`` headers restored, those headers dropped, and the record
encoded again (:mod:`~kanal_encryption.avro_fields`).
"""

from __future__ import annotations

import binascii
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from kanal_schemas import prefix_ref

from kanal.api import RecordBatch, RecordSpan, record_headers, record_spans, records_area, write_record

from .avro_fields import HEADER_PREFIX, AvroError, AvroSchemas, SchemaUnavailable, decrypt_fields, framed_ids
from .crypto.ciphers import Aead, DecryptError, open_json_fields
from .crypto.compression import decompress
from .crypto.envelope import MAGIC, TEXT_MAGIC, Envelope, Opener, parse
from .kms.base import KmsError
from .paths import FieldPath, parse_path
from .records import SAME, encode_headers, write_changed
from .targets import KEY, VALUE, associated_data, path_label

__all__ = ["DecryptionFailed", "OpenerSource", "Selection", "decrypt_batch"]

_TEXT_MAGIC = TEXT_MAGIC.encode()  # how a base64 envelope in a JSON field starts
PAYLOAD = "payload"


class DecryptionFailed(Exception):
    """A part could not be decrypted and the policy is ``fail_fetch``."""


class OpenerSource(Protocol):
    def opener_now(self, envelope: Envelope) -> Opener | None: ...

    async def opener(self, envelope: Envelope) -> Opener: ...


@dataclass(frozen=True, slots=True)
class Selection:
    """What to decrypt per part: None every envelope, else the names listed (``payload``: the
    whole part; JSON field paths; header names)."""

    value: frozenset[str] | None = None
    key: frozenset[str] | None = None
    headers: frozenset[str] | None = None
    fail_fetch: bool = False

    def fields(self, part: str) -> tuple[FieldPath, ...] | None:
        """The listed fields of a part as paths (None: every envelope in it). Raises PathError."""
        names = self.value if part == VALUE else self.key
        return None if names is None else _paths(names)


@functools.cache
def _paths(names: frozenset[str]) -> tuple[FieldPath, ...]:
    return tuple(parse_path(n) for n in sorted(names) if n != PAYLOAD)


#: Called for each part left encrypted (the part's label, the reason): audit and metrics.
OnFailure = Callable[[str, Exception], None]


class _Missing(Exception):
    """The data key of an envelope is not at hand: the KMS must be asked (outside the pass)."""

    def __init__(self, envelope: Envelope) -> None:
        self.envelope = envelope


async def decrypt_batch(
    selection: Selection,
    topic: str,
    batch: RecordBatch,
    openers: OpenerSource,
    failed: OnFailure,
    avro: AvroSchemas | None = None,
) -> tuple[bytes | None, int]:
    """The batch's bytes with what it may decrypt in clear (None: nothing was decrypted), and how
    many parts were decrypted. Raises DecryptionFailed (``fail_fetch``). ``topic``: the name the
    cluster stores the topic under, which the associated data binds."""
    area, start = records_area(batch)
    count = batch.records_count
    spans = record_spans(area, start, count, len(area))
    opening = _Opening(selection, topic.encode(), openers, failed)
    if avro is not None:
        parts: list[bytes | None] = []
        for span in spans:
            if span[8] >= 0 and selection.value != frozenset():
                parts.append(area[span[8] : span[8] + 5])
            if span[6] >= 0 and selection.key != frozenset():
                parts.append(area[span[6] : span[6] + 5])
        opening.avro = avro
        opening.schema_errors = await avro.prepare(framed_ids(parts))
    out = bytearray()
    whole_values = avro is None and (selection.value is None or PAYLOAD in selection.value)
    fields_pass, fields = _compiled_fields(selection, opening) if avro is None else (False, None)
    i = 0
    while i < len(spans):
        fast = opening.fast
        if whole_values and fast is not None and spans[i][8] >= 0 and area.startswith(fast[0], spans[i][8]):
            i = _whole_values(opening, area, spans, i, out)
            if i == len(spans):
                break
        if fields_pass:
            i = _json_fields(opening, area, spans, i, out, fields)
            if i == len(spans):
                break
        mark = len(out)
        try:
            _record(opening, area, spans[i], out)
        except _Missing as missing:
            del out[mark:]
            await opening.fetch(missing.envelope)
            continue  # the same record again, its key at hand (or known to be unusable)
        i += 1
    return (batch.with_records(out, count) if opening.count else None), opening.count


def _whole_values(opening: _Opening, area: bytes, spans: Sequence[RecordSpan], i: int, out: bytearray) -> int:
    """The hot case in one loop: from record ``i``, values that are envelopes under the data key
    just used, in records with nothing else to decrypt. Returns the first record it leaves to the
    general pass (another key, a header, an encrypted key, not an envelope, a failure) or the end."""
    fast = opening.fast
    assert fast is not None
    head, nonce_end, decrypt, codec = fast
    if codec:
        return i
    size = len(head)
    base = b"kanal\x00" + opening.topic + b"\x00" + VALUE.encode()
    no_key, keyed = head + base + b"\x00", head + base + b"\x01"
    keys = opening.selection.key != frozenset()
    headers = opening.selection.headers != frozenset()
    for j in range(i, len(spans)):
        span = spans[j]
        at, end, key = span[8], span[9], span[6]
        if at < 0 or (headers and span[10]) or not area.startswith(head, at):
            return j
        if key < 0:
            aad = no_key
        elif keys and area.startswith(MAGIC, key):
            return j
        else:
            aad = keyed + area[key : span[7]]
        try:
            clear = decrypt(area[at + size : at + nonce_end], area[at + nonce_end : end], aad)
        except DecryptError:
            return j  # (the general pass reports it)
        write_record(out, area, span, clear)
        opening.count += 1
    return len(spans)


def _compiled_fields(selection: Selection, opening: _Opening) -> tuple[bool, tuple[tuple[str | int, ...], ...] | None]:
    """Whether the compiled pass opens the value's fields (not without the module, with no value
    fields selected, or too many), and which: None every envelope, else their steps."""
    if open_json_fields is None or selection.value == frozenset():
        return False, None
    paths = opening.paths[VALUE]
    if paths is None:
        return True, None
    return 0 < len(paths) <= 63, tuple(p.steps for p in paths)


def _json_fields(
    opening: _Opening,
    area: bytes,
    spans: Sequence[RecordSpan],
    i: int,
    out: bytearray,
    fields: tuple[tuple[str | int, ...], ...] | None,
) -> int:
    """From record ``i``, JSON values whose field envelopes open with data keys at hand, each
    written in one compiled call. Returns the first record it leaves to the general pass (a key
    to fetch, an envelope that does not open, an encrypted key or header, not JSON) or the end."""
    selection = opening.selection
    values, opened = open_json_fields(
        area,
        spans,
        i,
        opening.heads,
        b"kanal\x00" + opening.topic + b"\x00",
        VALUE.encode(),
        fields,
        selection.key != frozenset(),
        selection.headers != frozenset(),
    )
    for value in values:
        span = spans[i]
        if value is None:
            out += area[span[0] : span[2]]
        else:
            write_record(out, area, span, value)
        i += 1
    opening.count += opened
    return i


class _Opening:
    """Opens the envelopes of one batch: its data keys, what it decrypted, the failure policy."""

    __slots__ = (
        "avro",
        "broken",
        "count",
        "failed",
        "fast",
        "heads",
        "keys",
        "openers",
        "paths",
        "schema_errors",
        "selection",
        "topic",
    )

    def __init__(self, selection: Selection, topic: bytes, openers: OpenerSource, failed: OnFailure) -> None:
        self.selection = selection
        self.topic = topic
        self.openers = openers
        self.failed = failed
        self.count = 0
        self.keys: dict[tuple[str, bytes], Opener] = {}
        self.broken: dict[tuple[str, bytes], Exception] = {}  # keys the KMS refused in this batch
        self.paths = {VALUE: selection.fields(VALUE), KEY: selection.fields(KEY)}
        #: The last envelope header opened, where its nonce ends, its AEAD and codec: the records of
        #: a batch mostly share one, and then only the nonce and ciphertext need cutting out.
        self.fast: tuple[bytes, int, Callable[[bytes, bytes, bytes], bytes], int] | None = None
        #: The compiled AEAD of each envelope header opened so far (for the compiled field pass).
        self.heads: dict[bytes, Aead] = {}
        self.avro: AvroSchemas | None = None
        self.schema_errors: dict[int, SchemaUnavailable] = {}

    def open(self, data: bytes, label: bytes, identity: bytes | None) -> bytes | None:
        """The clear bytes of an envelope, or None when ``data`` is not one or stays encrypted.
        Raises _Missing when its key must first be fetched."""
        fast = self.fast
        if fast is not None and data.startswith(fast[0]):  # the header of the last one: no parse
            head, nonce_end, decrypt, codec = fast
            try:
                clear = decrypt(
                    data[len(head) : nonce_end], data[nonce_end:], head + associated_data(self.topic, label, identity)
                )
                if codec:
                    clear = _decompress(codec, clear)
            except DecryptError as exc:
                self.refused(label, exc)
                return None
            self.count += 1
            return clear
        try:
            envelope = parse(data)
            if envelope is None:
                return None
            key = (envelope.key_ref, envelope.edek)
            opener = self.keys.get(key)
            if opener is None:
                error = self.broken.get(key)
                if error is not None:
                    raise error
                opener = self.openers.opener_now(envelope)
                if opener is None:
                    raise _Missing(envelope)
                self.keys[key] = opener
            clear = opener.open(envelope, associated_data(self.topic, label, identity))
            head = envelope.header
            cipher = opener.cipher_for(envelope.algorithm)
            self.fast = (head, len(head) + envelope.algorithm.nonce_size, cipher.decrypt, envelope.codec)
            if cipher.aead is not None:
                self.heads[head] = cipher.aead
        except _Missing:
            raise
        except (ValueError, DecryptError, KmsError) as exc:  # (EnvelopeError, a key this gateway cannot reach)
            self.refused(label, exc)
            return None
        self.count += 1
        return clear

    def refused(self, label: bytes, exc: Exception) -> None:
        """A part that does not decrypt: the fetch fails, or the part stays as stored (reported)."""
        if self.selection.fail_fetch:
            raise DecryptionFailed(f"{label.decode('utf-8', 'replace')}: {exc}") from exc
        self.failed(label.decode("utf-8", "replace"), exc)

    async def fetch(self, envelope: Envelope) -> None:
        """Asks the KMS for an envelope's data key; a refusal is kept for the rest of the batch."""
        key = (envelope.key_ref, envelope.edek)
        try:
            self.keys[key] = await self.openers.opener(envelope)
        except (ValueError, KmsError) as exc:
            self.broken[key] = exc


def _record(opening: _Opening, area: bytes, span: RecordSpan, out: bytearray) -> None:
    selection = opening.selection
    key = None if span[6] < 0 else area[span[6] : span[7]]
    value = None if span[8] < 0 else area[span[8] : span[9]]
    consumed: set[bytes] = set()  # headers of Avro fields restored
    new_key: Any = SAME
    if key is not None and selection.key != frozenset():
        clear = _part(opening, KEY, key, None, selection.key, area, span, consumed)
        if clear is not None:
            new_key = clear
    new_value: Any = SAME
    if value is not None and selection.value != frozenset():
        clear = _part(opening, VALUE, value, key, selection.value, area, span, consumed)
        if clear is not None:
            new_value = clear
    headers: Any = SAME
    if span[10] and (selection.headers != frozenset() or consumed):
        headers = _headers(opening, area, span, key, consumed)
    write_changed(out, area, span, new_key, new_value, headers)


def _part(
    opening: _Opening,
    part: str,
    data: bytes,
    identity: bytes | None,
    names: frozenset[str] | None,
    area: bytes = b"",
    span: RecordSpan | None = None,
    consumed: set[bytes] | None = None,
) -> bytes | None:
    """The part in clear (whole, or with its fields), or None when it stays as stored. The headers
    an Avro part's fields were restored from are added to ``consumed``."""
    if data[:3] == MAGIC:
        if names is not None and PAYLOAD not in names:
            return None
        return opening.open(data, part.encode(), identity)
    if opening.avro is not None and data[:1] == b"\x00" and len(data) >= 5:
        return _avro(opening, part, data, identity, area, span, consumed)
    if _TEXT_MAGIC not in data:
        return None  # no field can hold an envelope: not parsed
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    paths = opening.paths[part]
    if paths is None:
        changed = _every_field(opening, document, part, identity)
    else:
        changed = False
        for path in paths:
            found, field = path.get(document)
            if found and isinstance(field, str) and field.startswith(TEXT_MAGIC):
                clear = _field(opening, field, path_label(part, path), identity)
                if clear is not _KEEP:
                    path.set(document, clear)
                    changed = True
    return orjson.dumps(document) if changed else None


_KEEP = object()


def _avro(
    opening: _Opening,
    part: str,
    data: bytes,
    identity: bytes | None,
    area: bytes,
    span: RecordSpan | None,
    consumed: set[bytes] | None,
) -> bytes | None:
    """A Confluent-framed Avro part with its fields' envelopes opened, or None."""
    headers: list[tuple[bytes, bytes | None]] = []
    if span is not None and span[10]:
        prefix = HEADER_PREFIX + part.encode()
        headers = [(n, v) for n, v in record_headers(area, span[9], span[2]) if n.startswith(prefix)]
    if not headers and _TEXT_MAGIC not in data and MAGIC not in data:
        return None  # no field can hold an envelope: not decoded
    schema_id = prefix_ref(data) or 0
    assert opening.avro is not None
    codec = opening.avro.codec(schema_id)
    label = part.encode()
    if codec is None:
        error = opening.schema_errors.get(schema_id)
        opening.refused(label, error or SchemaUnavailable(f"schema id {schema_id} not fetched", retriable=True))
        return None

    def open_(envelope: bytes, field: bytes) -> bytes | None:
        return opening.open(envelope, field, identity)

    try:
        body, restored = decrypt_fields(codec, data[5:], part, opening.paths[part], headers, open_)
    except AvroError as exc:
        opening.refused(label, exc)
        return None
    if body is None:
        return None
    if consumed is not None:
        consumed.update(restored)
    return data[:5] + body


def _decompress(codec: int, data: bytes) -> bytes:
    try:
        return decompress(codec, data)
    except ValueError as exc:
        raise DecryptError(f"the envelope authenticated but does not decompress: {exc}") from None


def _field(opening: _Opening, text: str, label: bytes, identity: bytes | None) -> Any:
    """A field's clear JSON value, or _KEEP."""
    try:
        raw = binascii.a2b_base64(text, strict_mode=True)
    except ValueError:
        return _KEEP
    clear = opening.open(raw, label, identity)
    return _KEEP if clear is None else orjson.loads(clear)


def _every_field(opening: _Opening, node: Any, path: str, identity: bytes | None) -> bool:
    """Decrypts every envelope among the strings of ``node`` in place (labels as the encrypter
    wrote them: ``value.a[0].b``); whether any was."""
    if not isinstance(node, (dict, list)):
        return False
    items: Any = node.items() if isinstance(node, dict) else enumerate(node)
    changed = False
    for step, child in list(items):
        if isinstance(child, str):
            if child.startswith(TEXT_MAGIC):
                label = f"{path}[{step}]" if isinstance(step, int) else f"{path}.{step}"
                clear = _field(opening, child, label.encode(), identity)
                if clear is not _KEEP:
                    node[step] = clear
                    changed = True
        elif isinstance(child, (dict, list)):
            label = f"{path}[{step}]" if isinstance(step, int) else f"{path}.{step}"
            changed = _every_field(opening, child, label, identity) or changed
    return changed


def _headers(opening: _Opening, area: bytes, span: RecordSpan, identity: bytes | None, consumed: set[bytes]) -> Any:
    """The header section with its envelopes opened and the ``consumed`` headers dropped, or SAME.
    (``kanal.enc.*`` headers hold Avro fields' envelopes: they are opened with their fields.)"""
    names = opening.selection.headers
    result: list[tuple[bytes, bytes | None]] = []
    changed = bool(consumed)
    for name, value in record_headers(area, span[9], span[2]):
        if name in consumed:
            continue
        if name.startswith(HEADER_PREFIX) or names == frozenset():
            result.append((name, value))
            continue
        if value is not None and value[:3] == MAGIC and (names is None or name.decode("utf-8", "replace") in names):
            clear = opening.open(value, b"header:" + name, identity)
            if clear is not None:
                result.append((name, clear))
                changed = True
                continue
        result.append((name, value))
    return encode_headers(result) if changed else SAME
