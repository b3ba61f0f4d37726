"""OpenTelemetry tracing: a server span per request, a client span around each upstream call.

The incoming W3C trace context (``traceparent``/``tracestate``) is the parent of the server span, and
the client span's context goes upstream in the same headers, so a trace runs from the client through
the proxy into the registry. Spans go to the global tracer provider: ``kanal registry-proxy`` sets one
up when ``OTEL_TRACES_EXPORTER`` is ``console`` or ``otlp``; an application embedding the proxy may
install its own. With none, spans cost next to nothing and the incoming context is still passed on.

Span names: ``<METHOD> <route template>`` (server), ``upstream <METHOD> <route template>`` (client).
Attributes: ``http.request.method``, ``http.route``, ``url.path``, ``http.response.status_code``,
``enduser.id`` (the principal), ``srp.subject``, ``srp.authorization.outcome``; on client spans
``server.address``, ``server.port``, ``http.request.method``, ``http.response.status_code``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from opentelemetry import propagate, trace
from opentelemetry.context import Context

from kanal_registry_proxy import __version__

log = logging.getLogger(__name__)

SERVER = trace.SpanKind.SERVER
CLIENT = trace.SpanKind.CLIENT


_NOT_ENABLED_UNTIL = [0.0]  # monotonic time until which "no recording provider" is taken as known
_RECHECK = 1.0


def enabled() -> bool:
    """Whether a tracer provider that records spans is installed (checked per request). While none
    is, OpenTelemetry is asked again at most once a second: asking reads the environment each time.
    Once one is, it stays (OpenTelemetry does not let the provider be replaced)."""
    if time.monotonic() < _NOT_ENABLED_UNTIL[0]:
        return False
    if isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        _NOT_ENABLED_UNTIL[0] = time.monotonic() + _RECHECK
        return False
    return True


def tracer() -> trace.Tracer:
    return trace.get_tracer("kanal_registry_proxy", __version__)


def extract(headers: Sequence[tuple[bytes, bytes]]) -> Context | None:
    """The parent context carried by the request headers, if any."""
    carrier: dict[str, str] | None = None
    for name, value in headers:
        if name in (b"traceparent", b"tracestate", b"baggage"):
            if carrier is None:
                carrier = {}
            carrier[name.decode()] = value.decode("latin-1")
    if carrier is None:
        return None
    return propagate.extract(carrier)


def inject(span: trace.Span, headers: list[tuple[bytes, bytes]]) -> None:
    """Adds the span's context to outgoing headers."""
    if not span.get_span_context().is_valid:
        return
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    for name, value in carrier.items():
        headers.append((name.encode(), value.encode()))


def configure(exporter: str, service_name: str) -> None:
    """Installs an SDK tracer provider exporting to the console or OTLP (``OTEL_*`` variables apply)."""
    if exporter == "none":
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    span_exporter: SpanExporter
    if exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.error("OTEL_TRACES_EXPORTER=otlp needs the package opentelemetry-exporter-otlp-proto-http; no traces")
            return
        span_exporter = OTLPSpanExporter()
    else:
        span_exporter = ConsoleSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    trace.set_tracer_provider(provider)
    _NOT_ENABLED_UNTIL[0] = 0.0
