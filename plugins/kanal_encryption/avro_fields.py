"""Encrypting named fields of Avro records (Confluent framing, a schema registry), keeping them Avro.

A part (value or key) that starts with the Confluent magic byte 0 and a 4-byte schema id, on an
interceptor with a schema registry, is decoded with the writer schema of that id (fetched once per
id and kept: an id names one schema for good), its fields located by the same paths as JSON fields
(``a.b.c``, ``list[0].x``: record fields and map keys by name, array items by index), each field's
value sealed, and the record encoded again with the same schema and framed with the same id, so
registry-aware consumers still decode it.

What is sealed is the field's Avro binary encoding under its own (writer) schema, so it comes back
exactly, unions and all. What the field holds then depends on its type:

* ``string`` (or a union with a ``string`` branch): the envelope as base64 text (``/KNL...``), as
  for JSON fields;
* ``bytes`` (or a union with ``bytes`` and no ``string``): the envelope bytes;
* any other type: a placeholder (null for a union with ``null``; else the type's minimum value:
  ``int`` -2^31, ``long`` -2^63, ``float`` 1.4e-45 and ``double`` 4.9e-324 (Java's MIN_VALUE),
  ``false``, an enum's first symbol, a zero ``fixed``, an empty array or map, a record of
  placeholders), and the envelope in a record header named ``kanal.enc.<label>``
  (``kanal.enc.value.amount``, ``kanal.enc.value.items[0].price``; the label is the field's
  associated data label, :func:`~kanal_encryption.targets.path_label`).

Logical types are read as their underlying types (a decimal as its bytes, a date as its int), so
what is not encrypted is written back bit for bit. The decrypter finds string and bytes envelopes by
their magic, and header-carried ones by the header name, restores the values, drops those headers
and encodes the record again.

The registry side: :class:`AvroSchemas` (one per interceptor) fetches the schemas of the ids a batch
names before the synchronous pass over its records, and :func:`registry_client` builds the client
from a schema registry external connection (``GATEWAY_EXTERNAL_CONNECTION_<NAME>_CONFIG_URL``...)
or an inline ``schemaRegistryConfig`` block.
"""

from __future__ import annotations

import binascii
import io
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from difflib import get_close_matches
from typing import Any, Final

import fastavro
from kanal_schemas import (
    AVRO,
    RegistryError,
    RegistryUnavailable,
    SchemaNotFound,
    SchemaRegistryClient,
    TlsSettings,
    prefix_ref,
)

from kanal.api import (
    EXTERNAL_CONNECTION_PREFIX,
    ConfigError,
    ExternalConnection,
    FamilyCheck,
    InterceptorConfigError,
    external_connections,
)

from .crypto.envelope import MAGIC, TEXT_MAGIC, EnvelopeError, parse, to_text
from .paths import FieldPath, PathError, parse_path
from .targets import path_label

__all__ = [
    "HEADER_PREFIX",
    "AvroCodec",
    "AvroError",
    "AvroSchemas",
    "SchemaUnavailable",
    "SealedAlready",
    "check_registry_connections",
    "decrypt_fields",
    "encrypt_fields",
    "framed_ids",
    "header_name",
    "registry_client",
]

#: Record headers carrying the envelopes of non-string fields: ``kanal.enc.<label>``.
HEADER_PREFIX: Final = b"kanal.enc."
_SLOT: Final = "kanal_encryption_slot"
_INT_MIN: Final = -(2**31)
_LONG_MIN: Final = -(2**63)
_FLOAT_MIN: Final = 1.4e-45  # Java's Float.MIN_VALUE
_DOUBLE_MIN: Final = 4.9e-324  # Java's Double.MIN_VALUE


class AvroError(ValueError):
    """A value that does not decode with its schema, or a record that cannot be encoded again."""


class SchemaUnavailable(Exception):
    """The schema of an id cannot be had now: the registry is unreachable or answers errors
    (``retriable``), or it does not know the id, or the schema is not Avro (not retriable)."""

    def __init__(self, message: str, *, retriable: bool) -> None:
        super().__init__(message)
        self.retriable = retriable


class SealedAlready(Exception):
    """A field already holds an envelope (and the policy is not to skip it)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def header_name(label: bytes) -> bytes:
    """The header carrying the envelope of the field labelled ``label`` (``value.amount``)."""
    return HEADER_PREFIX + label


def framed_ids(parts: Iterable[bytes | None]) -> set[int]:
    """The schema ids of the parts in the Confluent wire format."""
    ids = set()
    for data in parts:
        found = prefix_ref(data)
        if found is not None:
            ids.add(found)
    return ids


# -- schemas ------------------------------------------------------------------------------------------


def _plain(node: Any) -> Any:
    """A schema's JSON without logical types (their underlying types are read and written as is)."""
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items() if k != "logicalType"}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        kind = schema.get("type")
        return kind if isinstance(kind, str) else "union"
    return str(schema)


class AvroCodec:
    """One writer schema: decodes and encodes records, locates fields, seals and restores them."""

    def __init__(self, schema_id: int, text: str, references: Sequence[str] = ()) -> None:
        self.schema_id = schema_id
        self.named: dict[str, Any] = {}
        try:
            for ref in references:
                fastavro.parse_schema(_plain(json.loads(ref)), named_schemas=self.named)
            self.schema = fastavro.parse_schema(_plain(json.loads(text)), named_schemas=self.named)
        except (ValueError, KeyError, TypeError, fastavro.schema.SchemaParseException) as exc:
            raise AvroError(f"schema id {schema_id} is not a usable Avro schema: {exc}") from None
        self._slots: dict[int, tuple[Any, Any]] = {}  # id(slot schema) -> (it, its wrapper record)

    def _resolve(self, schema: Any) -> Any:
        seen = 0
        while isinstance(schema, str) and schema in self.named and seen < 100:
            schema = self.named[schema]
            seen += 1
        if isinstance(schema, dict) and schema.get("type") in self.named and len(schema) == 1:
            return self._resolve(schema["type"])
        return schema

    def decode(self, body: bytes) -> Any:
        buffer = io.BytesIO(body)
        try:
            value = fastavro.schemaless_reader(buffer, self.schema, None, return_record_name=True)
        except Exception as exc:  # (fastavro raises anything on bytes that are not its schema's)
            raise AvroError(f"the value does not decode with schema id {self.schema_id}: {exc!r}") from None
        if buffer.tell() != len(body):
            raise AvroError(f"the value has {len(body) - buffer.tell()} bytes beyond its schema id {self.schema_id}")
        return value

    def encode(self, value: Any) -> bytes:
        buffer = io.BytesIO()
        try:
            fastavro.schemaless_writer(buffer, self.schema, value)
        except Exception as exc:  # (as decode)
            raise AvroError(f"the record does not encode with schema id {self.schema_id}: {exc!r}") from None
        return buffer.getvalue()

    # -- fields

    def _branch(self, schema: Any, value: Any) -> tuple[Any, Any] | None:
        """The schema (resolved; a union's branch the value is in) and the value to step into."""
        schema = self._resolve(schema)
        if not isinstance(schema, list):
            return schema, value
        branches = [self._resolve(b) for b in schema]
        if isinstance(value, tuple) and len(value) == 2:
            for branch in branches:
                if isinstance(branch, dict) and branch.get("name") == value[0]:
                    return branch, value[1]
            return None
        wanted = "map" if isinstance(value, dict) else "array" if isinstance(value, list) else None
        for branch in branches:
            if _kind(branch) == wanted:
                return branch, value
        return None

    def locate(self, value: Any, steps: Sequence[str | int]) -> tuple[Any, str | int, Any] | None:
        """(the container, the key in it, the field's declared schema) of a path, or None when the
        record has no such field."""
        schema, node = self.schema, value
        found: tuple[Any, str | int, Any] | None = None
        for step in steps:
            branch = self._branch(schema, node)
            if branch is None:
                return None
            current, node = branch
            kind = _kind(current)
            if isinstance(step, str):
                if kind == "record" and isinstance(node, dict):
                    field = next((f for f in current["fields"] if f["name"] == step), None)
                    if field is None or step not in node:
                        return None
                    slot = field["type"]
                elif kind == "map" and isinstance(node, dict) and step in node:
                    slot = current["values"]
                else:
                    return None
            else:
                if kind != "array" or not isinstance(node, list) or step >= len(node):
                    return None
                slot = current["items"]
            found = (node, step, slot)
            schema, node = slot, node[step]
        return found

    def _wrapper(self, slot: Any) -> Any:
        known = self._slots.get(id(slot))
        if known is None:
            record = {"type": "record", "name": _SLOT, "fields": [{"name": "v", "type": slot}]}
            try:
                wrapper = fastavro.parse_schema(record, named_schemas=dict(self.named))
            except (ValueError, KeyError, TypeError, fastavro.schema.SchemaParseException) as exc:
                raise AvroError(f"a field of schema id {self.schema_id} cannot be encoded alone: {exc}") from None
            known = self._slots[id(slot)] = (slot, wrapper)
        return known[1]

    def encode_field(self, slot: Any, value: Any) -> bytes:
        buffer = io.BytesIO()
        try:
            fastavro.schemaless_writer(buffer, self._wrapper(slot), {"v": value})
        except AvroError:
            raise
        except Exception as exc:  # (as decode)
            raise AvroError(f"a field does not encode with its schema: {exc!r}") from None
        return buffer.getvalue()

    def decode_field(self, slot: Any, data: bytes) -> Any:
        buffer = io.BytesIO(data)
        try:
            value: Any = fastavro.schemaless_reader(buffer, self._wrapper(slot), None, return_record_name=True)
        except AvroError:
            raise
        except Exception as exc:  # (as decode)
            raise AvroError(f"a decrypted field does not decode with its schema: {exc!r}") from None
        if buffer.tell() != len(data):
            raise AvroError("a decrypted field has bytes beyond its schema")
        return value["v"]

    def storage(self, slot: Any) -> str:
        """How a field of this declared schema holds its envelope: ``string``, ``bytes`` or ``header``."""
        schema = self._resolve(slot)
        kinds = [_kind(self._resolve(b)) for b in schema] if isinstance(schema, list) else [_kind(schema)]
        if "string" in kinds:
            return "string"
        if "bytes" in kinds:
            return "bytes"
        return "header"

    def placeholder(self, slot: Any, depth: int = 0) -> Any:
        """What a non-string field holds while its envelope is in a header."""
        schema = self._resolve(slot)
        if depth > 32:
            raise AvroError(f"schema id {self.schema_id}: no placeholder for a deeply recursive type")
        if isinstance(schema, list):
            branches = [self._resolve(b) for b in schema]
            if any(_kind(b) == "null" for b in branches):
                return None
            first = branches[0]
            value = self.placeholder(first, depth + 1)
            return (first["name"], value) if _kind(first) == "record" else value
        kind = _kind(schema)
        simple = {
            "null": None,
            "boolean": False,
            "int": _INT_MIN,
            "long": _LONG_MIN,
            "float": _FLOAT_MIN,
            "double": _DOUBLE_MIN,
            "string": "",
            "bytes": b"",
        }
        if kind in simple:
            return simple[kind]
        if kind == "enum":
            return schema["symbols"][0]
        if kind == "fixed":
            return bytes(schema["size"])
        if kind == "array":
            return []
        if kind == "map":
            return {}
        if kind == "record":
            return {f["name"]: self.placeholder(f["type"], depth + 1) for f in schema["fields"]}
        raise AvroError(f"schema id {self.schema_id}: no placeholder for type {kind!r}")


def _sealed(data: Any) -> bool:
    """Whether bytes are an envelope (clear bytes may begin with the magic too)."""
    if not isinstance(data, bytes) or data[:3] != MAGIC:
        return False
    try:
        return parse(data) is not None
    except EnvelopeError:
        return False


def _sealed_text(text: Any) -> bool:
    if not isinstance(text, str) or not text.startswith(TEXT_MAGIC):
        return False
    try:
        return _sealed(binascii.a2b_base64(text, strict_mode=True))
    except ValueError:
        return False


def encrypt_fields(
    codec: AvroCodec,
    body: bytes,
    fields: Sequence[tuple[FieldPath, bytes, Any]],
    seal: Callable[[Any, bytes], bytes],
    present: Mapping[bytes, bytes | None],
    skip_encrypted: bool,
) -> tuple[bytes | None, list[tuple[bytes, bytes]]]:
    """The body with ``fields`` (path, label, what ``seal`` is given with the clear bytes) sealed,
    and the headers to add; (None, []) when nothing changed. ``present``: the record's headers.
    Raises AvroError, SealedAlready."""
    record = codec.decode(body)
    headers: list[tuple[bytes, bytes]] = []
    changed = False
    for path, label, target in fields:
        where = codec.locate(record, path.steps)
        if where is None:
            continue  # a record without the field has nothing to hide there
        container, key, slot = where
        value = container[key]
        storage = codec.storage(slot)
        name = header_name(label)
        already = (
            _sealed_text(value)
            if storage == "string"
            else _sealed(value)
            if storage == "bytes"
            else _sealed(present.get(name))
        )
        if already:
            if skip_encrypted:
                continue
            raise SealedAlready(path.text)
        envelope = seal(target, codec.encode_field(slot, value))
        if storage == "string":
            container[key] = to_text(envelope)
        elif storage == "bytes":
            container[key] = envelope
        else:
            container[key] = codec.placeholder(slot)
            headers.append((name, envelope))
        changed = True
    if not changed:
        return None, []
    return codec.encode(record), headers


def _candidates(node: Any, steps: tuple[str | int, ...], out: list[tuple[str | int, ...]]) -> None:
    """The paths of the strings and bytes holding envelopes under ``node``."""
    if isinstance(node, tuple) and len(node) == 2 and isinstance(node[0], str):
        node = node[1]  # a record in a union, read with its name
    if isinstance(node, dict):
        for key, child in node.items():
            _candidates(child, (*steps, key), out)
    elif isinstance(node, list):
        for index, child in enumerate(node):
            _candidates(child, (*steps, index), out)
    elif (isinstance(node, str) and node.startswith(TEXT_MAGIC)) or (isinstance(node, bytes) and node[:3] == MAGIC):
        out.append(steps)


def decrypt_fields(
    codec: AvroCodec,
    body: bytes,
    part: str,
    paths: Sequence[FieldPath] | None,
    headers: Sequence[tuple[bytes, bytes | None]],
    open_: Callable[[bytes, bytes], bytes | None],
) -> tuple[bytes | None, set[bytes]]:
    """The body with the envelopes it holds (only at ``paths`` when given) opened, and the names of
    the headers whose envelopes were restored into it (to drop); (None, set()) when nothing was.
    Raises AvroError (the value does not decode: it stays as stored)."""
    record = codec.decode(body)
    wanted = None if paths is None else {p.steps for p in paths}
    changed = False
    restored: set[bytes] = set()
    found: list[tuple[str | int, ...]] = []
    if wanted is None:
        _candidates(record, (), found)
    else:
        found = list(wanted)
    for steps in found:
        where = codec.locate(record, steps)
        if where is None:
            continue
        container, key, slot = where
        value = container[key]
        storage = codec.storage(slot)
        if storage == "string" and isinstance(value, str) and value.startswith(TEXT_MAGIC):
            try:
                envelope = binascii.a2b_base64(value, strict_mode=True)
            except ValueError:
                continue
        elif storage == "bytes" and isinstance(value, bytes) and value[:3] == MAGIC:
            envelope = value
        else:
            continue
        clear = open_(envelope, path_label(part, FieldPath("", steps)))
        if clear is not None:
            container[key] = codec.decode_field(slot, clear)
            changed = True
    prefix = header_name(part.encode())
    for name, value in headers:
        if value is None or not name.startswith(prefix) or value[:3] != MAGIC:
            continue
        label = name[len(HEADER_PREFIX) :]
        rest = label[len(part) :].decode("utf-8", "replace").removeprefix(".")
        try:
            steps = parse_path(rest).steps
        except PathError:
            continue
        if wanted is not None and steps not in wanted:
            continue
        where = codec.locate(record, steps)
        if where is None:
            continue
        clear = open_(value, label)
        if clear is not None:
            container, key, slot = where
            container[key] = codec.decode_field(slot, clear)
            restored.add(name)
            changed = True
    if not changed:
        return None, set()
    return codec.encode(record), restored


class AvroSchemas:
    """The Avro codecs of one interceptor's registry, by schema id (kept: an id's schema never
    changes). :meth:`prepare` fetches what a batch needs before its synchronous pass."""

    def __init__(self, client: SchemaRegistryClient) -> None:
        self.client = client
        self._codecs: dict[int, AvroCodec] = {}

    def codec(self, schema_id: int) -> AvroCodec | None:
        return self._codecs.get(schema_id)

    async def prepare(self, ids: Iterable[int]) -> dict[int, SchemaUnavailable]:
        """Fetches the schemas of ``ids`` not at hand; the ids that could not be had, and why."""
        failed: dict[int, SchemaUnavailable] = {}
        for schema_id in sorted(ids):
            if schema_id in self._codecs:
                continue
            try:
                schema = await self.client.schema_by_id(schema_id)
                if schema.schema_type != AVRO:
                    raise SchemaUnavailable(
                        f"schema id {schema_id} is {schema.schema_type}: only Avro fields are encrypted",
                        retriable=False,
                    )
                references = await self.client.references(schema)
                codec = AvroCodec(schema_id, schema.text, [r.text for r in references])
            except SchemaUnavailable as exc:
                failed[schema_id] = exc
                continue
            except SchemaNotFound as exc:
                failed[schema_id] = SchemaUnavailable(f"the schema registry: {exc}", retriable=False)
                continue
            except RegistryUnavailable as exc:
                failed[schema_id] = SchemaUnavailable(f"the schema registry is unavailable: {exc}", retriable=True)
                continue
            except RegistryError as exc:
                failed[schema_id] = SchemaUnavailable(f"the schema registry: {exc}", retriable=True)
                continue
            except AvroError as exc:
                failed[schema_id] = SchemaUnavailable(str(exc), retriable=False)
                continue
            if len(self._codecs) >= 10_000:
                self._codecs.clear()
            self._codecs[schema_id] = codec
        return failed

    async def aclose(self) -> None:
        await self.client.aclose()


# -- registry connections ----------------------------------------------------------------------------

PREFIX: Final = EXTERNAL_CONNECTION_PREFIX
PROPERTIES: Final = (
    "URL",
    "BASIC_AUTH_USERNAME",
    "BASIC_AUTH_PASSWORD",
    "BASIC_AUTH_USER_INFO",
    "SSL_CA_LOCATION",
    "SSL_CERTIFICATE_LOCATION",
    "SSL_KEY_LOCATION",
    "SSL_KEY_PASSWORD",
    "SSL_VERIFY_HOSTNAME",
    "TIMEOUT_MS",
)
_REGISTRY_TYPE: Final = "SCHEMA_REGISTRY"


def _normalize(name: str) -> str:
    return re.sub(r"[^A-Z0-9]", "_", name.upper())


def _is_registry(connection: ExternalConnection) -> bool:
    if connection.type is not None:
        return connection.type[0].strip().upper().replace("-", "_") == _REGISTRY_TYPE
    return "URL" in connection.props and set(connection.props) <= set(PROPERTIES)


def check_registry_connections(env: Mapping[str, str]) -> FamilyCheck:
    """The startup check of ``GATEWAY_EXTERNAL_CONNECTION_*`` for schema registry connections (which
    encryption interceptors name in ``schemaRegistryConnectionName``): they are read, so a gateway
    without the topic views plugin accepts them; one that cannot work stops the gateway."""
    read: list[str] = []
    for name, connection in external_connections(env)[0].items():
        if _is_registry(connection):
            _settings(name, connection.props)
            read.extend(connection.variables)
    return FamilyCheck(read=read)


def _settings(name: str, props: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
    for prop, (_, variable) in props.items():
        if prop not in PROPERTIES:
            close = get_close_matches(prop, PROPERTIES, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(variable, f"unknown schema registry connection property {prop}{hint}")

    def get(prop: str) -> str | None:
        item = props.get(prop)
        return None if item is None or item[0] == "" else item[0]

    urls = [u.strip() for u in (get("URL") or "").split(",") if u.strip()]
    if not urls:
        raise ConfigError(f"{PREFIX}{name}_CONFIG_URL", "required: the schema registry's URL")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"{PREFIX}{name}_CONFIG_URL", f"expected http:// or https:// URLs, got {url!r}")
    username, password, info = get("BASIC_AUTH_USERNAME"), get("BASIC_AUTH_PASSWORD"), get("BASIC_AUTH_USER_INFO")
    if info is None and (username is None) != (password is None):
        raise ConfigError(f"{PREFIX}{name}_CONFIG_BASIC_AUTH_PASSWORD", "basic auth needs a username and a password")
    timeout = get("TIMEOUT_MS") or "5000"
    if not timeout.isdigit() or int(timeout) <= 0:
        raise ConfigError(f"{PREFIX}{name}_CONFIG_TIMEOUT_MS", f"expected a positive integer, got {timeout!r}")
    return {
        "urls": urls,
        "user_info": info if info is not None else (f"{username}:{password}" if username is not None else None),
        "tls": TlsSettings(
            ca_location=get("SSL_CA_LOCATION"),
            certificate_location=get("SSL_CERTIFICATE_LOCATION"),
            key_location=get("SSL_KEY_LOCATION"),
            key_password=get("SSL_KEY_PASSWORD"),
            check_hostname=(get("SSL_VERIFY_HOSTNAME") or "true").strip().lower() != "false",
        ),
        "timeout": int(timeout) / 1000,
    }


def registry_client(env: Mapping[str, str], connection: str | None, inline: Any | None) -> SchemaRegistryClient | None:
    """The registry client of an interceptor: from the external connection ``connection`` (the
    ``GATEWAY_EXTERNAL_CONNECTION_*`` variables in ``env``) or an inline ``schemaRegistryConfig``
    block; None with neither. InterceptorConfigError for an unknown connection or a bad block."""
    if connection is not None and inline is not None:
        raise InterceptorConfigError("set schemaRegistryConnectionName or schemaRegistryConfig, not both")
    if connection is not None:
        declared = {_normalize(n): c for n, c in external_connections(env)[0].items()}
        found = declared.get(_normalize(connection))
        if found is None or not _is_registry(found):
            names = sorted(c.name for c in declared.values() if _is_registry(c))
            raise InterceptorConfigError(
                f"schemaRegistryConnectionName: no schema registry external connection {connection!r} "
                f"(declared: {', '.join(names) or 'none'}; GATEWAY_EXTERNAL_CONNECTION_<NAME>_CONFIG_URL declares one)"
            )
        try:
            settings = _settings(found.name, found.props)
        except ConfigError as exc:
            raise InterceptorConfigError(f"schemaRegistryConnectionName: {exc}") from None
    elif inline is not None:
        host = inline.host.strip()
        if not host.startswith(("http://", "https://")):
            raise InterceptorConfigError(f"schemaRegistryConfig.host: expected an http(s):// URL, got {host!r}")
        if (inline.basic_auth_username is None) != (inline.basic_auth_password is None):
            raise InterceptorConfigError("schemaRegistryConfig: basicAuthUsername and basicAuthPassword go together")
        user = inline.basic_auth_username
        settings = {
            "urls": [u.strip() for u in host.split(",") if u.strip()],
            "user_info": None if user is None else f"{user}:{inline.basic_auth_password}",
            "tls": None,
            "timeout": inline.timeout_ms / 1000,
        }
    else:
        return None
    try:
        return SchemaRegistryClient(
            settings["urls"],
            user_info=settings["user_info"],
            tls=settings["tls"],
            timeout=settings["timeout"],
            label="encryption schema registry",
        )
    except (ValueError, OSError) as exc:  # (a bad URL; unusable TLS files)
        raise InterceptorConfigError(f"schema registry: {exc}") from None
