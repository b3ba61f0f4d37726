"""Every hook a Kanal plugin can implement, documented where it is declared.

There are two kinds of hooks:

* **Plugin hooks** (:class:`PluginHooks`) are implemented by the plugin object that the
  ``kanal.plugins`` entry point names (a module or an object). They run once, at startup.
* **Interceptor hooks** (:class:`InterceptorHooks`) are implemented as methods of an
  :class:`~kanal.api.interceptor.Interceptor` subclass. An interceptor is a configured
  instance of such a class (name, priority, scope, config); its hooks run for the traffic of the
  connections its scope matches, in priority order (lower first).

Mark implementations with :data:`hookimpl`. Any interceptor hook may be ``async def``; the core
awaits it. Keep hooks cheap: they run once per request, per response, or per partition batch, never
per record, so put per-record work in plain functions built once, when the interceptor is created.

Ordering and results. Request hooks run in priority order; the first that returns a result other
than ``None`` stops the chain (later interceptors do not see that request). Response hooks run in
the same order. Record hooks run for every interceptor, each seeing the changes of the ones before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from kanal.api.admin import AdminRoutes
    from kanal.api.console import ConsolePages
    from kanal.api.context import Connection, RecordsContext, RequestContext, ResponseContext
    from kanal.api.interceptor import Interceptor
    from kanal.api.resources import ResourceKind
    from kanal.api.results import RecordsResult, RequestResult, ResponseResult
    from kanal.api.services import GatewayServices, Service
    from kanal.api.settings import SettingsFamily

PROJECT = "kanal"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class PluginHooks:
    """Hooks of a plugin (the object an entry point of the ``kanal.plugins`` group names)."""

    @hookspec
    def kanal_interceptor_types(self) -> list[type[Interceptor]]:  # type: ignore[empty-body]
        """Return the interceptor classes this plugin provides.

        Each class sets a unique ``plugin_name`` (what an interceptor's ``plugin`` field refers
        to) and may set ``config_type`` (a dataclass, TypedDict or msgspec Struct) or
        ``config_schema`` (a JSON schema). The core validates each configured interceptor's config
        against it (a bad one is refused naming the field: a 400 from the admin API, a startup error
        from the config file), then calls ``cls(config, services)`` with the validated config and the
        plugin's :class:`~kanal.api.services.GatewayServices`, and awaits ``aclose()`` when the
        interceptor is replaced, deleted or the gateway stops. The constructor may raise
        :class:`~kanal.api.errors.InterceptorConfigError` for what a schema cannot check.
        """

    @hookspec
    def kanal_admin_resources(self, services: GatewayServices) -> list[ResourceKind]:  # type: ignore[empty-body]
        """Return the resource kinds this plugin manages through the admin API (called once at startup).

        Each :class:`~kanal.api.resources.ResourceKind` names a manifest ``kind`` (``TopicView``) and
        a URL ``path`` (``topic-view``), and gets, without more code: ``GET/PUT /gateway/v2/<path>``,
        ``GET/DELETE /gateway/v2/<path>/{name}``, ``?dryMode=true``, upsert results, persistence in the
        gateway's compacted state topic (so every node of the fleet sees each change and a restart
        loses nothing), ``kanal apply/get/delete`` support, an OpenAPI schema and metrics.

        The kind's ``validate(manifest, state)`` returns the canonical manifest or raises
        :class:`~kanal.api.resources.ResourceError` (``invalid(msg)`` for a 400); its
        ``apply(resources, state)`` is called on every node with all stored resources of the kind
        whenever one changed, and returns a :class:`~kanal.api.resources.Status` (Pending, Ready,
        Failed) per key for the ones that report it. ``state.resources(kind)`` reads other kinds (a
        policy checking that its rules exist).
        """

    @hookspec
    def kanal_admin_routes(self, admin: AdminRoutes, services: GatewayServices) -> None:
        """Add HTTP routes of your own to the admin API (called once, when the app is built).

        Register views with ``@admin.route("/gateway/v2/<plugin-path>", methods=[...])``: they are
        served behind the admin API's authentication (GET open to every user, other methods to admin
        users unless ``read_only=True``), counted in the API metrics, listed in ``/openapi.json``
        (summarised by the view's docstring), and answer 503 once shutdown starts. ``admin.store``
        holds the stored resources, ``admin.kinds`` the resource kinds by name,
        ``admin.current_user()`` the caller, ``admin.audit(action, **fields)`` records a change.
        Raise :class:`~kanal.api.resources.ResourceError` for a JSON error ``{title, msg, cause}``.
        Views are ``async`` and run in the gateway's trio loop: never block.
        """

    @hookspec
    def kanal_console_pages(self, console: ConsolePages, services: GatewayServices) -> None:
        """Add pages of your own to the web console (``/console`` on the admin port; called once,
        after ``kanal_admin_routes``).

        Register views with ``@console.page("<plugin-path>", "Title")`` and your templates' folder
        with ``console.templates(folder)``; a view answers ``console.render("<plugin>/page.html",
        **context)`` or, after a form, ``console.redirect("<path>", "what was done")``. Pages are
        served behind the admin API's users (read-only users see every page and change nothing),
        and forms carry a CSRF token. Render every value through the templates (autoescaped): never
        build HTML from strings in Python. Views are ``async`` and run in the gateway's trio loop.
        """

    @hookspec
    def kanal_gateway_services(self, services: GatewayServices) -> list[Service]:  # type: ignore[empty-body]
        """Return companion services to run beside the gateway (called once, at startup, after the
        admin API is installed; ``kanal run`` and ``kanal dev`` call it).

        A service is ``async def service(*, task_status)``: the gateway starts each once its
        listeners are up, waits for ``task_status.started()`` before it reports ready, and cancels
        it at shutdown. Use it for servers of your own (the schema registry proxy's HTTP port) or
        background followers. Return an empty list when the plugin is not enabled. Raise
        :class:`~kanal.api.errors.ConfigError` for a configuration that cannot work: the gateway
        then refuses to start and names the setting.
        """

    @hookspec
    def kanal_settings(self) -> list[str | SettingsFamily]:  # type: ignore[empty-body]
        """Return the ``GATEWAY_*`` names this plugin reads (called once, before the gateway parses its
        settings): variables (``GATEWAY_MY_LIMIT``), feature flags (``GATEWAY_FEATURE_FLAGS_MY_FLAG``)
        and families, every variable under a prefix (``"GATEWAY_MY_THING_*"``).

        The gateway refuses to start on a ``GATEWAY_*`` name neither the core nor a plugin declares,
        naming the closest known one. A family declared as a string accepts any name under it; declare
        it as a :class:`~kanal.api.settings.SettingsFamily` with a ``check`` to have its variables
        checked too, at startup: the check gets the family's variables, raises
        :class:`~kanal.api.errors.ConfigError` naming the variable for what it owns and finds wrong,
        and returns a :class:`~kanal.api.settings.FamilyCheck`: the variables it reads, and for some
        others a :class:`~kanal.api.settings.Hint` (the names or values it would have read). A
        variable that no plugin declaring the family reads stops the gateway, naming the closest name
        or value of all their hints. Several plugins may declare the same family (each its own
        external connection types): so never raise for a variable that another plugin may read, give
        a hint instead.
        """


class InterceptorHooks:
    """Hooks of an interceptor instance, called on the traffic of matching connections."""

    @hookspec
    def kanal_connection_opened(self, connection: Connection) -> None:
        """A client connected; called before its first request is read.

        ``connection.state`` is a dict private to this connection, shared by all interceptors:
        use keys named after your plugin.
        """

    @hookspec
    def kanal_connection_closed(self, connection: Connection) -> None:
        """The client connection closed (by either side, or at gateway shutdown)."""

    @hookspec
    def kanal_request(self, ctx: RequestContext) -> RequestResult:
        """A request was received from the client and decoded; it has not been forwarded yet.

        Called only for the API keys listed in the interceptor's ``request_api_keys`` (``None``
        means every API, which forces decoding of every request: avoid it). Return ``None`` to
        forward ``ctx.request`` (which the hook may have replaced), :class:`Respond` to answer
        with a response of your own, :class:`Reject` to answer with an error code the client
        library understands, or :class:`Close` to close the connection.

        A request for which the client expects no response (Produce with acks=0) is dropped
        silently when a hook answers it. An interceptor with ``responses_on_demand`` calls
        ``ctx.want_response()`` here for the requests whose responses its ``kanal_response``
        must see.
        """

    @hookspec
    def kanal_response(self, ctx: ResponseContext) -> ResponseResult:
        """A response arrived from the upstream broker and was decoded; the client has not seen it.

        Called only for the API keys in ``response_api_keys``; for an interceptor with
        ``responses_on_demand``, for the responses its ``kanal_request`` asked for and for those
        another hook or a core rule had decoded anyway. The hook may replace
        ``ctx.response``, return :class:`Respond` to send another response instead, or
        :class:`Close`. Broker addresses have already been rewritten to the gateway's.
        """

    @hookspec
    def kanal_produce_records(self, ctx: RecordsContext) -> RecordsResult:
        """The records of one topic-partition of a Produce request, before it is forwarded.

        Called once per partition batch with decoded records (``ctx.records``); change them in
        place and call ``mark_changed()`` on the batch, or replace a batch's records. Return
        :class:`PartitionError` to fail this partition (its records are not written and the
        client gets the error code for it; other partitions proceed). An interceptor that handles
        only some topics says which in ``Interceptor.wants_produce_records``: requests for other
        topics are then not decoded for it.
        """

    @hookspec
    def kanal_fetch_records(self, ctx: RecordsContext) -> RecordsResult:
        """The records of one topic-partition of a Fetch response, before the client sees them.

        Change, drop or replace records through ``ctx.records``; offsets of kept records stay
        as the broker wrote them. Return :class:`PartitionError` to fail this partition's fetch
        (its records are removed and the client gets the error code).
        """
