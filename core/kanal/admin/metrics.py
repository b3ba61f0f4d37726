"""Prometheus metrics of the admin HTTP API and of the gateway's stored state.

HTTP: ``gateway_api_request_total`` (counter), ``gateway_api_request_duration_seconds`` (histogram),
both labelled method, path (the route template, parameters written ``{name}``) and status, and
``gateway_api_requests_in_progress`` (gauge, labelled method and path). Requests that match no route
are not counted, so scanners cannot blow up the label set.

State (collected at scrape time, gauges without a ``_total`` suffix): resources per kind and status,
interceptor instances and types in the running pipeline, whether the state is loaded, and the
follower's position in the state topic.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from kanal.admin.store import ResourceStore
    from kanal.pipeline.chain import Pipeline

HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_PARAM = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")


def route_template(rule: str) -> str:
    """``/gateway/v2/interceptor/<name>`` -> ``/gateway/v2/interceptor/{name}``."""
    return _PARAM.sub(r"{\1}", rule)


class HttpMetrics:
    """The admin API's request metrics, in the gateway's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "gateway_api_request",
            "Admin HTTP API requests, by method, route and status",
            ["method", "path", "status"],
            registry=registry,
        )
        self.duration = Histogram(
            "gateway_api_request_duration_seconds",
            "Admin HTTP API request duration, by method, route and status",
            ["method", "path", "status"],
            buckets=HTTP_BUCKETS,
            registry=registry,
        )
        self.in_progress = Gauge(
            "gateway_api_requests_in_progress",
            "Admin HTTP API requests being served, by method and route",
            ["method", "path"],
            registry=registry,
        )

    def observe(self, method: str, path: str, status: int, seconds: float) -> None:
        self.requests.labels(method, path, str(status)).inc()
        self.duration.labels(method, path, str(status)).observe(seconds)


class StateCollector(Collector):
    """Gauges read from the store and the pipeline at scrape time."""

    def __init__(self, store: ResourceStore, pipeline: Pipeline) -> None:
        self.store = store
        self.pipeline = pipeline

    def collect(self) -> Iterator[Metric]:
        resources = GaugeMetricFamily(
            "gateway_resources", "Stored admin resources, by kind and status on this node", labels=["kind", "status"]
        )
        for kind in self.store.kinds:
            counts: dict[str, int] = {}
            for manifest in self.store.resources(kind.kind):
                status = self.store.status(kind, kind.key_of(manifest["metadata"]))
                label: str = status.state if status is not None else "Stored"
                counts[label] = counts.get(label, 0) + 1
            for label, count in sorted(counts.items()):
                resources.add_metric([kind.kind, label], count)
        yield resources
        specs = self.pipeline.specs()
        yield GaugeMetricFamily(
            "gateway_lived_event_interceptors_instances", "Interceptor instances configured", value=len(specs)
        )
        yield GaugeMetricFamily(
            "gateway_lived_event_interceptors_types",
            "Distinct interceptor types in use",
            value=len({s.plugin for s in specs}),
        )
        yield GaugeMetricFamily(
            "gateway_state_loaded", "1 once the state topic was read to its end", value=int(self.store.loaded.is_set())
        )
        yield GaugeMetricFamily(
            "gateway_state_offset", "Next offset the state follower reads", value=self.store.position
        )
