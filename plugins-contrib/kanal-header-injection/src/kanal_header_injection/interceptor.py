"""The ``contrib-header-injection`` interceptor: add configured headers to every record produced.

Config (Kanal validates it against :attr:`HeaderInjection.config_schema` before ``__init__``, which
checks what a schema cannot: the templates and the regexes; every error names the key at fault)::

    headers:                      # required: header name -> value
      x-origin: kanal-gateway     # a literal
      x-client: "{{clientId}}"    # a template: {{clientId}}, {{clientAddress}}, {{topic}}, {{partition}}
    topics: ["orders-.*"]         # optional: regexes, one must match the WHOLE topic name
    overrideIfExists: false       # optional: replace headers the record already has with these names

Cost model: the hook runs once per topic-partition of a Produce request. It renders the header
values to bytes once there, then runs a per-record function chosen in ``__init__`` that does one
list operation per record. Topics the interceptor does not apply to are left untouched, so their
batches are forwarded byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NotRequired, TypedDict

from kanal.api import (
    GatewayServices,
    Headers,
    Interceptor,
    InterceptorConfigError,
    Record,
    RecordsContext,
    hookimpl,
)

__all__ = ["TEMPLATE_VARIABLES", "HeaderInjection", "HeaderInjectionConfig"]

#: The template variables a header value may use, and what they stand for.
TEMPLATE_VARIABLES: Mapping[str, str] = {
    "clientId": "the client id the producer sent in the request header ('' when it sent none)",
    "clientAddress": "the producer's address as the gateway sees it, 'host:port'",
    "topic": "the topic the records are produced to",
    "partition": "the partition number the records are produced to",
}

_VARIABLE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_TOPIC_CACHE_MAX = 10_000

# A header value once parsed: bytes (or None) when literal, else the template's pieces, where a
# str piece is literal text and a 1-tuple names a variable.
_Piece = str | tuple[str]
_Value = bytes | None | tuple[_Piece, ...]
_Apply = Callable[[list[Record], Headers], None]


class HeaderInjectionConfig(TypedDict):
    """The config as :attr:`HeaderInjection.config_schema` lets it through."""

    headers: dict[str, str | int | float | None]
    topics: NotRequired[list[str]]
    overrideIfExists: NotRequired[bool]


class HeaderInjection(Interceptor):
    """Adds the configured headers to every record produced to the matching topics."""

    plugin_name: ClassVar[str] = "contrib-header-injection"
    description: ClassVar[str] = "Adds configured, optionally templated headers to every record produced."
    config_schema: ClassVar[Mapping[str, Any] | None] = {
        "type": "object",
        "additionalProperties": False,
        "required": ["headers"],
        "properties": {
            "headers": {
                "type": "object",
                "minProperties": 1,
                "propertyNames": {"type": "string", "minLength": 1},
                "additionalProperties": {"type": ["string", "number", "null"]},
                "description": "Header name -> value; values may use "
                + ", ".join("{{" + name + "}}" for name in TEMPLATE_VARIABLES),
            },
            "topics": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "string", "minLength": 1},
                "description": "Regexes matched against the whole topic name; default: every topic",
            },
            "overrideIfExists": {
                "type": "boolean",
                "default": False,
                "description": "Replace headers of the same name the record already has",
            },
        },
    }
    # Record hooks only: no request or response needs decoding for this interceptor.
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset()
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset()

    config: HeaderInjectionConfig

    def __init__(self, config: HeaderInjectionConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        self._values = _parse_headers(config["headers"])
        self._names = frozenset(self._values)
        self._templated = any(isinstance(v, tuple) for v in self._values.values())
        # Literal-only headers are rendered once, here; templated ones once per partition batch.
        self._static: Headers = [] if self._templated else self._render("", "", "", 0)
        self._topics = _parse_topics(config.get("topics"))
        self._topic_applies: dict[str, bool] = {}
        override = config.get("overrideIfExists", False)
        self._apply: _Apply = _replacing(self._names) if override else _keeping(self._names)

    # -- the hook

    def wants_produce_records(self, topic: str) -> bool:
        """Requests for other topics are then not decoded for this interceptor at all."""
        return self._applies(topic)

    @hookimpl
    def kanal_produce_records(self, ctx: RecordsContext) -> None:
        if not self._applies(ctx.topic):  # the same request may hold a topic that applies
            return None
        batches = [b for b in ctx.records.batches if not b.is_control and b.records_count]
        if not batches:
            return None
        extra = self._static
        if self._templated:
            extra = self._render(ctx.client_id or "", ctx.connection.client_address, ctx.topic, ctx.partition)
        for batch in batches:
            self._apply(batch.records(), extra)
            batch.mark_changed()
        return None

    # -- helpers

    def _applies(self, topic: str) -> bool:
        """Whether the ``topics`` regexes select ``topic`` (cached: topics repeat on every request)."""
        if self._topics is None:
            return True
        applies = self._topic_applies.get(topic)
        if applies is None:
            if len(self._topic_applies) >= _TOPIC_CACHE_MAX:
                self._topic_applies.clear()
            applies = self._topic_applies[topic] = any(p.fullmatch(topic) for p in self._topics)
        return applies

    def _render(self, client_id: str, client_address: str, topic: str, partition: int) -> Headers:
        """The headers to add, values as bytes, for one partition batch."""
        variables = {
            "clientId": client_id,
            "clientAddress": client_address,
            "topic": topic,
            "partition": str(partition),
        }
        out: Headers = []
        for name, value in self._values.items():
            if isinstance(value, tuple):
                text = "".join(variables[p[0]] if isinstance(p, tuple) else p for p in value)
                out.append((name, text.encode()))
            else:
                out.append((name, value))
        return out


# -- per-record functions, chosen once in __init__


def _keeping(names: frozenset[str]) -> _Apply:
    """Adds the headers a record does not have yet; existing ones win."""

    def apply(records: list[Record], extra: Headers) -> None:
        for r in records:
            h = r.headers
            if h:
                present = {k for k, _ in h}
                if not names.isdisjoint(present):
                    r.headers = h + [x for x in extra if x[0] not in present]
                    continue
            r.headers = h + extra  # a new list per record: later interceptors may edit it in place

    return apply


def _replacing(names: frozenset[str]) -> _Apply:
    """Removes every header the record has under one of the configured names, then adds ours."""

    def apply(records: list[Record], extra: Headers) -> None:
        for r in records:
            h = r.headers
            if h:
                h = [x for x in h if x[0] not in names]
            r.headers = h + extra

    return apply


# -- config parsing: what the schema cannot check


def _parse_headers(headers: Mapping[str, str | int | float | None]) -> dict[str, _Value]:
    return {name: _parse_value(f"headers.{name}", value) for name, value in headers.items()}


def _parse_value(key: str, value: str | float | None) -> _Value:
    if value is None:
        return None  # a header with a null value
    text = str(value)
    if "${" in text:
        raise InterceptorConfigError(
            f"{key}: {text!r} holds a ${{...}} placeholder; the gateway expands those when it loads the config "
            "file, the plugin takes values literally"
        )
    pieces: list[_Piece] = []
    pos = 0
    for match in _VARIABLE.finditer(text):
        variable = match.group(1)
        if variable not in TEMPLATE_VARIABLES:
            known = ", ".join("{{" + v + "}}" for v in TEMPLATE_VARIABLES)
            raise InterceptorConfigError(f"{key}: unknown template variable {{{{{variable}}}}} (known: {known})")
        if match.start() > pos:
            pieces.append(text[pos : match.start()])
        pieces.append((variable,))
        pos = match.end()
    rest = text[pos:]
    if any("{{" in p for p in (*pieces, rest) if isinstance(p, str)):
        raise InterceptorConfigError(f"{key}: {text!r} has a '{{{{' that does not start a template variable")
    if not pieces:
        return text.encode()
    if rest:
        pieces.append(rest)
    return tuple(pieces)


def _parse_topics(topics: list[str] | None) -> tuple[re.Pattern[str], ...] | None:
    if topics is None:
        return None
    patterns = []
    for i, pattern in enumerate(topics):
        try:
            patterns.append(re.compile(pattern))
        except re.error as exc:
            raise InterceptorConfigError(f"topics.{i}: invalid regular expression {pattern!r}: {exc}") from None
    return tuple(patterns)
