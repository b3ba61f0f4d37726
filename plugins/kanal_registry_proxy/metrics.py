"""Prometheus metrics of the proxy.

Names (all in one registry, served on ``GET /metrics`` of the proxy's port, and on the gateway's
``/metrics`` when ``kanal run`` hosts the proxy):

- ``srp_http_requests_total{route,method,status}``: requests, by route template (``/subjects/{subject}/versions``),
  method and status; requests that match no route are counted under the route ``unmatched``.
- ``srp_http_request_duration_seconds{route,method}``: time from request to response.
- ``srp_upstream_request_duration_seconds{route,method,status}``: time of each upstream registry call
  (status ``error`` when no response came back).
- ``srp_authentication_total{provider,outcome}``: success, failure, malformed (no or unreadable
  credentials).
- ``srp_authorization_total{mode,permission,outcome}``: allow or deny per permission check
  (``super_user`` for a bypass).
- ``srp_cache_requests_total{cache,result}``: hit or miss, for the caches ``credentials`` (verified
  basic credentials), ``jwt`` (verified tokens), ``schema_subjects`` (id/GUID to subjects) and ``topic_acl``.
- ``srp_topic_acl_lookups_total{outcome}``: DescribeAcls lookups: ok, error, timeout.
- ``srp_reactive_commands_total{outcome}``, ``srp_reactive_permission_sets``: reactive mode.
- ``basic_auth_credentials_reload_total{outcome}``: success or failure of credential file reloads.
- ``license_expiry_timestamp_seconds``: Unix time the license expires (absent without an expiry).

The metrics counted on every request (the first six) are kept as plain numbers and exported by a
collector when scraped: an update is a dict lookup and an addition, where a prometheus_client child
costs a lock and several calls; counting four to six things per request that way was about 17 us of
the proxy's own work per request. The exposition is the same (``_total``, ``_bucket``, ``_count``,
``_sum``, ``_created`` samples).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

Labels = tuple[str, ...]


class _Counter:
    """A labelled counter as plain numbers: per label values, [count, creation time]."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self.values: dict[Labels, list[float]] = {}

    def inc(self, labels: Labels) -> None:
        entry = self.values.get(labels)
        if entry is None:
            self.values[labels] = [1.0, time.time()]
        else:
            entry[0] += 1.0

    def family(self) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, (count, created) in list(self.values.items()):  # list(): one step, safe from other threads
            family.add_metric(labels, count, created=created)
        return family


class _Histogram:
    """A labelled histogram as plain numbers: per label values, [bucket counts, sum, creation time]."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self.bounds = tuple(float(b) for b in buckets)
        self.les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        self.values: dict[Labels, tuple[list[int], list[float]]] = {}

    def observe(self, labels: Labels, seconds: float) -> None:
        entry = self.values.get(labels)
        if entry is None:
            entry = self.values[labels] = ([0] * (len(self.bounds) + 1), [0.0, time.time()])
        entry[0][bisect_left(self.bounds, seconds)] += 1  # upper bounds are inclusive, as Prometheus has them
        entry[1][0] += seconds

    def family(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, (counts, (total, created)) in list(self.values.items()):
            cumulative = 0.0
            buckets = []
            for le, count in zip(self.les, list(counts), strict=True):
                cumulative += count
                buckets.append((le, cumulative))
            family.add_metric(labels, buckets, total)
            family.add_sample(self.name + "_created", dict(zip(self.labelnames, labels, strict=True)), created)
        return family


class _Collector:
    """Exports the per-request metrics when the registry is collected."""

    def __init__(self, metrics: Sequence[_Counter | _Histogram]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        for metric in self.metrics:
            yield metric.family()

    def describe(self) -> Iterator[Metric]:
        for metric in self.metrics:
            family = CounterMetricFamily if isinstance(metric, _Counter) else HistogramMetricFamily
            yield family(metric.name, metric.documentation, labels=metric.labelnames)


class ProxyMetrics:
    """Every metric of one proxy; the per-request ones as plain numbers (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = _Counter(
            "srp_http_requests", "Proxy requests by route template, method and status", ["route", "method", "status"]
        )
        self.duration = _Histogram(
            "srp_http_request_duration_seconds", "Proxy request duration", ["route", "method"], BUCKETS
        )
        self.upstream = _Histogram(
            "srp_upstream_request_duration_seconds",
            "Upstream registry call duration by route template, method and status",
            ["route", "method", "status"],
            BUCKETS,
        )
        self.authentication = _Counter("srp_authentication", "Authentication outcomes", ["provider", "outcome"])
        self.authorization = _Counter("srp_authorization", "Authorization decisions", ["mode", "permission", "outcome"])
        self.cache = _Counter("srp_cache_requests", "Cache lookups by cache and result", ["cache", "result"])
        per_request: list[_Counter | _Histogram] = [
            self.requests,
            self.duration,
            self.upstream,
            self.authentication,
            self.authorization,
            self.cache,
        ]
        r.register(_Collector(per_request))
        self.acl_lookups = Counter("srp_topic_acl_lookups", "DescribeAcls lookups by outcome", ["outcome"], registry=r)
        self.reactive_commands = Counter(
            "srp_reactive_commands", "Reactive-mode commands read, by outcome", ["outcome"], registry=r
        )
        self.reactive_sets = Gauge(
            "srp_reactive_permission_sets", "Application instances with permissions known to this proxy", registry=r
        )
        self.credentials_reload = Counter(
            "basic_auth_credentials_reload", "Outcomes of credential file reloads", ["outcome"], registry=r
        )
        self.credentials_users = Gauge("srp_basic_auth_users", "Users in the active credential set", registry=r)
        self._license_expiry: Gauge | None = None

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.inc((route, method, str(status)))
        self.duration.observe((route, method), seconds)

    def upstream_call(self, route: str, method: str, status: str, seconds: float) -> None:
        self.upstream.observe((route, method, status), seconds)

    def authenticated(self, provider: str, outcome: str) -> None:
        self.authentication.inc((provider, outcome))

    def authorized(self, mode: str, permission: str, outcome: str) -> None:
        self.authorization.inc((mode, permission, outcome))

    def cache_lookup(self, cache: str, hit: bool) -> None:
        self.cache.inc((cache, "hit" if hit else "miss"))

    def license_expiry(self, expires_at: int | None) -> None:
        """Exports the expiry; a license without one exports nothing."""
        if expires_at is None:
            return
        if self._license_expiry is None:
            self._license_expiry = Gauge(
                "license_expiry_timestamp_seconds", "Unix time at which the license expires", registry=self.registry
            )
        self._license_expiry.set(expires_at)
