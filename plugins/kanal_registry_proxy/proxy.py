"""The proxy's request handling, free of any web framework: route, authenticate, authorize, forward.

Bodies go both ways unchanged; the only answers the proxy rewrites are the lists it filters (an
unfiltered list keeps the upstream's bytes). Errors the proxy makes itself use the registry's
envelope ``{"error_code": N, "message": "..."}`` with ``Content-Type:
application/vnd.schemaregistry.v1+json`` and UTF-8 text:

- 401 ``{"error_code": 401, "message": "Unauthorized"}`` with ``WWW-Authenticate``;
- 403 ``{"error_code": 40301, "message": "User is denied operation Read on Subject: orders-value"}``;
- 404 ``{"error_code": 404, "message": "HTTP 404 Not Found"}`` for a route not proxied, and
  ``{"error_code": 40403, "message": "Schema not found"}`` for an id that no subject holds;
- 502 ``50201`` / 504 ``50401`` when the upstream cannot be reached or does not answer in time.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from kanal_schemas import RegistryError, SchemaRegistryClient, Send, UnreadableAnswer
from opentelemetry import trace

from kanal_registry_proxy import routes, tracing
from kanal_registry_proxy.authorization import READ, WRITE, Authorization, Permission
from kanal_registry_proxy.metrics import ProxyMetrics
from kanal_registry_proxy.upstream import HttpClient, UpstreamError, UpstreamResponse

log = logging.getLogger(__name__)
access_log = logging.getLogger("kanal_registry_proxy.access")

Headers = list[tuple[bytes, bytes]]
CONTENT_TYPE = b"application/vnd.schemaregistry.v1+json"
_REQUEST_DROP = frozenset(
    {
        b"host",
        b"authorization",
        b"content-length",
        b"connection",
        b"keep-alive",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"expect",
    }
)
_TRACE_HEADERS = frozenset({b"traceparent", b"tracestate"})
_RESPONSE_DROP = frozenset(
    {b"content-length", b"connection", b"keep-alive", b"transfer-encoding", b"trailer", b"upgrade", b"date", b"server"}
)


@dataclass(slots=True)
class ProxyRequest:
    method: str
    raw_path: bytes
    query: bytes
    headers: Headers  # names in lower case
    body: bytes = b""
    client: str | None = None

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


@dataclass(slots=True)
class ProxyResponse:
    status: int
    headers: Headers
    body: bytes


class Authenticator(Protocol):
    """What the proxy needs of an authentication provider."""

    provider: str
    challenge: str

    async def authenticate(self, header: str | None) -> str | None: ...


def error(status: int, code: int, message: str, headers: Headers | None = None) -> ProxyResponse:
    body = orjson.dumps({"error_code": code, "message": message})
    return ProxyResponse(status, [(b"content-type", CONTENT_TYPE), *(headers or [])], body)


NOT_FOUND_BODY = orjson.dumps({"error_code": 404, "message": "HTTP 404 Not Found"})


def not_found() -> ProxyResponse:
    return ProxyResponse(404, [(b"content-type", CONTENT_TYPE)], NOT_FOUND_BODY)


def _from_upstream(response: UpstreamResponse) -> ProxyResponse:
    headers = [(name, value) for name, value in response.headers if name not in _RESPONSE_DROP]
    return ProxyResponse(response.status, headers, response.body)


class _Denied(Exception):
    def __init__(self, response: ProxyResponse) -> None:
        self.response = response


class RegistryProxy:
    def __init__(
        self,
        client: HttpClient,
        authenticator: Authenticator,
        authorization: Authorization,
        metrics: ProxyMetrics,
        *,
        subject_cache_ttl: float = 300.0,
        access_log_enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
        access_writer: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.client = client
        self.authenticator = authenticator
        self.authorization = authorization
        self.metrics = metrics
        self.subject_cache_ttl = subject_cache_ttl
        self.access_log_enabled = access_log_enabled
        # a direct writer of access lines (kanal registry-proxy); None: through logging
        self.access_writer = access_writer
        self.clock = clock
        self.tracer = tracing.tracer()
        # who holds an id or a GUID: the shared registry client, over the proxy's upstream client (its
        # calls go through _call, traced and measured); non-empty lists are kept subject_cache_ttl
        self.schemas = SchemaRegistryClient(
            transports=[client], subjects_ttl=subject_cache_ttl, subjects_cache_size=100_000, clock=clock
        )

    # -- entry point ---------------------------------------------------------------------------

    async def handle(self, request: ProxyRequest) -> ProxyResponse:
        started = time.perf_counter()
        found = routes.match(request.method, request.raw_path)
        route = found.route.template if found is not None else "unmatched"
        state: dict[str, Any] = {"tracing": tracing.enabled()}
        span = (
            self.tracer.start_span(
                f"{request.method} {route}", context=tracing.extract(request.headers), kind=tracing.SERVER
            )
            if state["tracing"]
            else trace.INVALID_SPAN
        )
        state["span"] = span
        try:
            response = await self._handle(request, found, span, state)
        except UpstreamError as exc:
            log.error("upstream registry call failed: %s", exc, extra={"route": route})
            response = (
                error(504, 50401, f"the upstream schema registry did not answer: {exc}")
                if exc.timeout
                else error(502, 50201, f"the upstream schema registry is unavailable: {exc}")
            )
        elapsed = time.perf_counter() - started
        status = response.status
        response.headers.append((b"content-length", str(len(response.body)).encode()))
        if span.is_recording():
            span.set_attributes(
                {
                    "http.request.method": request.method,
                    "http.route": route,
                    "url.path": request.raw_path.decode("latin-1"),
                    "http.response.status_code": status,
                }
            )
            principal = state.get("principal")
            if principal is not None:
                span.set_attribute("enduser.id", principal)
            if status >= 500:
                span.set_status(trace.Status(trace.StatusCode.ERROR))
        span.end()
        self.metrics.request(route, request.method, status, elapsed)
        if self.access_log_enabled and (self.access_writer is not None or access_log.isEnabledFor(logging.INFO)):
            context = span.get_span_context()
            path = request.raw_path.decode("latin-1")
            fields = {
                "method": request.method,
                "route": route,
                "path": path,
                "status": status,
                "principal": state.get("principal"),
                "client": request.client,
                "duration_ms": round(elapsed * 1000, 3),
                "upstream_ms": round(state.get("upstream", 0.0) * 1000, 3),
                "trace_id": f"{context.trace_id:032x}" if context.is_valid else None,
            }
            if self.access_writer is not None:
                self.access_writer(f"{request.method} {path} {status}", fields)
            else:
                access_log.info("%s %s %d", request.method, path, status, extra=fields)
        return response

    async def _handle(
        self, request: ProxyRequest, found: routes.Match | None, span: trace.Span, state: dict[str, Any]
    ) -> ProxyResponse:
        if found is None or found.route.check == "blocked":
            return not_found()
        authorization = request.header(b"authorization")
        principal = await self.authenticator.authenticate(
            authorization.decode("latin-1") if authorization is not None else None
        )
        if principal is None:
            return error(401, 401, "Unauthorized", [(b"www-authenticate", self.authenticator.challenge.encode())])
        state["principal"] = principal
        route, params = found.route, found.params
        check = route.check
        try:
            if check == "write" or check == "read":
                permission: Permission = WRITE if check == "write" else READ
                await self._require(principal, permission, params["subject"], route, span)
            elif check == "id":
                if not (params["id"].isascii() and params["id"].isdigit()):
                    return not_found()
                denied = await self._require_schema(
                    principal, [int(params["id"])], f"Schema: {params['id']}", route, span, state
                )
                if denied is not None:
                    return denied
            elif check == "guid":
                denied = await self._require_guid(principal, params["guid"], route, span, state)
                if denied is not None:
                    return denied
        except _Denied as exc:
            return exc.response
        response = await self._forward(request, route, span, state)
        if check == "filter" and route.filter_kind is not None:
            return await self._filter(principal, response, route.filter_kind)
        if check == "associations":
            return await self._filter_associations(principal, response)
        return response

    # -- checks --------------------------------------------------------------------------------

    async def _require(
        self, principal: str, permission: Permission, subject: str, route: routes.Route, span: trace.Span
    ) -> None:
        allowed = await self.authorization.check(principal, permission, subject)
        if span.is_recording():
            span.set_attributes({"srp.subject": subject, "srp.authorization.outcome": "allow" if allowed else "deny"})
        if not allowed:
            self._log_denial(principal, permission, f"Subject: {subject}", route)
            raise _Denied(error(403, 40301, f"User is denied operation {permission} on Subject: {subject}"))

    def _log_denial(self, principal: str, permission: str, resource: str, route: routes.Route) -> None:
        log.warning(
            "denied: %s may not %s %s",
            principal,
            permission,
            resource,
            extra={
                "event": "authorization_denied",
                "principal": principal,
                "permission": permission,
                "resource": resource,
                "route": route.template,
                "mode": self.authorization.mode.name,
            },
        )

    def _send(self, state: dict[str, Any]) -> Send:
        """The registry client's calls, made as the proxy's own upstream calls (traced, measured)."""

        async def send(method: str, target: bytes, route: str) -> UpstreamResponse:
            return await self._call(method, target, route, state)

        return send

    @staticmethod
    def _failure(exc: RegistryError) -> ProxyResponse:
        """The upstream's own answer to a lookup that failed; a call that got none fails the request as
        any upstream call does (502/504)."""
        if exc.response is not None:
            return _from_upstream(exc.response)
        if isinstance(exc.__cause__, UpstreamError):
            raise exc.__cause__
        raise exc

    async def _subjects_of(
        self, schema_id: int, context: str | None, state: dict[str, Any], refresh: bool
    ) -> list[str] | ProxyResponse:
        """Subjects that hold a schema id, from the cache or upstream; sets ``state["cached"]`` when the
        cache answered."""
        if not refresh:
            cached = self.schemas.cached_subjects_of_id(schema_id, context=context, deleted=True)
            self.metrics.cache_lookup("schema_subjects", cached is not None)
            if cached is not None:
                state["cached"] = True
                return cached
        try:
            return await self.schemas.subjects_of_id(
                schema_id, context=context, deleted=True, refresh=True, send=self._send(state)
            )
        except UnreadableAnswer:
            return error(502, 50201, "the upstream schema registry answered an unreadable subject list")
        except RegistryError as exc:
            return self._failure(exc)

    async def _require_schema(
        self,
        principal: str,
        ids: list[int],
        resource: str,
        route: routes.Route,
        span: trace.Span,
        state: dict[str, Any],
        context: str | None = None,
    ) -> ProxyResponse | None:
        """None when the principal may read some subject of the schema, else the answer to send."""
        if self.authorization.is_super_user(principal):
            await self.authorization.check(principal, READ, "")
            return None
        known = False
        for refresh in (False, True):
            subjects: set[str] = set()
            state["cached"] = False
            for schema_id in ids:
                found = await self._subjects_of(schema_id, context, state, refresh)
                if isinstance(found, ProxyResponse):
                    return found
                subjects.update(found)
            if subjects:
                known = True
                if await self.authorization.check_any(principal, READ, sorted(subjects)):
                    return None
            if not state["cached"]:
                break  # the answer was fresh: asking again would give the same one
            # a cached list may miss a subject registered since: ask again before denying
        if not known:
            return error(404, 40403, "Schema not found")
        self._log_denial(principal, READ, resource, route)
        if span.is_recording():
            span.set_attribute("srp.authorization.outcome", "deny")
        return error(403, 40301, f"User is denied operation Read on {resource}")

    async def _require_guid(
        self, principal: str, guid: str, route: routes.Route, span: trace.Span, state: dict[str, Any]
    ) -> ProxyResponse | None:
        try:
            uuid.UUID(guid)
        except ValueError:
            return not_found()
        if self.authorization.is_super_user(principal):
            await self.authorization.check(principal, READ, "")
            return None
        pairs = self.schemas.cached_ids_of_guid(guid)
        self.metrics.cache_lookup("schema_subjects", pairs is not None)
        if pairs is None:
            try:
                pairs = await self.schemas.ids_of_guid(guid, refresh=True, send=self._send(state))
            except UnreadableAnswer:
                return error(502, 50201, "the upstream schema registry answered an unreadable id list")
            except RegistryError as exc:
                return self._failure(exc)  # e.g. a registry without GUIDs: its 404
        if not pairs:
            return error(404, 40403, "Schema not found")
        last: ProxyResponse | None = None
        for context, schema_id in pairs:
            qualifier = None if context in (".", "") else f":{context}:"
            denied = await self._require_schema(
                principal, [schema_id], f"Schema: {guid}", route, span, state, qualifier
            )
            if denied is None:
                return None
            last = denied
        return last

    # -- upstream ------------------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        target: bytes,
        route: str,
        state: dict[str, Any],
        headers: Headers | None = None,
        body: bytes = b"",
    ) -> UpstreamResponse:
        outgoing = headers if headers is not None else [(b"accept", CONTENT_TYPE)]
        span = (
            self.tracer.start_span(
                f"upstream {method} {route}", context=trace.set_span_in_context(state["span"]), kind=tracing.CLIENT
            )
            if state["tracing"]
            else trace.INVALID_SPAN
        )
        tracing.inject(span, outgoing)
        started = time.perf_counter()
        status = "error"
        try:
            response = await self.client.request(method, target, outgoing, body)
            status = str(response.status)
            return response
        finally:
            elapsed = time.perf_counter() - started
            state["upstream"] = state.get("upstream", 0.0) + elapsed
            self.metrics.upstream_call(route, method, status, elapsed)
            if span.is_recording():
                span.set_attributes(
                    {
                        "http.request.method": method,
                        "server.address": self.client.host,
                        "server.port": self.client.port,
                        "http.response.status_code": int(status) if status.isdigit() else 0,
                    }
                )
            span.end()

    async def _forward(
        self, request: ProxyRequest, route: routes.Route, server_span: trace.Span, state: dict[str, Any]
    ) -> ProxyResponse:
        tracing_on = state["tracing"]
        headers = [
            (name, value)
            for name, value in request.headers
            if name not in _REQUEST_DROP and not (tracing_on and name in _TRACE_HEADERS)
        ]
        if request.method in ("POST", "PUT") and request.header(b"content-type") is None:
            headers.append((b"content-type", CONTENT_TYPE))  # Karapace fails on a missing one
        target = routes.upstream_path(request.raw_path)
        if request.query:
            target += b"?" + request.query
        if tracing_on:  # our span's context replaces the client's; without tracing it passes as sent
            outgoing_span = self.tracer.start_span(
                f"upstream {request.method} {route.template}",
                context=trace.set_span_in_context(server_span),
                kind=tracing.CLIENT,
            )
            tracing.inject(outgoing_span, headers)
        else:
            outgoing_span = trace.INVALID_SPAN
        started = time.perf_counter()
        status = "error"
        try:
            response = await self.client.request(request.method, target, headers, request.body)
            status = str(response.status)
        finally:
            elapsed = time.perf_counter() - started
            state["upstream"] = state.get("upstream", 0.0) + elapsed
            self.metrics.upstream_call(route.template, request.method, status, elapsed)
            if outgoing_span.is_recording():
                outgoing_span.set_attributes(
                    {
                        "http.request.method": request.method,
                        "server.address": self.client.host,
                        "server.port": self.client.port,
                        "http.response.status_code": int(status) if status.isdigit() else 0,
                    }
                )
            outgoing_span.end()
        return _from_upstream(response)

    # -- filtering -----------------------------------------------------------------------------

    async def _filter(self, principal: str, response: ProxyResponse, kind: str) -> ProxyResponse:
        if response.status != 200:
            return response
        try:
            items = orjson.loads(response.body)
        except orjson.JSONDecodeError:
            return error(502, 50201, "the upstream schema registry answered a list the proxy cannot read")
        if not isinstance(items, list):
            return error(502, 50201, "the upstream schema registry answered a list the proxy cannot read")

        def subject_of(item: Any) -> str | None:
            if kind == "subjects":
                return item if isinstance(item, str) else None
            value = item.get("subject") if isinstance(item, dict) else None
            return value if isinstance(value, str) else None

        named = [subject_of(item) for item in items]
        readable = await self.authorization.readable(principal, [s for s in named if s is not None])
        kept = [item for item, subject in zip(items, named, strict=True) if subject is not None and subject in readable]
        if len(kept) == len(items):
            return response  # the upstream's bytes, unchanged
        response.body = orjson.dumps(kept)
        return response

    async def _filter_associations(self, principal: str, response: ProxyResponse) -> ProxyResponse:
        if response.status != 200:
            return response  # 404 is what keeps confluent-kafka's serializers on the topic name strategy
        try:
            document = orjson.loads(response.body)
        except orjson.JSONDecodeError:
            return error(502, 50201, "the upstream schema registry answered associations the proxy cannot read")
        holder: Any = document
        if isinstance(document, dict):
            holder = document.get("associations")
        if not isinstance(holder, list) or not all(isinstance(a, dict) for a in holder):
            return error(403, 40301, "User is denied operation Read on this association")
        subjects = [a.get("subject") for a in holder]
        readable = await self.authorization.readable(principal, [s for s in subjects if isinstance(s, str)])
        kept = [a for a, s in zip(holder, subjects, strict=True) if isinstance(s, str) and s in readable]
        if len(kept) == len(holder):
            return response
        if isinstance(document, dict):
            document["associations"] = kept
            response.body = orjson.dumps(document)
        else:
            response.body = orjson.dumps(kept)
        return response
