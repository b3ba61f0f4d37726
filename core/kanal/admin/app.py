"""The admin HTTP API: a Quart app (quart-trio) served by Hypercorn in the gateway's own trio run.

Routes: health (``/health/live``, ``/health/ready``), ``/versions``, ``/metrics``, ``/openapi.json``,
the resource kinds' generic routes under ``/gateway/v2/<path>``, the interceptor resolver, the token
route of service accounts, the plugin catalogue, the audit log (``/gateway/v2/audit``), the fleet's
members (``/gateway/v2/fleet``), and whatever plugins add through the ``kanal_admin_routes`` hook.

Every route except health, versions, metrics and the OpenAPI document needs HTTP Basic credentials of a
``GATEWAY_ADMIN_API_USERS`` user; changes need an ``admin: true`` user. With no users configured the
API answers 503 and says how to configure it. Once the gateway starts shutting down, every call but
``/health/live`` and ``/metrics`` answers 503.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from quart import Response, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from kanal import __version__
from kanal.admin.audit import audit, audit_log_of, host_port
from kanal.admin.fleet import add_routes as fleet_routes
from kanal.admin.identity import KIND as SERVICE_ACCOUNT
from kanal.admin.identity import mint_token
from kanal.admin.interceptors import plugin_catalogue, resolve
from kanal.admin.metrics import HttpMetrics, route_template
from kanal.admin.store import Change, ResourceStore
from kanal.api.resources import KindRegistry, Manifest, ResourceError, ResourceKind, invalid, lookup
from kanal.audit import ADMIN_API_CALL, AUTHENTICATION, AuditLog, BadFilter, parse_query
from kanal.config.users import EXAMPLE, USERS_ENV, AdminUser, authenticate
from kanal.protocol.records import record_walker

if TYPE_CHECKING:
    from kanal.admin.host import GatewayHost
    from kanal.api.services import Service

log = logging.getLogger(__name__)

API_PREFIX = "/gateway/v2"
PUBLIC_ENDPOINTS = frozenset({"health_live", "health_ready", "versions", "metrics", "openapi", "root"})
DURING_SHUTDOWN = frozenset({"health_live", "metrics"})

View = Callable[..., Awaitable[Any]]


@dataclass
class AdminApi:
    """What the admin routes work with; plugins get it in ``kanal_admin_routes(admin)``.

    ``route(rule, methods, read_only=...)`` registers a view behind the API's authentication: GET
    routes (and those marked ``read_only``) are open to every user, other methods to admin users only.
    ``audit(action, **fields)`` records an admin change with the caller and their address (in the
    audit log, as an ``ADMIN_API_CALL`` event, and in the ``kanal.audit`` log lines).
    """

    gateway: GatewayHost
    store: ResourceStore
    kinds: KindRegistry
    users: tuple[AdminUser, ...]
    app: QuartTrio = field(init=False)
    read_only_endpoints: set[str] = field(default_factory=set)
    http_metrics: HttpMetrics | None = None
    audit_log: AuditLog | None = None  # the gateway's, unless given
    #: The web console's guard of its pages (``/console``: a login form and sessions, not HTTP Basic
    #: alone); None without a console. See :mod:`kanal.admin.console.app`.
    console_guard: Callable[[], Awaitable[Response | None]] | None = None
    #: Companion services the admin plane needs beside its HTTP server (the console's metrics history).
    background: list[Service] = field(default_factory=list)

    def route(
        self, rule: str, methods: Sequence[str] = ("GET",), *, read_only: bool | None = None
    ) -> Callable[[View], View]:
        def register(view: View) -> View:
            endpoint = f"{view.__module__}.{view.__qualname__}".replace(".", "_").replace("<", "").replace(">", "")
            self.app.add_url_rule(rule, endpoint, view, methods=list(methods))
            if read_only or (read_only is None and set(methods) <= {"GET", "HEAD"}):
                self.read_only_endpoints.add(endpoint)
            return view

        return register

    @staticmethod
    def current_user() -> AdminUser | None:
        user: AdminUser | None = g.get("user")
        return user

    def audit(self, action: str, **fields: Any) -> None:
        user = self.current_user()
        client, listener = host_port(request.scope.get("client")), host_port(request.scope.get("server"))
        audit(
            "ADMIN_API",
            action,
            {
                **fields,
                "user": user.username if user else None,
                "clientAddress": client,
                "listenerAddress": listener,
                "method": request.method,
                "path": request.path,
            },
        )
        if self.audit_log is not None:
            scope = fields.get("scope")
            self.audit_log.emit(
                ADMIN_API_CALL,
                user=user.username if user else None,
                vcluster=scope.get("vCluster") if isinstance(scope, Mapping) else None,
                local_address=listener,
                remote_address=client,
                event_data={
                    "action": action,
                    **{k: v for k, v in fields.items() if v is not None},
                    "method": request.method,
                    "path": request.path,
                },
            )


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body, option=orjson.OPT_INDENT_2), status, content_type="application/json")


def error_response(status: int, title: str, msg: str, cause: str | None = None) -> Response:
    response = json_response({"title": title, "msg": msg, "cause": cause}, status)
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Basic realm="kanal"'
    return response


async def json_body(required: bool = True) -> Any:
    """The request's JSON body (400 if it is not JSON)."""
    data = await request.get_data()
    if not data or not data.strip():
        if required:
            raise invalid("a JSON body is required")
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        try:  # YAML is a convenience for curl users
            import yaml

            return yaml.safe_load(data)
        except Exception:
            raise invalid("the body is not valid JSON") from None


def _flag(name: str) -> bool:
    return request.args.get(name, "false").strip().lower() in ("true", "1", "yes")


def create_app(api: AdminApi, extra_routes: Iterable[Callable[[AdminApi], None]] = ()) -> QuartTrio:
    """The Quart app of one gateway."""
    app = QuartTrio("kanal.admin")
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    app.config["MAX_CONTENT_LENGTH"] = 16 * 1024 * 1024
    api.app = app
    gateway, store, kinds = api.gateway, api.store, api.kinds
    if api.audit_log is None:
        api.audit_log = audit_log_of(gateway)
    if api.audit_log is not None and api.users:
        # this node answers GET /gateway/v2/audit from the whole fleet's events (not without users:
        # then nobody may ask, and the gateway opens no connection for it)
        api.audit_log.follow_topic()
    if api.http_metrics is None:
        api.http_metrics = HttpMetrics(gateway.metrics.registry)
    metrics = api.http_metrics

    # -- request lifecycle: metrics, shutdown, authentication -----------------------------------

    @app.before_request
    async def _before() -> Response | None:
        rule = request.url_rule
        if rule is None:
            return None  # no route: answered 404 (or 405) below, and not counted
        g.route = route_template(rule.rule)
        g.started = time.perf_counter()
        metrics.in_progress.labels(request.method, g.route).inc()
        g.counted = True
        endpoint = request.endpoint or ""
        if gateway.stopping.is_set() and endpoint not in DURING_SHUTDOWN:
            if endpoint == "health_ready":
                return Response("NOTREADY", 503, content_type="text/plain")
            return error_response(503, "Shutting down", "the gateway is shutting down")
        if endpoint in PUBLIC_ENDPOINTS:
            return None
        if api.console_guard is not None and (request.path == "/console" or request.path.startswith("/console/")):
            return await api.console_guard()
        if not api.users:
            return error_response(
                503,
                "Admin API disabled",
                f"no admin API users are configured: set {USERS_ENV}, e.g. {USERS_ENV}='{EXAMPLE}'",
            )
        user = authenticate(api.users, request.headers.get("Authorization"))
        if user is None:
            client = host_port(request.scope.get("client"))
            audit(
                "AUTHENTICATION",
                "ADMIN_API_LOGIN",
                {"result": "FAILURE", "clientAddress": client, "path": request.path},
            )
            if api.audit_log is not None:
                api.audit_log.emit(
                    AUTHENTICATION,
                    user=None,
                    vcluster=None,
                    local_address=host_port(request.scope.get("server")),
                    remote_address=client,
                    event_data="admin API: invalid credentials",
                )
            return error_response(401, "Unauthorized", "valid HTTP Basic credentials of an admin API user are required")
        g.user = user
        if not user.admin and endpoint not in api.read_only_endpoints:
            return error_response(403, "Forbidden", f"user {user.username!r} is read-only (admin: false)")
        return None

    @app.after_request
    async def _after(response: Response) -> Response:
        if g.get("counted"):
            metrics.observe(request.method, g.route, response.status_code, time.perf_counter() - g.started)
        return response

    @app.teardown_request
    async def _teardown(exc: BaseException | None) -> None:
        if g.get("counted"):
            metrics.in_progress.labels(request.method, g.route).dec()
            g.counted = False

    @app.errorhandler(ResourceError)
    async def _resource_error(exc: ResourceError) -> Response:
        return error_response(exc.status, exc.title, exc.msg, exc.cause)

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Response:
        code = exc.code or 500
        return error_response(code, exc.name, exc.description or exc.name)

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception) -> Response:
        log.exception("admin API: %s %s failed", request.method, request.path)
        return error_response(500, "Internal error", f"{type(exc).__name__}: {exc}")

    # -- health, versions, metrics, OpenAPI -------------------------------------------------------

    async def health_live() -> Response:
        """Liveness: 200 while the process serves HTTP."""
        return Response("LIVE", 200, content_type="text/plain")

    async def health_ready() -> Response:
        """Readiness: READY once the upstream is reachable and the state is loaded, else 503 NOTREADY."""
        if store.loaded.is_set() and store.reachable():
            return Response("READY", 200, content_type="text/plain")
        return Response("NOTREADY", 503, content_type="text/plain")

    async def versions() -> Response:
        """The gateway's version, the resource API versions, the installed plugins' versions and which
        record walk runs (``compiled``: the C module; ``python``: its pure-Python reference)."""
        plugins = {p["plugin"]: p["version"] for p in plugin_catalogue(gateway.registry)}
        return json_response(
            {
                "gateway": __version__,
                "apiVersions": ["gateway/v2"],
                "plugins": plugins,
                "recordWalker": record_walker(),
            }
        )

    async def metrics_view() -> Response:
        """Prometheus exposition of every gateway metric."""
        return Response(generate_latest(gateway.metrics.registry), 200, content_type=CONTENT_TYPE_LATEST)

    async def openapi() -> Response:
        """The OpenAPI 3.1 document of this gateway's admin API."""
        from kanal.admin.openapi import openapi_document

        return json_response(openapi_document(app, kinds, api.read_only_endpoints, PUBLIC_ENDPOINTS))

    async def root() -> Response:
        """Where to find the API description."""
        return json_response({"gateway": __version__, "openapi": "/openapi.json", "api": API_PREFIX})

    for rule, endpoint, view in (
        ("/health/live", "health_live", health_live),
        ("/health/ready", "health_ready", health_ready),
        ("/versions", "versions", versions),
        ("/metrics", "metrics", metrics_view),
        ("/openapi.json", "openapi", openapi),
        ("/", "root", root),
    ):
        app.add_url_rule(rule, endpoint, view, methods=["GET"])

    # -- core API: kinds, interceptor resolver, plugin catalogue ----------------------------------

    async def resource_kinds() -> Response:
        """The resource kinds this gateway knows (used by the CLI)."""
        return json_response(kinds.describe())

    async def plugins() -> Response:
        """Installed interceptor types: plugin, docs and config schema."""
        return json_response(plugin_catalogue(gateway.registry))

    async def audit_events() -> Response:
        """Audit events, newest first (filters: type, principal, from, to, limit).

        Logins, admin changes and plugins' decisions of every gateway node of the cluster, from the
        audit log topic (the most recent events of each type; older ones stay in the topic). ``type``:
        one or more, comma-separated; ``principal``: the userName; ``from`` and ``to``: ISO-8601 or
        epoch milliseconds, both included; ``limit``: 1 to 10000, 100 by default.
        """
        audit_log = api.audit_log
        if audit_log is None or not audit_log.enabled:
            raise ResourceError(404, "Not found", "the audit log is off (GATEWAY_FEATURE_FLAGS_AUDIT=false)")
        try:
            query = parse_query(request.args)
        except BadFilter as exc:
            raise ResourceError(400, "Invalid filter", str(exc)) from None
        return json_response(audit_log.query(query))

    fleet_routes(api)
    app.add_url_rule(f"{API_PREFIX}/resource-kinds", "resource_kinds", resource_kinds, methods=["GET"])
    app.add_url_rule(f"{API_PREFIX}/plugin", "plugins", plugins, methods=["GET"])
    app.add_url_rule(f"{API_PREFIX}/audit", "audit", audit_events, methods=["GET"])
    api.read_only_endpoints.update({"resource_kinds", "plugins", "audit"})

    interceptor = kinds.get("Interceptor")
    if interceptor is not None:
        ic = interceptor

        async def interceptor_resolve() -> Response:
            """The effective interceptor chain for {username, groups, vCluster}, in order."""
            return json_response(resolve(gateway, ic, await json_body(required=False)))

        app.add_url_rule(
            f"{API_PREFIX}/interceptor/resolve", "interceptor_resolve", interceptor_resolve, methods=["POST"]
        )
        api.read_only_endpoints.add("interceptor_resolve")

    if kinds.get(SERVICE_ACCOUNT) is not None:
        accounts = gateway.service_accounts

        async def token() -> Response:
            """Mints a gateway token, the SASL PLAIN password of a LOCAL service account, for
            {username, vCluster, lifeTimeSeconds}; needs GATEWAY_USER_POOL_SECRET_KEY."""
            minted = mint_token(accounts, gateway.settings.user_pool_secret_key, await json_body())
            api.audit(  # never the token
                "MINT_TOKEN",
                kind=SERVICE_ACCOUNT,
                resourceName=minted.account.name,
                scope={"vCluster": minted.account.vcluster} if minted.account.vcluster is not None else None,
                lifeTimeSeconds=minted.lifetime_seconds,
                result="SUCCESS",
            )
            return json_response({"token": minted.token})

        app.add_url_rule(f"{API_PREFIX}/token", "token", token, methods=["POST"])

    for kind in kinds:
        _kind_routes(api, kind)

    for add in extra_routes:
        add(api)
    return app


def _kind_routes(api: AdminApi, kind: ResourceKind) -> None:
    app, store = api.app, api.store
    base = f"{API_PREFIX}/{kind.path}"
    ident = kind.path.replace("-", "_")

    def listed(params: Any) -> list[Manifest]:
        out: list[Manifest] = []
        stored = [store.with_status(kind, m) for m in store.resources(kind.kind)]
        static = [
            {**m, "status": {"status": "Ready", "message": "from the config file"}}
            for m in (kind.static() if kind.static else [])
        ]
        name = params.get("name")
        only_global = params.get("global")
        for manifest in static + stored:
            if name and manifest["metadata"].get("name") != name:
                continue
            key = kind.key_of(manifest["metadata"])
            if only_global is not None and (str(only_global).lower() in ("true", "1", "")) != all(
                v is None for v in key[1:]
            ):
                continue
            if any(
                param in params and lookup(manifest, path) != params[param] for param, path in kind.list_filters.items()
            ):
                continue
            out.append(manifest)
        return out

    async def list_view() -> Response:
        return json_response(listed(request.args))

    async def put_view() -> Response:
        body = await json_body()
        dry = _flag("dryMode") or _flag("dryRun")
        change = await store.put(kind, body, dry_run=dry)
        if not dry and change.result != "NOT_CHANGED":
            _audit_change(api, kind, change)
        return json_response({"resource": change.resource, "upsertResult": change.result})

    async def get_view(name: str) -> Response:
        metadata = kind.delete_metadata(name, _key_params(kind, request.args))
        key = kind.key_of(metadata)
        manifest = store.get(kind.kind, key)
        if manifest is None:
            for static in kind.static() if kind.static else []:
                if kind.key_of(static["metadata"]) == key:
                    return json_response({**static, "status": {"status": "Ready", "message": "from the config file"}})
            raise ResourceError(404, "Not found", f"{kind.kind} {name!r} does not exist" + _scope_hint(kind, key))
        return json_response(store.with_status(kind, manifest))

    async def delete_view(name: str) -> Response:
        body = await json_body(required=False)
        if body is not None and not isinstance(body, dict):
            raise invalid("the DELETE body must be a JSON object holding the key fields")
        metadata = kind.delete_metadata(name, body or _key_params(kind, request.args))
        change = await store.delete(kind, kind.key_of(metadata), dry_run=_flag("dryMode"))
        if not _flag("dryMode"):
            _audit_change(api, kind, change)
        return Response(b"", 204)

    list_view.__doc__ = f"List {kind.kind} resources (filters: name, global, {', '.join(kind.list_filters)})."
    put_view.__doc__ = f"Create or update a {kind.kind} (the whole resource); ?dryMode=true validates only."
    get_view.__doc__ = f"One {kind.kind} by name" + (" (key fields as query parameters)." if kind.key_fields else ".")
    delete_view.__doc__ = f"Delete a {kind.kind}" + (
        " (the other key fields as a JSON body)." if kind.key_fields else "."
    )
    app.add_url_rule(base, f"{ident}_list", list_view, methods=["GET"])
    app.add_url_rule(base, f"{ident}_put", put_view, methods=["PUT"])
    app.add_url_rule(f"{base}/<name>", f"{ident}_get", get_view, methods=["GET"])
    app.add_url_rule(f"{base}/<name>", f"{ident}_delete", delete_view, methods=["DELETE"])
    api.read_only_endpoints.update({f"{ident}_list", f"{ident}_get"})


def _key_params(kind: ResourceKind, args: Any) -> dict[str, Any]:
    """Key fields given as query parameters (``?vCluster=a`` or ``?vcluster=a``)."""
    out: dict[str, Any] = {}
    for path in kind.key_fields:
        leaf = path.rsplit(".", 1)[-1]
        value = args.get(leaf, args.get(leaf.lower()))
        if value:
            out[leaf] = value
    return out


def _scope_hint(kind: ResourceKind, key: tuple[str | None, ...]) -> str:
    parts = [f"{f.rsplit('.', 1)[-1]}={v}" for f, v in zip(kind.key_fields, key[1:], strict=True) if v is not None]
    return f" ({', '.join(parts)})" if parts else ""


def _audit_change(api: AdminApi, kind: ResourceKind, change: Change) -> None:
    extras = {f.rsplit(".", 1)[-1]: v for f, v in zip(kind.key_fields, change.key[1:], strict=True) if v is not None}
    api.audit(
        "DELETE" if change.result == "DELETED" else "UPSERT",
        kind=kind.kind,
        resourceName=change.key[0],
        scope=extras or None,
        result=change.result,
    )
