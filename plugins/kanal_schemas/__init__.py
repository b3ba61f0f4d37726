"""The schema registry client shared by the plugins (data quality, topic views, the registry proxy).

A library, not a plugin: no entry point, no hooks, nothing of the core imported (trio and orjson
only), so any plugin may use it.

* :mod:`kanal_schemas.client`: :class:`SchemaRegistryClient`, async lookups by id, GUID and subject
  version, references, who holds a schema; bounded caches.
* :mod:`kanal_schemas.framing`: where a record names its schema (Confluent framing, schema id headers).
* :mod:`kanal_schemas.http`: the kept-alive HTTP/1.1 client on trio underneath (also the registry
  proxy's upstream client).
"""

from __future__ import annotations

from kanal_schemas.client import (
    AVRO,
    JSON,
    PROTOBUF,
    Reference,
    RegistryError,
    RegistryUnavailable,
    Schema,
    SchemaNotFound,
    SchemaRegistryClient,
    Send,
    Transport,
    UnreadableAnswer,
)
from kanal_schemas.framing import (
    KEY_HEADER,
    MAGIC,
    VALUE_HEADER,
    SchemaRef,
    describe_ref,
    frame,
    guid_header,
    header_ref,
    id_header,
    prefix_ref,
    split,
)
from kanal_schemas.http import Endpoint, HttpClient, HttpError, HttpResponse, TlsSettings, request_once

__all__ = [
    "AVRO",
    "JSON",
    "KEY_HEADER",
    "MAGIC",
    "PROTOBUF",
    "VALUE_HEADER",
    "Endpoint",
    "HttpClient",
    "HttpError",
    "HttpResponse",
    "Reference",
    "RegistryError",
    "RegistryUnavailable",
    "Schema",
    "SchemaNotFound",
    "SchemaRef",
    "SchemaRegistryClient",
    "Send",
    "TlsSettings",
    "Transport",
    "UnreadableAnswer",
    "describe_ref",
    "frame",
    "guid_header",
    "header_ref",
    "id_header",
    "prefix_ref",
    "request_once",
    "split",
]
