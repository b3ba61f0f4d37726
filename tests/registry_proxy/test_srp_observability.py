"""Metrics, tracing (spans and W3C context propagation to the registry) and structured JSON logs."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import httpx
import pytest
from kanal_registry_proxy import tracing
from kanal_registry_proxy.testing import TestRegistry
from kanal_registry_proxy.testing.proxy import ProxyThread
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from kanal.logs import JsonFormatter
from registry_proxy.srp_helpers import basic, register

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def upstream_header(upstream: TestRegistry, name: bytes) -> bytes | None:
    assert upstream.registry is not None
    headers = upstream.registry.seen[-1][3]
    return next((v for k, v in headers if k == name), None)


def test_spans_around_requests_and_upstream_calls_with_propagation(
    make_proxy: Callable[..., ProxyThread], upstream: TestRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = make_proxy()
    register(proxy.url, "orders-value")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "enabled", lambda: True)
    proxy.service.proxy.tracer = provider.get_tracer("test")

    response = httpx.get(f"{proxy.url}/schemas/ids/1", headers={**basic("alice"), "traceparent": TRACEPARENT})
    assert response.status_code == 200
    spans = {span.name: span for span in exporter.get_finished_spans()}
    server = spans["GET /schemas/ids/{id}"]
    client = spans["upstream GET /schemas/ids/{id}"]
    resolution = spans["upstream GET /schemas/ids/{id}/versions"]
    assert server.kind == SpanKind.SERVER and client.kind == SpanKind.CLIENT
    assert f"{server.context.trace_id:032x}" == TRACE_ID
    assert server.parent is not None and f"{server.parent.span_id:016x}" == PARENT_ID
    assert client.parent is not None and client.parent.span_id == server.context.span_id
    assert resolution.parent is not None and resolution.parent.span_id == server.context.span_id
    assert server.attributes is not None
    assert server.attributes["http.route"] == "/schemas/ids/{id}"
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["enduser.id"] == "alice"
    # the registry received the client span's context: same trace, the proxy's span as parent
    sent = upstream_header(upstream, b"traceparent")
    assert sent == f"00-{TRACE_ID}-{client.context.span_id:016x}-01".encode()


def test_without_a_tracer_the_client_context_passes_unchanged(
    make_proxy: Callable[..., ProxyThread], upstream: TestRegistry
) -> None:
    proxy = make_proxy()
    httpx.get(f"{proxy.url}/subjects", headers={**basic("alice"), "traceparent": TRACEPARENT})
    assert upstream_header(upstream, b"traceparent") == TRACEPARENT.encode()
    assert upstream_header(upstream, b"authorization") is None  # the client's credentials stay at the proxy


def test_structured_access_and_denial_logs(make_proxy: Callable[..., ProxyThread]) -> None:
    proxy = make_proxy(SRP_ACCESS_LOG="true")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("kanal_registry_proxy")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        httpx.get(f"{proxy.url}/subjects", headers=basic("alice"))
        register(proxy.url, "orders-value", user="alice")  # denied in read-only mode
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    lines = [json.loads(JsonFormatter().format(record)) for record in records]
    access = [line for line in lines if line["logger"] == "kanal_registry_proxy.access"]
    assert access[0]["route"] == "/subjects" and access[0]["status"] == 200 and access[0]["principal"] == "alice"
    assert access[0]["method"] == "GET" and "duration_ms" in access[0] and "upstream_ms" in access[0]
    denial = next(line for line in lines if line.get("event") == "authorization_denied")
    assert denial["principal"] == "alice" and denial["permission"] == "Write"
    assert denial["resource"] == "Subject: orders-value" and denial["mode"] == "read-only"
    assert denial["level"] == "WARNING"


def test_metrics(make_proxy: Callable[..., ProxyThread]) -> None:
    proxy = make_proxy()
    register(proxy.url, "orders-value")
    httpx.get(f"{proxy.url}/schemas/ids/1", headers=basic("alice"))
    httpx.get(f"{proxy.url}/schemas/ids/1", headers=basic("alice"))
    httpx.get(f"{proxy.url}/subjects", headers=basic("alice", "wrong"))
    register(proxy.url, "orders-value", user="bob")
    text = httpx.get(f"{proxy.url}/metrics").text
    expected = [
        'srp_http_requests_total{method="GET",route="/schemas/ids/{id}",status="200"} 2.0',
        'srp_http_requests_total{method="POST",route="/subjects/{subject}/versions",status="403"} 1.0',
        'srp_http_requests_total{method="GET",route="/subjects",status="401"} 1.0',
        'srp_upstream_request_duration_seconds_count{method="GET",route="/schemas/ids/{id}/versions",status="200"} 1.0',
        'srp_authentication_total{outcome="failure",provider="basic"}',
        'srp_authorization_total{mode="read-only",outcome="deny",permission="Write"} 1.0',
        'srp_authorization_total{mode="read-only",outcome="super_user",permission="Write"} 1.0',
        'srp_cache_requests_total{cache="schema_subjects",result="hit"} 1.0',
        'srp_cache_requests_total{cache="credentials",result="hit"}',
        "srp_http_request_duration_seconds_bucket",
    ]
    for line in expected:
        assert line in text, line


def test_the_direct_access_log_writes_the_same_json_lines(make_proxy: Callable[..., ProxyThread]) -> None:
    import io

    from kanal_registry_proxy.accesslog import AccessLog

    proxy = make_proxy(SRP_ACCESS_LOG="true")
    stream = io.BytesIO()
    proxy.service.proxy.access_writer = AccessLog(stream, "json")  # type: ignore[arg-type]
    httpx.get(f"{proxy.url}/subjects", headers={**basic("alice"), "traceparent": TRACEPARENT})
    line = json.loads(stream.getvalue().splitlines()[-1])
    assert line["logger"] == "kanal_registry_proxy.access" and line["level"] == "INFO"
    assert line["message"] == "GET /subjects 200" and line["time"].endswith("Z")
    assert line["principal"] == "alice" and line["route"] == "/subjects" and line["status"] == 200
    text = io.BytesIO()
    AccessLog(text, "text")("GET / 200", {"status": 200})  # type: ignore[arg-type]
    assert text.getvalue().decode().endswith(" INFO    kanal_registry_proxy.access: GET / 200\n")
