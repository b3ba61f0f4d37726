"""Schema registry external connections, and the value decoders views read schema-encoded topics with.

Declared once, at startup, with environment variables::

    GATEWAY_EXTERNAL_CONNECTION_<NAME>_TYPE=SCHEMA_REGISTRY        # optional when CONFIG_URL is set
    GATEWAY_EXTERNAL_CONNECTION_<NAME>_CONFIG_<PROPERTY>=<value>

``<NAME>`` is how views refer to the connection (``spec.schemaRegistryConnectionName``), compared
without case and with every character other than a letter or digit read as ``_``: the connection
``MY_REGISTRY`` is ``my-registry`` or ``my_registry`` in a view. Properties (see :data:`PROPERTIES`):

========================= ======================================================================
``URL``                   the registry's base URL; several, comma-separated, are tried in order
``BASIC_AUTH_USERNAME``   HTTP basic auth user (with ``BASIC_AUTH_PASSWORD``)
``BASIC_AUTH_PASSWORD``   HTTP basic auth password
``BASIC_AUTH_USER_INFO``  ``user:password`` in one variable (Confluent's form), instead of the two
``SSL_CA_LOCATION``       PEM file of the CAs to trust for an ``https`` URL (default: the system's)
``SSL_CERTIFICATE_LOCATION`` PEM client certificate, for registries that require mutual TLS
``SSL_KEY_LOCATION``      PEM private key of the client certificate
``SSL_KEY_PASSWORD``      password of that key
``SSL_VERIFY_HOSTNAME``   ``false`` to accept a certificate issued for another host (default true)
``TIMEOUT_MS``            per-request timeout (default 5000)
========================= ======================================================================

The plugin declares the family with a check (:func:`check_connections`, through ``kanal_settings``)
that runs when the gateway starts. A connection declared ``TYPE=SCHEMA_REGISTRY`` with a missing URL,
an unknown property (the closest one is named) or a bad value stops the gateway, naming the
variable; without ``TYPE``, a connection with a ``URL`` and only the properties above is a schema
registry connection. Other connections (another ``TYPE``, or no ``TYPE`` and other properties) may
be another plugin's (KMS connections): this plugin leaves them to it, and the gateway stops only if
no plugin reads them, naming the closest type or property any of them knows (so a misspelt
``TYPE``, property or ``_TYPE``/``_CONFIG_`` suffix fails at startup too). A view naming another
plugin's connection is refused with a message listing its properties.

Records: Confluent framing (a zero byte, the 4-byte schema id, the payload). AVRO payloads are decoded
with the writer schema fetched by id (``GET /schemas/ids/{id}``, references resolved) through the shared
:class:`kanal_schemas.SchemaRegistryClient`, and the decoder kept for the gateway's life (a failed lookup
is retried after 30 s); JSON schema payloads are JSON. The decoded
value becomes JSON-like for the SQL: bytes and fixed as text (one character per byte), decimals as
numbers, dates and times as ISO-8601 text, UUIDs as text. Anything else (no magic byte, unknown id,
Protobuf) cannot be transformed: the view's onError applies.
"""

from __future__ import annotations

import datetime
import decimal
import io
import json
import logging
import re
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from difflib import get_close_matches
from typing import Any, Final

from kanal_schemas import (
    AVRO,
    JSON,
    RegistryError,
    Schema,
    SchemaRegistryClient,
    TlsSettings,
    header_ref,
    prefix_ref,
    split,
)

from kanal.api import (
    EXTERNAL_CONNECTION_PREFIX,
    ConfigError,
    ExternalConnection,
    FamilyCheck,
    Hint,
    external_connections,
)

__all__ = [
    "PREFIX",
    "PROPERTIES",
    "ExternalConnectionError",
    "MissingSchema",
    "RegistryConnection",
    "ValueDecoders",
    "check_connections",
    "parse_connections",
]

log = logging.getLogger("kanal_topicviews")

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
SCHEMA_REGISTRY: Final = "SCHEMA_REGISTRY"


class ExternalConnectionError(ValueError):
    """A schema cannot be fetched, or a connection is unusable."""


def normalize(name: str) -> str:
    """The key of a connection name: upper case, any other character than a letter or digit as ``_``."""
    return re.sub(r"[^A-Z0-9]", "_", name.upper())


@dataclass(frozen=True)
class RegistryConnection:
    name: str
    urls: tuple[str, ...]
    username: str | None = None
    password: str | None = None
    ca_location: str | None = None
    certificate_location: str | None = None
    key_location: str | None = None
    key_password: str | None = None
    verify_hostname: bool = True
    timeout_ms: int = 5000

    def tls(self) -> TlsSettings:
        return TlsSettings(
            ca_location=self.ca_location,
            certificate_location=self.certificate_location,
            key_location=self.key_location,
            key_password=self.key_password,
            check_hostname=self.verify_hostname,
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        if not any(u.startswith("https:") for u in self.urls):
            return None
        return self.tls().context()

    def client(self) -> SchemaRegistryClient:
        """The registry client of this connection: failed lookups are remembered :data:`RETRY_AFTER`."""
        return SchemaRegistryClient(
            self.urls,
            user_info=f"{self.username}:{self.password}" if self.username is not None else None,
            tls=self.tls(),
            timeout=self.timeout_ms / 1000,
            negative_ttl=RETRY_AFTER,
            failure_ttl=RETRY_AFTER,
        )


def _is_registry(connection: ExternalConnection) -> bool | None:
    """True: a schema registry connection (TYPE=SCHEMA_REGISTRY, or no TYPE, a URL and only
    registry properties). False: another TYPE. None: no TYPE and not a registry's properties
    (another plugin's connection, or a registry with a misspelt property)."""
    if connection.type is not None:
        return connection.type[0].strip().upper().replace("-", "_") == SCHEMA_REGISTRY
    return True if "URL" in connection.props and set(connection.props) <= set(PROPERTIES) else None


def check_connections(env: Mapping[str, str]) -> FamilyCheck:
    """The startup check of ``GATEWAY_EXTERNAL_CONNECTION_*`` (declared with ``kanal_settings``): the
    schema registry connections are parsed (ConfigError naming the variable for one that cannot
    work) and read; the other connections may be another plugin's, so they only get hints (the type
    and properties a registry has), and the gateway refuses them if no plugin reads them."""
    parse_connections(env)
    declared, malformed = external_connections(env)
    read: list[str] = []
    hints: dict[str, Hint] = {}
    for name, connection in declared.items():
        registry = _is_registry(connection)
        if registry:
            read.extend(connection.variables)
        elif registry is False and connection.type is not None:
            hints[connection.type[1]] = Hint(values=(SCHEMA_REGISTRY,), what="external connection type")
        else:
            for prop, (_, variable) in connection.props.items():
                if prop not in PROPERTIES:
                    hints[variable] = Hint(names=[f"{PREFIX}{name}_CONFIG_{p}" for p in PROPERTIES])
    for variable in malformed:  # no _TYPE or _CONFIG_: the shapes it may have meant, for each <NAME> it may have
        rest = variable[len(PREFIX) :]
        names = {rest[:i] for i, c in enumerate(rest) if c == "_"} | {rest}
        hints[variable] = Hint(
            names=[f"{PREFIX}{n}{suffix}" for n in names for suffix in ("_TYPE", *(f"_CONFIG_{p}" for p in PROPERTIES))]
        )
    return FamilyCheck(read=read, hints=hints)


def parse_connections(
    env: Mapping[str, str], others: dict[str, list[str]] | None = None
) -> dict[str, RegistryConnection]:
    """The schema registry connections declared in ``env``, by normalized name; ConfigError (naming
    the variable) for a schema registry connection that cannot work. Connections left to other
    plugins (another TYPE, or no TYPE and properties a registry does not have) go to ``others``
    (name -> their properties)."""
    declared, _ = external_connections(env)
    out: dict[str, RegistryConnection] = {}
    for name in sorted(declared):
        props = declared[name].props
        if not _is_registry(declared[name]):
            if others is not None:  # another plugin's connection
                others[normalize(name)] = sorted(props)
            continue
        for prop, (_, variable) in props.items():
            if prop not in PROPERTIES:
                close = get_close_matches(prop, PROPERTIES, n=1)
                raise ConfigError(
                    variable,
                    f"unknown schema registry connection property {prop}"
                    + (f" (did you mean {close[0]}?)" if close else "")
                    + f"; known: {', '.join(PROPERTIES)}",
                )
        url = props.get("URL")
        urls = tuple(u.strip().rstrip("/") for u in (url[0] if url else "").split(",") if u.strip())
        if not urls:
            raise ConfigError(f"{PREFIX}{name}_CONFIG_URL", "required: the schema registry's URL")
        for u in urls:
            if not u.startswith(("http://", "https://")):
                raise ConfigError(f"{PREFIX}{name}_CONFIG_URL", f"expected http:// or https:// URLs, got {u!r}")
        username = _get(props, "BASIC_AUTH_USERNAME")
        password = _get(props, "BASIC_AUTH_PASSWORD")
        info = _get(props, "BASIC_AUTH_USER_INFO")
        if info is not None:
            if ":" not in info:
                raise ConfigError(f"{PREFIX}{name}_CONFIG_BASIC_AUTH_USER_INFO", "expected user:password")
            username, password = info.split(":", 1)
        if (username is None) != (password is None):
            raise ConfigError(
                f"{PREFIX}{name}_CONFIG_BASIC_AUTH_PASSWORD", "basic auth needs both a username and a password"
            )
        verify = (_get(props, "SSL_VERIFY_HOSTNAME") or "true").strip().lower()
        if verify not in ("true", "false"):
            raise ConfigError(f"{PREFIX}{name}_CONFIG_SSL_VERIFY_HOSTNAME", f"expected true or false, got {verify!r}")
        timeout = _get(props, "TIMEOUT_MS") or "5000"
        if not timeout.isdigit() or int(timeout) <= 0:
            raise ConfigError(f"{PREFIX}{name}_CONFIG_TIMEOUT_MS", f"expected a positive integer, got {timeout!r}")
        connection = RegistryConnection(
            name=name,
            urls=urls,
            username=username,
            password=password,
            ca_location=_get(props, "SSL_CA_LOCATION"),
            certificate_location=_get(props, "SSL_CERTIFICATE_LOCATION"),
            key_location=_get(props, "SSL_KEY_LOCATION"),
            key_password=_get(props, "SSL_KEY_PASSWORD"),
            verify_hostname=verify == "true",
            timeout_ms=int(timeout),
        )
        try:
            connection.ssl_context()
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"{PREFIX}{name}_CONFIG_SSL_CA_LOCATION", f"unusable TLS settings: {exc}") from None
        out[normalize(name)] = connection
    return out


def _get(props: Mapping[str, tuple[str, str]], key: str) -> str | None:
    item = props.get(key)
    return None if item is None or item[0] == "" else item[0]


# -- schemas ------------------------------------------------------------------------------------------


class MissingSchema(Exception):  # not a ValueError: it must get out of the record loop
    """A value names a schema id not fetched yet; ``await load()`` then transform again."""

    def __init__(self, registry: _Registry, schema_id: int) -> None:
        super().__init__(f"schema {schema_id} of {registry.connection.name} not fetched yet")
        self.registry = registry
        self.schema_id = schema_id

    async def load(self) -> None:
        await self.registry.load(self.schema_id)


Reader = Callable[[bytes], Any]


#: Seconds a failed schema lookup is remembered before the next fetch tries again (an unknown id, a
#: registry that is down: meanwhile the records of that schema follow the view's onError).
RETRY_AFTER: Final = 30.0


class _Registry:
    """The schemas of one connection, by id (or why they are unusable, and until when)."""

    def __init__(self, connection: RegistryConnection) -> None:
        self.connection = connection
        self.client = connection.client()
        self.readers: dict[int, Reader | tuple[str, float]] = {}

    def decode(self, value: bytes) -> Any:
        schema_id = prefix_ref(value)
        if schema_id is None:
            raise ValueError("the value is not in the schema registry's wire format (magic byte 0, schema id)")
        reader = self.readers.get(schema_id)
        if reader is None:
            raise MissingSchema(self, schema_id)
        if isinstance(reader, tuple):
            if time.monotonic() >= reader[1]:
                del self.readers[schema_id]
                raise MissingSchema(self, schema_id)
            raise ValueError(reader[0])
        return reader(value[5:])

    async def load(self, schema_id: int) -> None:
        if schema_id in self.readers:
            return
        try:
            schema = await self.client.schema_by_id(schema_id)
            references = await self.client.references(schema) if schema.schema_type == AVRO else []
            reader = _reader(schema_id, schema, references)
        except (RegistryError, ExternalConnectionError) as exc:
            log.warning("schema registry %s: %s (retried in %.0f s)", self.connection.name, exc, RETRY_AFTER)
            self.readers[schema_id] = (str(exc), time.monotonic() + RETRY_AFTER)
            return
        self.readers[schema_id] = reader

    async def read(self, value: bytes | None, header: bytes | None) -> Any:
        """A record value decoded with the schema it names (its ``__value_schema_id`` header, a GUID
        or an id, else the Confluent prefix), for the console; None when it names no schema."""
        ref = header_ref(header)
        body = value
        if ref is None:
            framed = split(value) if value is not None else None
            if framed is None:
                return None
            ref, body = framed
        if body is None:
            return None
        schema = await self.client.schema(ref)
        references = await self.client.references(schema) if schema.schema_type == AVRO else []
        reader = schema.memo("console-reader", lambda s: _reader(s.id or 0, s, references))
        return _jsonable(reader(body))

    async def aclose(self) -> None:
        await self.client.aclose()


def _reader(schema_id: int, schema: Schema, references: Sequence[Schema]) -> Reader:
    if schema.schema_type == JSON:
        import orjson

        return orjson.loads
    if schema.schema_type != AVRO:
        raise ExternalConnectionError(f"schema {schema_id} is {schema.schema_type}: views decode AVRO and JSON schemas")
    import fastavro

    named: dict[str, Any] = {}
    texts = [ref.text for ref in references]
    try:
        for text in texts:
            fastavro.parse_schema(json.loads(text), named_schemas=named)
        parsed = fastavro.parse_schema(json.loads(schema.text), named_schemas=named)
    except (ValueError, KeyError, TypeError, fastavro.schema.SchemaParseException) as exc:
        raise ExternalConnectionError(f"unusable Avro schema: {exc}") from None
    reader = fastavro.schemaless_reader
    if not re.search(r'"(bytes|fixed)"|logicalType', schema.text + "".join(texts)):

        def plain(payload: bytes) -> Any:
            return reader(io.BytesIO(payload), parsed, None)

        return plain

    def converted(payload: bytes) -> Any:
        return _jsonable(reader(io.BytesIO(payload), parsed, None))

    return converted


def _jsonable(value: Any) -> Any:
    """A decoded Avro value as JSON-like values (what view SQL reads)."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


class ValueDecoders:
    """The schema registry connections of a gateway, each with its schema cache."""

    def __init__(
        self, connections: Mapping[str, RegistryConnection], others: Mapping[str, list[str]] | None = None
    ) -> None:
        self._registries = {key: _Registry(c) for key, c in connections.items()}
        self._others = dict(others or {})

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ValueDecoders:
        others: dict[str, list[str]] = {}
        return cls(parse_connections(env, others), others)

    def why_not(self, name: str) -> str | None:
        """Why a declared connection ``name`` is not a schema registry one (None if not declared)."""
        props = self._others.get(normalize(name))
        if props is None:
            return None
        return (
            f"external connection {name!r} is not a schema registry connection (properties: "
            f"{', '.join(props) or 'none'}; a registry has {', '.join(PROPERTIES)}; "
            f"GATEWAY_EXTERNAL_CONNECTION_<NAME>_TYPE=SCHEMA_REGISTRY makes the gateway check them)"
        )

    def names(self) -> list[str]:
        return sorted(r.connection.name for r in self._registries.values())

    def has(self, name: str) -> bool:
        return normalize(name) in self._registries

    async def aclose(self) -> None:
        """Closes the registry clients' connections."""
        for registry in self._registries.values():
            await registry.aclose()

    def readers(self) -> list[tuple[str, Callable[[bytes | None, bytes | None], Awaitable[Any]]]]:
        """Each connection's name and its reader of record values (see :meth:`_Registry.read`)."""
        return [(r.connection.name, r.read) for r in self._registries.values()]

    def decoder(self, name: str) -> Reader:
        """The value decoder of connection ``name`` (may raise :class:`MissingSchema`)."""
        registry = self._registries.get(normalize(name))
        if registry is None:
            raise ExternalConnectionError(f"no schema registry external connection {name!r}")
        return registry.decode
