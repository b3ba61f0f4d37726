"""Encrypting the records of one produced batch.

One pass over the core's record walk (``record_spans``), the record written from its original bytes
with the encrypted parts (``write_record`` when only the value changes); the batch is framed again
by ``RecordBatch.with_records`` (codec and CRC). Data keys come from a :class:`KeySource` (the DEK
cache): a key id without a template is looked up once per batch, templated ones once per distinct
key id in the batch, before the pass, so the pass itself never waits. With a schema registry
(:class:`~kanal_encryption.avro_fields.AvroSchemas`), the writer schemas of the Confluent-framed
Avro parts whose fields are listed are fetched before the pass too, once per schema id.
"""

from __future__ import annotations

import binascii
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from kanal_schemas import prefix_ref

from kanal.api import RecordBatch, RecordSpan, record_headers, record_spans, records_area, write_record

from .avro_fields import AvroError, AvroSchemas, SealedAlready, encrypt_fields, framed_ids
from .crypto.ciphers import COMPILED, Algorithm, seal_json_fields
from .crypto.envelope import TEXT_MAGIC, EnvelopeError, Sealer, is_envelope, parse
from .records import SAME, encode_headers, write_changed
from .targets import VALUE, Target, associated_data
from .templates import RecordView, TemplateError

__all__ = ["AlreadyEncrypted", "EncryptionFailed", "KeySource", "Plan", "encrypt_batch"]


class EncryptionFailed(Exception):
    """A record cannot be encrypted as configured (not JSON, a template's part missing): the
    partition fails, nothing of it is stored."""


class AlreadyEncrypted(EncryptionFailed):
    """A part is already an envelope and the policy is ``fail_on_encrypted``."""


#: The sealers of a batch: by (target, key id), and for templated targets by (target, record start).
Sealers = dict[tuple[Target, str | int], Sealer]


class KeySource(Protocol):
    def sealer_now(self, target: Target, key_id: str, records: int) -> Sealer | None: ...

    async def sealer(self, target: Target, key_id: str, records: int) -> Sealer: ...


@dataclass(frozen=True, slots=True)
class Plan:
    """The targets of one interceptor, by part; ``codec``: compress-then-encrypt for payloads."""

    key_payload: Target | None
    key_fields: tuple[Target, ...]
    value_payload: Target | None
    value_fields: tuple[Target, ...]
    header_payload: Target | None
    header_fields: tuple[Target, ...]
    codec: int
    skip_encrypted: bool
    #: Only value fields, under constant key ids, none inside another, by an algorithm the compiled
    #: module has: the batch's JSON values are sealed by one compiled call (:func:`_splice`).
    splice: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "splice", _spliceable(self))

    @property
    def targets(self) -> tuple[Target, ...]:
        one = (self.key_payload, self.value_payload, self.header_payload)
        return (*self.key_fields, *self.value_fields, *self.header_fields, *(t for t in one if t is not None))

    @property
    def value_only(self) -> bool:
        return self.value_payload is not None and self.targets == (self.value_payload,)


async def encrypt_batch(
    plan: Plan,
    topic: str,
    batch: RecordBatch,
    keys: KeySource,
    avro: AvroSchemas | None = None,
    *,
    stored_topic: str | None = None,
) -> bytes:
    """The batch's bytes with its records encrypted. Raises EncryptionFailed, the KMS's error, or
    SchemaUnavailable (the schema of an Avro part cannot be had).

    Key templates see ``topic`` as the client named it; the associated data binds ``stored_topic``,
    the name on the cluster (default ``topic``), which every client reading the records shares."""
    area, start = records_area(batch)
    count = batch.records_count
    spans = record_spans(area, start, count, len(area))
    topic_b = (stored_topic or topic).encode()
    out = bytearray()
    if avro is not None and (plan.value_fields or plan.key_fields):
        await _schemas(plan, area, spans, avro)
    else:
        avro = None
    try:
        sealers = await _sealers(plan, topic, area, spans, keys, avro)
        payload = plan.value_payload
        if plan.splice:
            _splice(plan, topic_b, area, spans, sealers, out, avro)
        elif plan.value_only and payload is not None and payload.template.constant is not None:
            _values(plan, topic_b, area, spans, sealers[(payload, payload.template.constant)], out)
        else:
            for span in spans:
                _record(plan, topic_b, area, span, sealers, out, avro)
    except TemplateError as exc:
        raise EncryptionFailed(f"a key id cannot be made for a record: {exc}") from None
    return batch.with_records(out, count)


async def _schemas(plan: Plan, area: bytes, spans: Sequence[RecordSpan], avro: AvroSchemas) -> None:
    """Fetches the schemas of the batch's framed parts whose fields are listed; raises the first
    SchemaUnavailable (the partition fails: retriably while the registry is away)."""
    parts: list[bytes | None] = []
    for span in spans:
        if plan.value_fields and span[8] >= 0:
            parts.append(area[span[8] : span[8] + 5])
        if plan.key_fields and span[6] >= 0:
            parts.append(area[span[6] : span[6] + 5])
    failed = await avro.prepare(framed_ids(parts))
    if failed:
        raise failed[min(failed)]


async def _sealers(
    plan: Plan, topic: str, area: bytes, spans: Sequence[RecordSpan], keys: KeySource, avro: AvroSchemas | None = None
) -> Sealers:
    """A sealer per (target, key id) the batch needs, each reserving as many seals as records; for
    a templated target also per (target, record start), so its template is rendered once."""
    wanted: dict[tuple[Target, str], int] = {}
    rendered: list[tuple[Target, int, str]] = []
    for target in plan.targets:
        constant = target.template.constant
        if constant is not None:
            wanted[(target, constant)] = len(spans)
            continue
        for span in spans:
            key_id = target.template.render(_view(topic, area, span, target, avro))
            wanted[(target, key_id)] = wanted.get((target, key_id), 0) + 1
            rendered.append((target, span[0], key_id))
    sealers: Sealers = {}
    for (target, key_id), records in wanted.items():
        sealer = keys.sealer_now(target, key_id, records)
        sealers[(target, key_id)] = sealer if sealer is not None else await keys.sealer(target, key_id, records)
    for target, start, key_id in rendered:
        sealers[(target, start)] = sealers[(target, key_id)]
    return sealers


def _view(topic: str, area: bytes, span: RecordSpan, target: Target, avro: AvroSchemas | None = None) -> RecordView:
    """What ``target``'s template reads of a record (the value parsed only when it reads fields:
    JSON, or Avro decoded with its schema)."""
    template = target.template
    key = None if span[6] < 0 else area[span[6] : span[7]]
    headers: dict[str, bytes | None] = {}
    if template.headers:
        headers = {k.decode("utf-8", "replace"): v for k, v in record_headers(area, span[9], span[2])}
    value = None
    if template.value_paths:
        raw = None if span[8] < 0 else area[span[8] : span[9]]
        codec = None if avro is None or raw is None or raw[:1] != b"\x00" else avro.codec(prefix_ref(raw) or 0)
        try:
            if codec is not None and raw is not None:
                value = codec.decode(raw[5:])
            else:
                value = None if raw is None else orjson.loads(raw)
        except AvroError as exc:
            raise EncryptionFailed(f"key id {template.text!r} reads the value, which does not decode: {exc}") from None
        except orjson.JSONDecodeError:
            raise EncryptionFailed(f"key id {template.text!r} reads the value, which is not JSON") from None
    return RecordView(topic, key, headers, value)


def _values(plan: Plan, topic: bytes, area: bytes, spans: Sequence[RecordSpan], sealer: Sealer, out: bytearray) -> None:
    """The hot case: whole values under one key, each record written by the compiled walk."""
    seal, codec, skip = sealer.seal, plan.codec, plan.skip_encrypted
    label = b"kanal\x00" + topic + b"\x00" + VALUE.encode()
    no_key = label + b"\x00"
    keyed = label + b"\x01"
    for span in spans:
        at, end = span[8], span[9]
        if at < 0:  # a tombstone stays one
            out += area[span[0] : span[2]]
            continue
        value = area[at:end]
        if _encrypted(value):
            if skip:
                out += area[span[0] : span[2]]
                continue
            raise AlreadyEncrypted("the record's value is already encrypted")
        aad = no_key if span[6] < 0 else keyed + area[span[6] : span[7]]
        write_record(out, area, span, seal(value, aad, codec))


def _spliceable(plan: Plan) -> bool:
    fields = plan.value_fields
    if not COMPILED or not fields or len(fields) > 63 or plan.targets != fields:
        return False
    steps = [t.path.steps for t in fields if t.path is not None]
    return (
        len(steps) == len(fields)
        and all(t.template.constant is not None and t.algorithm is not Algorithm.XCHACHA20_POLY1305 for t in fields)
        and not any(a[: len(b)] == b for i, a in enumerate(steps) for j, b in enumerate(steps) if i != j)
    )


def _splice(
    plan: Plan,
    topic_b: bytes,
    area: bytes,
    spans: Sequence[RecordSpan],
    sealers: Sealers,
    out: bytearray,
    avro: AvroSchemas | None,
) -> None:
    """The batch's JSON values with their fields sealed by the compiled scan, which leaves to
    :func:`_record` the values it does not decide (not JSON as it reads it, Avro, a field already
    an envelope)."""
    fields = []
    for target in plan.value_fields:
        sealer = sealers[(target, target.template.constant or "")]
        assert target.path is not None and sealer.aead is not None
        fields.append((target.path.steps, sealer.aead, sealer.text_header, _prefix(topic_b, target)))
    sealed = seal_json_fields(area, spans, tuple(fields))
    for span, value in zip(spans, sealed, strict=True):
        if value is None:
            out += area[span[0] : span[2]]
        elif value is ...:
            _record(plan, topic_b, area, span, sealers, out, avro)
        else:
            write_record(out, area, span, value)


def _record(
    plan: Plan,
    topic_b: bytes,
    area: bytes,
    span: RecordSpan,
    sealers: Sealers,
    out: bytearray,
    avro: AvroSchemas | None = None,
) -> None:
    """One record, any targets: the key first (the others are bound to the key as stored)."""
    key = None if span[6] < 0 else area[span[6] : span[7]]
    value = None if span[8] < 0 else area[span[8] : span[9]]
    added: list[tuple[bytes, bytes]] = []  # envelopes of Avro fields carried in headers
    new_key: Any = SAME
    if key is not None and (plan.key_payload is not None or plan.key_fields):
        stored = _part(plan, topic_b, area, span, key, None, plan.key_payload, plan.key_fields, sealers, avro, added)
        if stored is not None:
            new_key = key = stored
    new_value: Any = SAME
    if value is not None and (plan.value_payload is not None or plan.value_fields):
        stored = _part(
            plan, topic_b, area, span, value, key, plan.value_payload, plan.value_fields, sealers, avro, added
        )
        if stored is not None:
            new_value = stored
    headers: Any = SAME
    if plan.header_payload is not None or plan.header_fields:
        headers = _headers(plan, topic_b, area, span, key, sealers)
    if added:
        kept = record_headers(area, span[9], span[2]) if headers is SAME else headers
        names = {name for name, _ in added}
        headers = encode_headers([*((n, v) for n, v in kept if n not in names), *added])
    elif headers is not SAME:
        headers = encode_headers(headers)
    write_changed(out, area, span, new_key, new_value, headers)


def _sealer(target: Target, span: RecordSpan, sealers: Sealers) -> Sealer:
    constant = target.template.constant
    return sealers[(target, constant if constant is not None else span[0])]


def _part(
    plan: Plan,
    topic_b: bytes,
    area: bytes,
    span: RecordSpan,
    data: bytes,
    identity: bytes | None,
    payload: Target | None,
    fields: Sequence[Target],
    sealers: Sealers,
    avro: AvroSchemas | None = None,
    added: list[tuple[bytes, bytes]] | None = None,
) -> bytes | None:
    """The part (key or value) as stored, or None when it stays as it is. An Avro part's fields
    that are not strings or bytes leave their envelopes in ``added`` (headers to write)."""
    if payload is not None:
        if _encrypted(data):
            if plan.skip_encrypted:
                return None
            raise AlreadyEncrypted(f"the record's {payload.part} is already encrypted")
        aad = associated_data(topic_b, payload.label, identity)
        return _sealer(payload, span, sealers).seal(data, aad, plan.codec)
    bound = b"\x00" if identity is None else b"\x01" + identity
    if avro is not None and data[:1] == b"\x00" and len(data) >= 5:
        return _avro(plan, topic_b, area, span, data, bound, fields, sealers, avro, added)
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise EncryptionFailed(f"the record's {fields[0].part} is not JSON: its fields cannot be encrypted") from None
    changed = False
    for target in fields:
        path = target.path
        assert path is not None
        found, field = path.get(document)
        if not found:
            continue  # a record without the field has nothing to hide there
        if isinstance(field, str) and field.startswith(TEXT_MAGIC) and _is_envelope_text(field):
            if plan.skip_encrypted:
                continue
            raise AlreadyEncrypted(f"the field {path.text!r} is already encrypted")
        aad = _prefix(topic_b, target) + bound
        path.set(document, _sealer(target, span, sealers).seal_text(orjson.dumps(field), aad))
        changed = True
    return orjson.dumps(document) if changed else None


def _avro(
    plan: Plan,
    topic_b: bytes,
    area: bytes,
    span: RecordSpan,
    data: bytes,
    bound: bytes,
    fields: Sequence[Target],
    sealers: Sealers,
    avro: AvroSchemas,
    added: list[tuple[bytes, bytes]] | None,
) -> bytes | None:
    """A Confluent-framed Avro part with its fields sealed, framed with the same schema id."""
    schema_id = prefix_ref(data) or 0
    codec = avro.codec(schema_id)
    part = fields[0].part
    if codec is None:  # (fetched before the pass, or the batch failed)
        raise EncryptionFailed(f"the record's {part} names schema id {schema_id}, which was not fetched")

    def seal(target: Target, clear: bytes) -> bytes:
        return _sealer(target, span, sealers).seal(clear, _prefix(topic_b, target) + bound)

    present: dict[bytes, bytes | None] = {}
    if span[10]:
        present = dict(record_headers(area, span[9], span[2]))
    wanted = [(t.path, t.label, t) for t in fields if t.path is not None]
    try:
        body, headers = encrypt_fields(codec, data[5:], wanted, seal, present, plan.skip_encrypted)
    except AvroError as exc:
        raise EncryptionFailed(f"the record's {part} cannot be encrypted field by field: {exc}") from None
    except SealedAlready as exc:
        raise AlreadyEncrypted(f"the field {exc.path!r} is already encrypted") from None
    if body is None:
        return None
    if headers:
        if added is None:
            raise EncryptionFailed(f"the record's {part} has fields whose envelopes need headers")
        added.extend(headers)
    return data[:5] + body


_PREFIXES: dict[tuple[bytes, bytes], bytes] = {}


def _prefix(topic: bytes, target: Target) -> bytes:
    """:func:`associated_data` up to the identity, remembered per topic and label."""
    key = (topic, target.label)
    found = _PREFIXES.get(key)
    if found is None:
        if len(_PREFIXES) > 10_000:
            _PREFIXES.clear()
        found = _PREFIXES[key] = associated_data(topic, target.label, None)[:-1]
    return found


def _headers(
    plan: Plan, topic_b: bytes, area: bytes, span: RecordSpan, identity: bytes | None, sealers: Sealers
) -> Any:
    """The headers with the matching ones encrypted (a list, for :func:`encode_headers`), or SAME."""
    headers = record_headers(area, span[9], span[2])
    named = {t.label[len(b"header:") :]: t for t in plan.header_fields}
    payload = plan.header_payload
    changed = False
    result = []
    for name, value in headers:
        target = named.get(name)
        pattern = payload.header if payload is not None else None
        if target is None and pattern is not None and pattern.fullmatch(name.decode("utf-8", "replace")):
            target = payload
        if target is None or value is None:
            result.append((name, value))
            continue
        if _encrypted(value):
            if plan.skip_encrypted:
                result.append((name, value))
                continue
            raise AlreadyEncrypted(f"the header {name.decode('utf-8', 'replace')!r} is already encrypted")
        aad = associated_data(topic_b, b"header:" + name, identity)
        result.append((name, _sealer(target, span, sealers).seal(value, aad, 0)))
        changed = True
    return result if changed else SAME


def _encrypted(data: bytes) -> bool:
    """Whether a part already holds an envelope (clear bytes may begin with the magic too)."""
    if not is_envelope(data):
        return False
    try:
        return parse(data) is not None
    except EnvelopeError:
        return False


def _is_envelope_text(text: str) -> bool:
    try:
        return _encrypted(binascii.a2b_base64(text, strict_mode=True))
    except ValueError:
        return False
