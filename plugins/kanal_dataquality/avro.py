"""Schema ids on records, the schema registry behind them, and Avro payloads converted to JSON.

Where a record says which schema its value (or key) was written with:

* a prefix of the payload: magic byte ``0`` then the id as a 4-byte big-endian integer (the Confluent
  wire format); the Avro body follows;
* a record header, ``__value_schema_id`` (``__key_schema_id`` for the key), in any of the forms
  clients write: magic byte ``1`` and a 16-byte GUID (confluent-kafka's header serializer), magic
  byte ``0`` and a 4-byte id, a bare 16-byte GUID, a bare 4-byte id, or the id or GUID as text. The
  payload is then the Avro body alone. A header wins over a prefix, as in confluent-kafka's
  deserializer.

:class:`SchemaRegistry` resolves ids (``GET /schemas/ids/{id}``) and GUIDs (``GET /schemas/guids/{guid}``)
with a bounded LRU cache of schemas, a short negative cache of unknown ids, and a shorter one of
failed lookups (an unreachable registry is retried after a second, never treated as a pass). Lookups
are async and happen before the record loop, once per batch, for the ids the cache lacks.

Conversion. CEL and JSON schema rules see the JSON form of an Avro value: records become objects,
unions their plain value, enums strings, ``bytes`` and ``fixed`` strings (one character per byte,
as Avro's JSON encoding does), logical types their underlying value (a ``timestamp-millis`` stays
a number), maps objects, arrays lists.
"""

from __future__ import annotations

import io
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import fastavro
import orjson

from kanal_dataquality.http import HttpError, request

__all__ = [
    "AVRO",
    "KEY_HEADER",
    "VALUE_HEADER",
    "SchemaInfo",
    "SchemaRef",
    "SchemaRegistry",
    "avro_reader",
    "header_ref",
    "prefix_ref",
    "to_json",
]

AVRO = "AVRO"
VALUE_HEADER = "__value_schema_id"
KEY_HEADER = "__key_schema_id"

SchemaRef = int | str  # an integer id, or a GUID in canonical text form


def prefix_ref(payload: bytes | None) -> int | None:
    """The schema id of a payload in the Confluent wire format (magic 0 + 4-byte id), else None."""
    if payload is None or len(payload) < 5 or payload[0] != 0:
        return None
    return int.from_bytes(payload[1:5], "big")


def header_ref(raw: bytes | None) -> SchemaRef | None:
    """The schema reference a ``__value_schema_id``/``__key_schema_id`` header value holds, else None."""
    if raw is None:
        return None
    n = len(raw)
    if n >= 17 and raw[0] == 1:
        return str(uuid.UUID(bytes=bytes(raw[1:17])))
    if n == 5 and raw[0] == 0:
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
    return f"schema id {ref}" if isinstance(ref, int) else f"schema GUID {ref}"


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


def avro_reader(schema_text: str) -> Callable[[bytes], Any]:
    """A function decoding an Avro body written with this schema into its JSON form."""
    parsed = fastavro.parse_schema(_strip_logical(orjson.loads(schema_text)))
    read = fastavro.schemaless_reader
    if _has_bytes(parsed):

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
    expires: float = float("inf")


class SchemaRegistry:
    """Schema lookups against a registry with the common REST API, cached."""

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
        self.timeout = timeout
        self.cache_size = cache_size
        self.negative_ttl = negative_ttl
        self.failure_ttl = min(failure_ttl, negative_ttl)
        self.clock = clock
        self._cache: OrderedDict[SchemaRef, SchemaInfo] = OrderedDict()
        self._headers = {"Accept": "application/vnd.schemaregistry.v1+json, application/json"}
        if user_info:
            import base64

            self._headers["Authorization"] = "Basic " + base64.b64encode(user_info.encode()).decode()
        self.lookups = 0  # calls made to the registry (tests and metrics)

    def cached(self, ref: SchemaRef) -> SchemaInfo | None:
        """The cached answer for ``ref`` if it is still valid (sync: used in the record loop)."""
        info = self._cache.get(ref)
        if info is None:
            return None
        if info.expires <= self.clock():
            del self._cache[ref]
            return None
        return info

    def missing(self, refs: Iterable[SchemaRef]) -> set[SchemaRef]:
        return {ref for ref in refs if self.cached(ref) is None}

    async def resolve(self, refs: Iterable[SchemaRef]) -> None:
        """Looks up every reference the cache lacks (one call each)."""
        for ref in self.missing(refs):
            self._store(await self._fetch(ref))

    async def get(self, ref: SchemaRef) -> SchemaInfo:
        info = self.cached(ref)
        if info is None:
            info = await self._fetch(ref)
            self._store(info)
        return info

    def _store(self, info: SchemaInfo) -> None:
        cache = self._cache
        cache[info.ref] = info
        cache.move_to_end(info.ref)
        while len(cache) > self.cache_size:
            cache.popitem(last=False)

    async def _fetch(self, ref: SchemaRef) -> SchemaInfo:
        self.lookups += 1
        path = f"/schemas/ids/{ref}" if isinstance(ref, int) else f"/schemas/guids/{ref}"
        now = self.clock()
        try:
            response = await request("GET", self.url + path, headers=self._headers, timeout=self.timeout)
        except HttpError as exc:
            return SchemaInfo(ref, None, None, f"schema registry unreachable: {exc}", True, now + self.failure_ttl)
        if response.status == 404:
            return SchemaInfo(
                ref, None, None, f"{describe_ref(ref)} is not in the schema registry", False, now + self.negative_ttl
            )
        if response.status != 200:
            text = response.body[:200].decode("utf-8", "replace")
            return SchemaInfo(
                ref,
                None,
                None,
                f"schema registry unreachable: HTTP {response.status} for {describe_ref(ref)}: {text}",
                True,
                now + self.failure_ttl,
            )
        try:
            document = orjson.loads(response.body)
            schema_type = str(document.get("schemaType") or AVRO).upper()
            schema_text = document.get("schema")
        except (orjson.JSONDecodeError, AttributeError):
            return SchemaInfo(
                ref, None, None, "schema registry unreachable: the answer is not JSON", True, now + self.failure_ttl
            )
        decode = None
        if schema_type == AVRO and isinstance(schema_text, str):
            try:
                decode = avro_reader(schema_text)
            except Exception:  # a schema fastavro cannot parse: the id still exists and is Avro
                decode = None
        return SchemaInfo(ref, schema_type, decode)
