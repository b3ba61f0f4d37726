"""Schema ids on records, the schema registry behind them, and Avro payloads converted to JSON.

Where a record says which schema its value (or key) was written with (a Confluent wire format prefix,
or a ``__value_schema_id``/``__key_schema_id`` header in any form clients write) is
:mod:`kanal_schemas.framing`'s; a header wins over a prefix, as in confluent-kafka's deserializer.

:class:`SchemaRegistry` resolves ids (``GET /schemas/ids/{id}``) and GUIDs (``GET /schemas/guids/{guid}``)
through the shared :class:`kanal_schemas.SchemaRegistryClient`: a bounded LRU cache of schemas, a short
negative cache of unknown ids, and a shorter one of failed lookups (an unreachable registry is retried
after a second, never treated as a pass). Lookups are async and happen before the record loop, once per
batch, for the ids the cache lacks; the loop reads the cache synchronously (:meth:`SchemaRegistry.cached`).

Conversion. CEL and JSON schema rules see the JSON form of an Avro value: records become objects,
unions their plain value, enums strings, ``bytes`` and ``fixed`` strings (one character per byte,
as Avro's JSON encoding does), logical types their underlying value (a ``timestamp-millis`` stays
a number), maps objects, arrays lists. Schemas with references are parsed with the referenced
schemas (fetched by subject and version).
"""

from __future__ import annotations

import io
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import fastavro
import orjson
from kanal_schemas import (
    AVRO,
    KEY_HEADER,
    VALUE_HEADER,
    RegistryError,
    Schema,
    SchemaNotFound,
    SchemaRef,
    SchemaRegistryClient,
    describe_ref,
    header_ref,
    prefix_ref,
)

__all__ = [
    "AVRO",
    "KEY_HEADER",
    "VALUE_HEADER",
    "SchemaInfo",
    "SchemaRef",
    "SchemaRegistry",
    "avro_reader",
    "describe_ref",
    "header_ref",
    "prefix_ref",
    "to_json",
]


# -- conversion to JSON -------------------------------------------------------------------------


def _strip_logical(schema: Any) -> Any:
    """The schema without ``logicalType`` annotations: values keep their underlying Avro type."""
    if isinstance(schema, dict):
        return {k: _strip_logical(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [_strip_logical(v) for v in schema]
    return schema


def to_json(value: Any) -> Any:
    """A decoded Avro value in its JSON form (bytes become one character per byte)."""
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, tuple):  # a named union branch (not produced with the default options)
        return to_json(value[1])
    return value


def _has_bytes(schema: Any) -> bool:
    """Whether values of the schema can hold bytes or fixed (which need converting)."""
    text = orjson.dumps(schema)
    return b'"bytes"' in text or b'"fixed"' in text


def avro_reader(schema_text: str, named: Sequence[str] = ()) -> Callable[[bytes], Any]:
    """A function decoding an Avro body written with this schema into its JSON form (``named``: the
    texts of the schemas it references, each before those that use it)."""
    named_schemas: dict[str, Any] = {}
    for text in named:
        fastavro.parse_schema(_strip_logical(orjson.loads(text)), named_schemas=named_schemas)
    parsed = fastavro.parse_schema(_strip_logical(orjson.loads(schema_text)), named_schemas=named_schemas)
    read = fastavro.schemaless_reader
    if _has_bytes(parsed) or any(_has_bytes(orjson.loads(text)) for text in named):

        def decode(body: bytes) -> Any:
            return to_json(read(io.BytesIO(body), parsed, None))

        return decode

    def decode_plain(body: bytes) -> Any:
        return read(io.BytesIO(body), parsed, None)

    return decode_plain


# -- the registry -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SchemaInfo:
    """What the registry says about one schema reference.

    ``error`` set: the lookup failed (``unreachable`` True: the registry could not answer; else the
    reference is unknown). Otherwise ``schema_type`` is AVRO, JSON or PROTOBUF, and ``decode``
    converts a body to JSON (Avro only; None when the schema does not parse).
    """

    ref: SchemaRef
    schema_type: str | None
    decode: Callable[[bytes], Any] | None
    error: str | None = None
    unreachable: bool = False


_INFO = "kanal_dataquality.info"  # the key of a schema's SchemaInfo in its memo


def _found(ref: SchemaRef, schema: Schema, named: Sequence[Schema] | None) -> SchemaInfo:
    """The info of a found schema (``named``: its references, None when they could not be fetched)."""
    decode = None
    if schema.schema_type == AVRO and (named is not None or not schema.references):
        try:
            decode = avro_reader(schema.text, [n.text for n in named or ()])
        except Exception:  # a schema fastavro cannot parse: the id still exists and is Avro
            decode = None
    return SchemaInfo(ref, schema.schema_type, decode)


def _failed(ref: SchemaRef, exc: RegistryError) -> SchemaInfo:
    if isinstance(exc, SchemaNotFound):
        return SchemaInfo(ref, None, None, f"{describe_ref(ref)} is not in the schema registry")
    return SchemaInfo(ref, None, None, f"schema registry unreachable: {exc.message}", True)


class SchemaRegistry:
    """Schema lookups against a registry with the common REST API, cached (by the shared client)."""

    def __init__(
        self,
        url: str,
        *,
        user_info: str | None = None,
        timeout: float = 5.0,
        cache_size: int = 1000,
        negative_ttl: float = 5.0,
        failure_ttl: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url.rstrip("/")
        self.client = SchemaRegistryClient(
            self.url,
            user_info=user_info,
            timeout=timeout,
            cache_size=cache_size,
            negative_ttl=negative_ttl,
            failure_ttl=min(failure_ttl, negative_ttl),
            clock=clock,
        )
        # the info of each error the client holds (gone with the error)
        self._errors: weakref.WeakKeyDictionary[RegistryError, SchemaInfo] = weakref.WeakKeyDictionary()

    @property
    def lookups(self) -> int:
        """Calls made to the registry (tests and metrics)."""
        return self.client.lookups

    def cached(self, ref: SchemaRef) -> SchemaInfo | None:
        """The cached answer for ``ref`` if it is still valid (sync: used in the record loop)."""
        entry = self.client.cached(ref)
        if entry is None:
            return None
        if isinstance(entry, Schema):
            info: SchemaInfo | None = entry.memoized(_INFO)
            if info is None:
                if entry.references and entry.schema_type == AVRO:
                    return None  # its references are being fetched (by _load)
                info = entry.memo(_INFO, lambda schema: _found(ref, schema, ()))
            return info
        info = self._errors.get(entry)
        if info is None:
            info = self._errors[entry] = _failed(ref, entry)
        return info

    def missing(self, refs: Iterable[SchemaRef]) -> set[SchemaRef]:
        return {ref for ref in refs if self.cached(ref) is None}

    async def resolve(self, refs: Iterable[SchemaRef]) -> None:
        """Looks up every reference the cache lacks (one call each, and one per referenced schema)."""
        for ref in self.missing(refs):
            await self._load(ref)

    async def get(self, ref: SchemaRef) -> SchemaInfo:
        info = self.cached(ref)
        if info is None:
            info = await self._load(ref)
        return info

    async def _load(self, ref: SchemaRef) -> SchemaInfo:
        try:
            schema = await self.client.schema(ref)
        except RegistryError as exc:
            info = self._errors[exc] = _failed(ref, exc)
            return info
        named: list[Schema] | None = None
        if schema.references and schema.schema_type == AVRO:
            try:
                named = await self.client.references(schema)
            except RegistryError:
                named = None  # decoded as bytes, as a schema that does not parse
        return schema.memo(_INFO, lambda s: _found(ref, s, named))

    async def aclose(self) -> None:
        await self.client.aclose()
