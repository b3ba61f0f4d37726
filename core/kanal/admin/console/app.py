"""The console's frame: routes under ``/console`` on the admin app, login, sessions, CSRF, rendering.

Who may see it is who may use the admin API (``GATEWAY_ADMIN_API_USERS``): a browser logs in with a
form and gets a session cookie (HttpOnly, SameSite=Strict, signed with a key the node draws at start,
so a restart logs everyone out, and each node of a fleet has its own logins); a script may send HTTP
Basic credentials for GET pages. Forms (every change) need the logged-in session and its CSRF token,
and admin users unless the page says it only reads (read-only users see everything, change nothing).

Pages are Jinja2 templates with autoescaping: every value is escaped unless a template marks it safe,
which only the core's SVG charts are. Responses forbid scripts other than the console's own file and
framing (Content-Security-Policy), so a value that slipped through escaping still would not run.
"""

from __future__ import annotations

import hmac
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote, urlsplit

import jinja2
from quart import Response, g, request, send_from_directory, session

from kanal import __version__
from kanal.admin.audit import audit, host_port
from kanal.admin.console.charts import bar_chart, line_chart
from kanal.api.admin import AdminUser, View
from kanal.api.console import RecordNote, ShownRecord
from kanal.config.users import EXAMPLE, USERS_ENV, authenticate, basic_header
from kanal.config.users import AdminUser as ConfiguredUser

if TYPE_CHECKING:
    from kanal.admin.app import AdminApi
    from kanal.admin.store import ResourceStore
    from kanal.api.resources import KindRegistry

__all__ = ["CONSOLE_PREFIX", "Console", "is_console_path"]

CONSOLE_PREFIX: Final = "/console"
#: How long a console login lasts (a browser session ends it sooner).
SESSION_SECONDS: Final = 8 * 3600
_HERE = Path(__file__).parent
_PUBLIC = frozenset({"console_login", "console_static"})
_SECURITY_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
    " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def is_console_path(path: str) -> bool:
    return path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/")


@dataclass
class Console:
    """The console of one gateway node (the plugin API's :class:`~kanal.api.console.ConsolePages`)."""

    api: AdminApi
    nav: list[tuple[str, str]] = field(default_factory=list)  # (path, title), in registration order
    read_only_endpoints: set[str] = field(default_factory=set)
    #: Plugins' columns of the topic page and value decoders (``record_column``, ``value_decoder``).
    record_columns: list[tuple[str, Callable[[ShownRecord], RecordNote | None]]] = field(default_factory=list)
    value_decoders: list[tuple[str, Callable[[ShownRecord], Awaitable[Any]]]] = field(default_factory=list)
    _loaders: list[jinja2.BaseLoader] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._loaders.append(jinja2.FileSystemLoader(_HERE / "templates"))
        self.env = jinja2.Environment(
            loader=jinja2.ChoiceLoader(self._loaders),
            autoescape=True,
            undefined=jinja2.StrictUndefined,  # a misspelt variable is an error, not an empty string
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.globals.update(bar_chart=bar_chart, line_chart=line_chart, version=__version__)
        # JSON to show (escaped by the page like any text; Jinja's own tojson is for scripts)
        self.env.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False, default=str)
        app = self.api.app
        app.secret_key = secrets.token_bytes(32)
        app.config.update(
            SESSION_COOKIE_NAME="kanal_console",
            SESSION_COOKIE_SAMESITE="Strict",
            SESSION_COOKIE_HTTPONLY=True,
            SESSION_COOKIE_PATH=CONSOLE_PREFIX,
        )
        app.add_url_rule(CONSOLE_PREFIX, "console_home", self._home, methods=["GET"])
        app.add_url_rule(f"{CONSOLE_PREFIX}/login", "console_login", self._login, methods=["GET", "POST"])
        app.add_url_rule(f"{CONSOLE_PREFIX}/logout", "console_logout", self._logout, methods=["POST"])
        app.add_url_rule(f"{CONSOLE_PREFIX}/static/<path:name>", "console_static", self._static, methods=["GET"])
        self.read_only_endpoints.add("console_logout")
        self.api.console_guard = self.guard

    # -- the plugin API ---------------------------------------------------------------------------

    @property
    def store(self) -> ResourceStore:
        return self.api.store

    @property
    def kinds(self) -> KindRegistry:
        return self.api.kinds

    def page(
        self,
        path: str,
        title: str | None = None,
        methods: Sequence[str] = ("GET",),
        *,
        read_only: bool | None = None,
    ) -> Callable[[View], View]:
        def register(view: View) -> View:
            endpoint = "console_" + f"{view.__module__}.{view.__qualname__}".replace(".", "_").replace("<", "")
            self.api.app.add_url_rule(f"{CONSOLE_PREFIX}/{path}", endpoint, view, methods=list(methods))
            if read_only or (read_only is None and set(methods) <= {"GET", "HEAD"}):
                self.read_only_endpoints.add(endpoint)
            if title is not None:
                self.nav.append((path, title))
            return view

        return register

    def templates(self, directory: Path | str) -> None:
        self._loaders.append(jinja2.FileSystemLoader(directory))

    def render(self, template: str, status: int = 200, **context: Any) -> Response:
        flash = session.pop("flash", None)
        html = self.env.get_template(template).render(
            user=self.current_user(),
            nav=self.nav,
            here=request.path,
            prefix=CONSOLE_PREFIX,
            flash=flash,
            csrf_field=self._csrf_field,
            **context,
        )
        return Response(html, status, content_type="text/html; charset=utf-8", headers=_SECURITY_HEADERS)

    def redirect(self, path: str, message: str | None = None, error: bool = False) -> Response:
        if message is not None:
            session["flash"] = {"message": message, "error": error}
        target = path if path.startswith(CONSOLE_PREFIX) else f"{CONSOLE_PREFIX}/{path.lstrip('/')}"
        return Response("", 303, headers={"Location": target, **_SECURITY_HEADERS})

    def current_user(self) -> AdminUser | None:
        user: AdminUser | None = g.get("user")
        return user

    def audit(self, action: str, **fields: Any) -> None:
        self.api.audit(action, **fields)

    async def form(self) -> Mapping[str, str]:
        return dict((await request.form).items())

    def record_column(self, title: str, note: Callable[[ShownRecord], RecordNote | None]) -> None:
        self.record_columns.append((title, note))

    def value_decoder(self, name: str, decode: Callable[[ShownRecord], Awaitable[Any]]) -> None:
        self.value_decoders.append((name, decode))

    # -- the guard (called by the admin app for every console request) ----------------------------

    async def guard(self) -> Response | None:
        """Lets a console request through (the user in ``g.user``) or answers it: a login page for
        a stranger, 403 for a form without its token or from a read-only user."""
        endpoint = request.endpoint or ""
        if endpoint in _PUBLIC:
            return None
        users = self.api.users
        if not users:
            return self.render(
                "console/message.html", 503, title="Console disabled",
                message=f"No admin API users are configured: set {USERS_ENV}, e.g. {USERS_ENV}='{EXAMPLE}'.",
            )  # fmt: skip
        user = self._session_user()
        logged_in = user is not None
        if user is None:
            user = authenticate(users, request.headers.get("Authorization"))
        if user is None:
            if request.method in ("GET", "HEAD"):
                target = request.full_path.rstrip("?")
                return Response("", 303, headers={"Location": f"{CONSOLE_PREFIX}/login?next={quote(target)}"})
            return self._refuse(401, "Log in first.")
        g.user = user
        if request.method in ("GET", "HEAD"):
            return None
        if not logged_in:
            return self._refuse(403, "Changes need a console login (HTTP Basic credentials only read pages).")
        token = (await request.form).get("csrf", "")
        if not hmac.compare_digest(token.encode(), str(session.get("csrf", "")).encode()):
            return self._refuse(403, "This form has expired: reload the page and try again.")
        if not user.admin and endpoint not in self.read_only_endpoints:
            return self._refuse(403, f"User {user.username!r} is read-only (admin: false): it cannot change anything.")
        return None

    def _session_user(self) -> ConfiguredUser | None:
        name, at = session.get("user"), session.get("at", 0)
        if not isinstance(name, str) or not isinstance(at, int | float) or time.time() - at > SESSION_SECONDS:
            return None
        return next((u for u in self.api.users if u.username == name), None)

    def _refuse(self, status: int, message: str) -> Response:
        return self.render("console/message.html", status, title="Not allowed", message=message)

    def _csrf_field(self) -> Any:
        from markupsafe import Markup, escape

        token = session.get("csrf")
        if not isinstance(token, str):
            token = session["csrf"] = secrets.token_urlsafe(24)
        return Markup(f'<input type="hidden" name="csrf" value="{escape(token)}">')

    # -- the frame's own routes -------------------------------------------------------------------

    async def _home(self) -> Response:
        first = self.nav[0][0] if self.nav else "login"
        return Response("", 303, headers={"Location": f"{CONSOLE_PREFIX}/{first}"})

    async def _login(self) -> Response:
        """The login form; a successful login starts a session and goes where the user was going."""
        target = request.args.get("next", CONSOLE_PREFIX)
        if not is_console_path(urlsplit(target).path) or urlsplit(target).netloc:
            target = CONSOLE_PREFIX  # never redirect elsewhere
        if request.method == "GET":
            return self.render("console/login.html", target=target, failed=False)
        form = await request.form
        if not hmac.compare_digest(form.get("csrf", "").encode(), str(session.get("csrf", "")).encode()):
            return self.render("console/login.html", 403, target=target, failed=False)
        username = form.get("username", "")
        user = authenticate(self.api.users, basic_header(username, form.get("password", "")))
        client = host_port(request.scope.get("client"))
        if user is None:
            audit("AUTHENTICATION", "CONSOLE_LOGIN", {"result": "FAILURE", "user": username, "clientAddress": client})
            return self.render("console/login.html", 401, target=target, failed=True)
        audit("AUTHENTICATION", "CONSOLE_LOGIN", {"result": "SUCCESS", "user": user.username, "clientAddress": client})
        session.clear()
        session.update(user=user.username, at=time.time(), csrf=secrets.token_urlsafe(24))
        return Response("", 303, headers={"Location": target})

    async def _logout(self) -> Response:
        session.clear()
        return Response("", 303, headers={"Location": f"{CONSOLE_PREFIX}/login"})

    async def _static(self, name: str) -> Response:
        response: Response = await send_from_directory(_HERE / "static", name)
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response
