"""``header-injection``: adds headers to the records produced to matching topics, so consumers and
audits downstream can tell who wrote a record, from where and through which gateway.

Header values are templates (``{{uuid}}``, ``{{user}}``, ...; :data:`TEMPLATE_VARIABLES`), parsed
once when the interceptor is applied (an unknown variable is refused there, naming it). Per
topic-partition of a Produce request the values are rendered once; only ``{{uuid}}`` is drawn per
record (a record's headers share one). Topics the ``topic`` regex does not match are not decoded.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any, ClassVar

import msgspec

from kanal.api import (
    Connection,
    GatewayServices,
    Headers,
    Interceptor,
    InterceptorConfigError,
    Record,
    RecordsContext,
    api_name,
    hookimpl,
)
from kanal_safeguards.base import TopicMatcher
from kanal_safeguards.templates import compile_template, connection_variables, host, variables

__all__ = ["TEMPLATE_VARIABLES", "HeaderInjection", "HeaderInjectionConfig"]

#: What a header value may use, each as ``{{name}}``.
TEMPLATE_VARIABLES = (
    "uuid",
    "userIp",
    "vcluster",
    "user",
    "clientId",
    "gatewayIp",
    "gatewayHost",
    "gatewayVersion",
    "apiKey",
    "apiKeyVersion",
    "timestampMillis",
)
_UUID = "\ue000"  # stands for {{uuid}} between the per-call rendering and the per-record one
_Apply = Callable[[list[Record], Callable[[], Headers]], None]


def _gateway_version() -> str:
    try:
        return version("kanal")
    except PackageNotFoundError:  # a source checkout that is not installed
        return "unknown"


_GATEWAY_HOST = socket.gethostname()
_GATEWAY_VERSION = _gateway_version()


class HeaderInjectionConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    headers: Annotated[dict[str, str], msgspec.Meta(min_length=1)]
    topic: str = ".*"
    override_if_exists: bool = False


def _compile(name: str, template: str) -> str:
    """``template`` as a ``str.format_map`` pattern; refuses unknown variables, naming them."""
    unknown = [v for v in variables(template) if v not in TEMPLATE_VARIABLES]
    if unknown:
        names = ", ".join("{{" + v + "}}" for v in unknown)
        known = ", ".join("{{" + v + "}}" for v in TEMPLATE_VARIABLES)
        plural = "s" if len(unknown) > 1 else ""
        raise InterceptorConfigError(f"headers.{name}: unknown template variable{plural} {names} (known: {known})")
    return compile_template(template)


class HeaderInjection(Interceptor):
    """Adds the configured headers to every record produced to the topics ``topic`` matches."""

    plugin_name: ClassVar[str] = "header-injection"
    description: ClassVar[str] = "Adds headers with templated values to the records produced to matching topics."
    config_type: ClassVar[type[Any] | None] = HeaderInjectionConfig
    config: HeaderInjectionConfig

    def __init__(self, config: HeaderInjectionConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        self._matches = TopicMatcher(config.topic)
        self._patterns = [(name, _compile(name, value)) for name, value in config.headers.items()]
        self._templated = any(variables(v) for v in config.headers.values())
        self._per_record = any("{uuid}" in p for _, p in self._patterns)
        self._literal: Headers = [(n, v.encode()) for n, v in config.headers.items()]
        names = frozenset(config.headers)
        self._apply: _Apply = _replacing(names) if config.override_if_exists else _keeping(names)

    def wants_produce_records(self, topic: str) -> bool:
        """Other topics' Produce requests are then not decoded for this interceptor."""
        return self._matches(topic)

    @hookimpl
    def kanal_produce_records(self, ctx: RecordsContext) -> None:
        if not self._matches(ctx.topic):  # the same request may hold a topic that matches
            return None
        batches = [b for b in ctx.records.batches if not b.is_control and b.records_count]
        if not batches:
            return None
        extra = self._headers_for(ctx)
        for batch in batches:
            self._apply(batch.records(), extra)
            batch.mark_changed()
        return None

    def _headers_for(self, ctx: RecordsContext) -> Callable[[], Headers]:
        """The headers of the next record of this partition batch: rendered once here, but for
        ``{{uuid}}``, drawn per record."""
        if not self._templated:
            literal = self._literal
            return lambda: literal
        values = _variables(ctx.connection, ctx)
        rendered = [(name, pattern.format_map(values)) for name, pattern in self._patterns]
        if not self._per_record:
            fixed: Headers = [(name, text.encode()) for name, text in rendered]
            return lambda: fixed
        encoded = [(name, text if _UUID in text else text.encode()) for name, text in rendered]

        def per_record() -> Headers:
            u = str(uuid.uuid4())
            return [(n, v.replace(_UUID, u).encode() if isinstance(v, str) else v) for n, v in encoded]

        return per_record


def _variables(connection: Connection, ctx: RecordsContext) -> dict[str, str]:
    """The template variables of one Produce partition batch (``{{uuid}}`` left for each record)."""
    return {
        **connection_variables(connection, ctx.client_id),
        "uuid": _UUID,
        "gatewayIp": host(connection.listener_address),
        "gatewayHost": _GATEWAY_HOST,
        "gatewayVersion": _GATEWAY_VERSION,
        "apiKey": api_name(ctx.api_key),
        "apiKeyVersion": str(ctx.api_version),
        "timestampMillis": str(time.time_ns() // 1_000_000),
    }


# -- per-record functions, chosen once in __init__


def _keeping(names: frozenset[str]) -> _Apply:
    """Adds the headers a record does not have yet: the producer's own win."""

    def apply(records: list[Record], headers: Callable[[], Headers]) -> None:
        for r in records:
            h = r.headers
            extra = headers()
            if h:
                present = {k for k, _ in h}
                if not names.isdisjoint(present):
                    r.headers = h + [x for x in extra if x[0] not in present]
                    continue
            r.headers = h + extra  # a new list per record: later interceptors may edit it in place

    return apply


def _replacing(names: frozenset[str]) -> _Apply:
    """Removes the record's headers of the configured names, then adds ours."""

    def apply(records: list[Record], headers: Callable[[], Headers]) -> None:
        for r in records:
            h = r.headers
            if h:
                h = [x for x in h if x[0] not in names]
            r.headers = h + headers()

    return apply


INTERCEPTORS: list[type[Interceptor]] = [HeaderInjection]
