"""Tokenization: JSON fields replaced by tokens of a Vault Transform role, and back.

With a Transform connection (``ENGINE_TYPE=TRANSFORM``) or ``vault-transform://`` key ids, the
encryption interceptor sends field values to Vault and stores what the role gives back (a token,
or a format-preserving ciphertext: a card number stays 16 digits), and the decryption interceptor
sends tokens back for the values. There is no envelope: a token looks like data, so the decrypter
is told which fields hold tokens (the same ``fields`` list, with the same roles).

Vault is called once per role per batch (``batch_input``), and what a role gave for a value is
remembered (bounded), as producers repeat values (a customer's card on every order).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from kanal.api import InterceptorConfigError, RecordBatch, record_spans, records_area, write_record

from .config import PartSpec
from .encrypt import EncryptionFailed
from .kms.connections import KmsConnection
from .kms.factory import KmsPool
from .kms.inline import InlineKmsConfig, resolve_key
from .kms.vault_transform import VaultTransform
from .paths import FieldPath, PathError, parse_path
from .records import SAME, Same, write_parts
from .targets import KEY, VALUE

__all__ = ["TokenField", "Tokenization", "tokenization_of"]

_MEMO = 100_000  # values remembered per role and direction


@dataclass(frozen=True, slots=True)
class TokenField:
    part: str  # VALUE or KEY
    path: FieldPath
    role: str


class _Memo:
    """What a role gave for recent values (an LRU, so repeated values cost no call)."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: OrderedDict[str, str] = OrderedDict()

    def get(self, value: str) -> str | None:
        found = self._items.get(value)
        if found is not None:
            self._items.move_to_end(value)
        return found

    def put(self, value: str, result: str) -> None:
        self._items[value] = result
        if len(self._items) > _MEMO:
            self._items.popitem(last=False)


class Tokenization:
    """The tokenized fields of one interceptor, over one Transform mount."""

    def __init__(self, transform: VaultTransform, fields: Sequence[TokenField]) -> None:
        self.transform = transform
        self.fields = tuple(fields)
        self._memo: dict[tuple[str, bool], _Memo] = {}

    async def aclose(self) -> None:
        await self.transform.aclose()

    async def batch(self, batch: RecordBatch, *, encode: bool) -> bytes | None:
        """The batch with its fields tokenized (``encode``) or restored; None when none was there.
        Raises EncryptionFailed (a value that is not JSON, when encoding) or KmsError."""
        area, start = records_area(batch)
        count = batch.records_count
        spans = record_spans(area, start, count, len(area))
        documents: list[tuple[Any, Any]] = []  # per record: (key document, value document), None: untouched
        wanted: dict[str, set[str]] = {}
        for span in spans:
            documents.append(
                (
                    self._document(area, span[6], span[7], KEY, encode),
                    self._document(area, span[8], span[9], VALUE, encode),
                )
            )
        for key_doc, value_doc in documents:
            for field in self.fields:
                document = key_doc if field.part == KEY else value_doc
                text = _text(field.path, document)
                if text is not None and self._memo_of(field.role, encode).get(text) is None:
                    wanted.setdefault(field.role, set()).add(text)
        for role, values in wanted.items():
            ordered = sorted(values)
            if encode:
                results = await self.transform.encode_batch(role, ordered)
            else:
                results = await self.transform.decode_batch(role, ordered)
            memo = self._memo_of(role, encode)
            for value, result in zip(ordered, results, strict=True):
                memo.put(value, result)
        out = bytearray()
        changed = False
        for span, (key_doc, value_doc) in zip(spans, documents, strict=True):
            key_changed = self._apply(key_doc, KEY, encode)
            value_changed = self._apply(value_doc, VALUE, encode)
            if key_changed:
                new_value: bytes | Same = orjson.dumps(value_doc) if value_changed else SAME
                write_parts(out, area, span, orjson.dumps(key_doc), new_value)
            elif value_changed:
                write_record(out, area, span, orjson.dumps(value_doc))
            else:
                out += area[span[0] : span[2]]
            changed = changed or key_changed or value_changed
        return batch.with_records(out, count) if changed else None

    def _document(self, area: bytes, at: int, end: int, part: str, encode: bool) -> Any:
        if at < 0 or not any(f.part == part for f in self.fields):
            return None
        try:
            return orjson.loads(area[at:end])
        except orjson.JSONDecodeError:
            if encode:
                raise EncryptionFailed(f"the record's {part} is not JSON: its fields cannot be tokenized") from None
            return None  # (what was not tokenized is returned as stored)

    def _apply(self, document: Any, part: str, encode: bool) -> bool:
        changed = False
        for field in self.fields:
            if field.part != part:
                continue
            text = _text(field.path, document)
            if text is None:
                continue
            result = self._memo_of(field.role, encode).get(text)
            if result is not None and result != text:
                field.path.set(document, result)
                changed = True
        return changed

    def _memo_of(self, role: str, encode: bool) -> _Memo:
        memo = self._memo.get((role, encode))
        if memo is None:
            memo = self._memo[(role, encode)] = _Memo()
        return memo


def _text(path: FieldPath, document: Any) -> str | None:
    """The field's value as Transform takes it (text), None when absent, null or not a scalar."""
    if document is None:
        return None
    found, value = path.get(document)
    if not found or value is None or isinstance(value, (dict, list, bool)):
        return None
    return value if isinstance(value, str) else str(value)


def tokenization_of(
    connection: KmsConnection | None,
    inline: InlineKmsConfig | None,
    pool: KmsPool,
    value: PartSpec | None,
    key: PartSpec | None,
) -> Tokenization | None:
    """The tokenization a config asks for (a Transform connection, or ``vault-transform://`` key
    ids), None when it asks for encryption; InterceptorConfigError for what tokenization cannot do."""
    specs = [(part, spec) for part, spec in ((VALUE, value), (KEY, key)) if spec is not None]
    uris = [f.key_secret_id for _, spec in specs for f in spec.fields or () if f.key_secret_id]
    transforming = connection is not None and connection.kind == "vault-transform"
    if not transforming and not any(u.startswith("vault-transform://") for u in uris):
        return None
    transform: VaultTransform | None = None
    fields = []
    for part, spec in specs:
        where = "recordValue" if part == VALUE else "recordKey"
        if spec.payload is not None or not spec.fields:
            raise InterceptorConfigError(f"{where}: tokenization replaces JSON fields: list them in fields")
        for i, field in enumerate(spec.fields):
            at = f"{where}.fields[{i}]"
            try:
                path = parse_path(field.field_name)
            except PathError as exc:
                raise InterceptorConfigError(f"{at}.fieldName: {exc}") from None
            if connection is not None:
                if not field.key_id:
                    raise InterceptorConfigError(f"{at}.keyId: required (the Transform role)")
                client, role = pool.get(connection.kind, connection.settings), field.key_id
            else:
                if not field.key_secret_id or inline is None:
                    raise InterceptorConfigError(
                        f"{at}.keySecretId: required (vault-transform://<host>/<mount>/role/<role>)"
                    )
                client, role = resolve_key(field.key_secret_id, inline, pool, where=f"{at}.keySecretId")
            if not isinstance(client, VaultTransform) or (transform is not None and client is not transform):
                raise InterceptorConfigError(f"{at}: every field must be tokenized by the same Transform mount")
            transform = client
            fields.append(TokenField(part, path, role))
    assert transform is not None
    return Tokenization(transform, fields)
