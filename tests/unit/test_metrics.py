"""The per-API request metrics as a scrape shows them."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kanal.metrics import LATENCY_BUCKETS, GatewayMetrics
from kanal.protocol.api import ApiKey


def _scrape(metrics: GatewayMetrics) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    text = generate_latest(metrics.registry).decode()
    return {f.name: [(s.name, s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text)}


def test_requests_responses_bytes_and_latency_by_api() -> None:
    metrics = GatewayMetrics()
    families = _scrape(metrics)
    assert families["gateway_latency_request_response_seconds"] == []  # declared before any traffic
    metrics.request(ApiKey.PRODUCE, 100)
    metrics.request(ApiKey.PRODUCE, 50)
    metrics.request(ApiKey.METADATA, 10)
    metrics.response(ApiKey.PRODUCE, 20, 0.001)  # on a bound: counted in that bucket
    metrics.response(ApiKey.PRODUCE, 20, 0.0011)
    metrics.response(ApiKey.PRODUCE, 20, 100.0)  # above every bound
    value = {(name, labels.get("api_key"), labels.get("le")): v for name, labels, v in _flatten(_scrape(metrics))}
    assert value["gateway_requests_total", "Produce", None] == 2
    assert value["gateway_requests_total", "Metadata", None] == 1
    assert value["gateway_request_bytes_total", "Produce", None] == 158  # with the 4-byte size prefixes
    assert value["gateway_responses_total", "Produce", None] == 3
    assert value["gateway_response_bytes_total", "Produce", None] == 72
    bucket = "gateway_latency_request_response_seconds_bucket"
    assert value[bucket, "Produce", "0.0005"] == 0
    assert value[bucket, "Produce", "0.001"] == 1
    assert value[bucket, "Produce", "0.0025"] == 2
    assert value[bucket, "Produce", str(LATENCY_BUCKETS[-1])] == 2
    assert value[bucket, "Produce", "+Inf"] == 3
    assert value["gateway_latency_request_response_seconds_count", "Produce", None] == 3
    assert abs(value["gateway_latency_request_response_seconds_sum", "Produce", None] - 100.0021) < 1e-9
    assert ("gateway_responses_total", "Metadata", None) in value  # zero, but there


def _flatten(families: dict[str, list[tuple[str, dict[str, str], float]]]) -> list[tuple[str, dict[str, str], float]]:
    return [sample for samples in families.values() for sample in samples]
