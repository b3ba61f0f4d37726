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
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ProxyMetrics:
    """Every metric of one proxy, with label children cached for the request path."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "srp_http_requests",
            "Proxy requests by route template, method and status",
            ["route", "method", "status"],
            registry=r,
        )
        self.duration = Histogram(
            "srp_http_request_duration_seconds",
            "Proxy request duration",
            ["route", "method"],
            buckets=BUCKETS,
            registry=r,
        )
        self.upstream = Histogram(
            "srp_upstream_request_duration_seconds",
            "Upstream registry call duration by route template, method and status",
            ["route", "method", "status"],
            buckets=BUCKETS,
            registry=r,
        )
        self.authentication = Counter(
            "srp_authentication", "Authentication outcomes", ["provider", "outcome"], registry=r
        )
        self.authorization = Counter(
            "srp_authorization", "Authorization decisions", ["mode", "permission", "outcome"], registry=r
        )
        self.cache = Counter("srp_cache_requests", "Cache lookups by cache and result", ["cache", "result"], registry=r)
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
        self._children: dict[tuple[object, ...], MetricWrapperBase] = {}

    def _child(self, metric: MetricWrapperBase, *labels: str) -> MetricWrapperBase:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        self._child(self.requests, route, method, str(status)).inc()  # type: ignore[attr-defined]
        self._child(self.duration, route, method).observe(seconds)  # type: ignore[attr-defined]

    def upstream_call(self, route: str, method: str, status: str, seconds: float) -> None:
        self._child(self.upstream, route, method, status).observe(seconds)  # type: ignore[attr-defined]

    def authenticated(self, provider: str, outcome: str) -> None:
        self._child(self.authentication, provider, outcome).inc()  # type: ignore[attr-defined]

    def authorized(self, mode: str, permission: str, outcome: str) -> None:
        self._child(self.authorization, mode, permission, outcome).inc()  # type: ignore[attr-defined]

    def cache_lookup(self, cache: str, hit: bool) -> None:
        self._child(self.cache, cache, "hit" if hit else "miss").inc()  # type: ignore[attr-defined]

    def license_expiry(self, expires_at: int | None) -> None:
        """Exports the expiry; a license without one exports nothing."""
        if expires_at is None:
            return
        if self._license_expiry is None:
            self._license_expiry = Gauge(
                "license_expiry_timestamp_seconds", "Unix time at which the license expires", registry=self.registry
            )
        self._license_expiry.set(expires_at)
