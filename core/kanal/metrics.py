"""Prometheus metrics of the Kafka side of the gateway.

Counted per frame, never per record. The per-API request and response figures are counted on every
request, so they are plain integers read at scrape time (:class:`_PerApi`) rather than
``prometheus_client`` children, each of which takes a lock per increment (a histogram observation
and three increments cost about 4 us a request, 2% of the gateway's CPU per one-record Produce).
The gateway counts from one thread; a scrape may see a request counted before its bytes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from kanal.protocol.api import api_name

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _Counts:
    __slots__ = ("buckets", "latency_sum", "request_bytes", "requests", "response_bytes", "responses")

    def __init__(self) -> None:
        self.requests = self.request_bytes = self.responses = self.response_bytes = 0
        self.latency_sum = 0.0
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)  # the last one: above every bound (+Inf)


class _PerApi(Collector):
    """Requests, responses, their bytes and latency by API, exposed as Prometheus families."""

    def __init__(self) -> None:
        self.counts: dict[int, _Counts] = {}

    def of(self, api_key: int) -> _Counts:
        counts = self.counts.get(api_key)
        if counts is None:
            counts = self.counts[api_key] = _Counts()
        return counts

    def collect(self) -> Iterator[Metric]:
        latency = HistogramMetricFamily(
            "gateway_latency_request_response_seconds",
            "Time from a client request to its response, by API",
            labels=["api_key"],
        )
        families = [
            (CounterMetricFamily("gateway_requests", "Client requests, by API", labels=["api_key"]), "requests"),
            (
                CounterMetricFamily("gateway_request_bytes", "Bytes of client requests, by API", labels=["api_key"]),
                "request_bytes",
            ),
            (
                CounterMetricFamily("gateway_responses", "Responses sent to clients, by API", labels=["api_key"]),
                "responses",
            ),
            (
                CounterMetricFamily(
                    "gateway_response_bytes", "Bytes of responses sent to clients, by API", labels=["api_key"]
                ),
                "response_bytes",
            ),
        ]
        for api_key, counts in sorted(self.counts.items()):
            name = api_name(api_key)
            for family, field in families:
                family.add_metric([name], getattr(counts, field))
            cumulative, buckets = 0, []
            for bound, count in zip((*LATENCY_BUCKETS, float("inf")), counts.buckets, strict=True):
                cumulative += count
                buckets.append((_bound_label(bound), cumulative))
            latency.add_metric([name], buckets, counts.latency_sum)
        yield latency
        for family, _ in families:
            yield family


def _bound_label(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


class GatewayMetrics:
    """The gateway's Kafka-side metrics in their own registry (served at ``/metrics``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self._per_api = _PerApi()
        r.register(self._per_api)
        self.client_connections = Gauge("gateway_client_connections_active", "Open client connections", registry=r)
        self.upstream_connections = Gauge(
            "gateway_upstream_connections_active", "Open upstream connections", registry=r
        )
        self.streamed = Counter(
            "gateway_streamed_responses",
            "Responses forwarded while they arrived (cut-through), by API",
            ["api_key"],
            registry=r,
        )
        self.streamed_requests = Counter(
            "gateway_streamed_requests",
            "Requests forwarded while they arrived (cut-through), by API",
            ["api_key"],
            registry=r,
        )
        self.upstream_errors = Counter("gateway_upstream_errors", "Failed or lost upstream connections", registry=r)
        self.failed_authentications = Counter(
            "gateway_failed_authentications",
            "Client authentications refused, by SASL mechanism",
            ["mechanism"],
            registry=r,
        )
        self.audit_written = Counter(
            "gateway_audit_events_written", "Audit events written to the audit log topic", registry=r
        )
        self.audit_dropped = Counter(
            "gateway_audit_events_dropped",
            "Audit events dropped, oldest first, because more waited to be written than the buffer holds"
            " (the audit log topic unreachable)",
            registry=r,
        )
        self.audit_pending = Gauge(
            "gateway_audit_events_pending", "Audit events waiting to be written to the audit log topic", registry=r
        )
        self.fleet_members = Gauge(
            "gateway_fleet_members",
            "Members of the fleet's membership group as this node last learnt them (itself alone before its"
            " first join)",
            registry=r,
        )
        self.lifecycle: Histogram | None = None
        self._lifecycle_bound: dict[tuple[str, int, str], Histogram] = {}

    def enable_lifecycle(self) -> None:
        """Per-stage timings (GATEWAY_FEATURE_FLAGS_LIFECYCLE_METRICS): off by default because
        they cost an observation per hook call."""
        self.lifecycle = Histogram(
            "gateway_request_lifecycle_seconds",
            "Time spent in each stage of a request: an interceptor's hook (request, response,"
            " produce_records, fetch_records) or the upstream round trip",
            ["stage", "api_key", "interceptor"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

    def stage(self, stage: str, api_key: int, interceptor: str, seconds: float) -> None:
        """Records one stage timing; only called when lifecycle metrics are enabled."""
        assert self.lifecycle is not None
        key = (stage, api_key, interceptor)
        child = self._lifecycle_bound.get(key)
        if child is None:
            child = self._lifecycle_bound[key] = self.lifecycle.labels(stage, api_name(api_key), interceptor)
        child.observe(seconds)

    def request(self, api_key: int, size: int) -> None:
        counts = self._per_api.of(api_key)
        counts.requests += 1
        counts.request_bytes += size + 4

    def response(self, api_key: int, size: int, seconds: float) -> None:
        counts = self._per_api.of(api_key)
        counts.responses += 1
        counts.response_bytes += size + 4
        counts.latency_sum += seconds
        counts.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1  # (a bucket's bound is inclusive)

    def streamed_response(self, api_key: int) -> None:
        self.streamed.labels(api_name(api_key)).inc()

    def streamed_request(self, api_key: int) -> None:
        self.streamed_requests.labels(api_name(api_key)).inc()

    def failed_authentication(self, mechanism: str) -> None:
        self.failed_authentications.labels(mechanism).inc()

    def upstream_error(self) -> None:
        self.upstream_errors.inc()
