"""What ``kanal_console_pages`` gets: the web console as a plugin's pages see it.

The console is server-rendered HTML on the admin port (``/console``), behind the admin API's users:
pages are Jinja2 templates with autoescaping on, so every string a page shows (a rule name, a record's
value, a header) is escaped unless a template says otherwise. A plugin adds its pages and their
templates; the core draws the frame (navigation, login, the user's rights) around them. The
implementation is :mod:`kanal.admin.console.app`; plugins depend on this protocol only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kanal.api.admin import AdminUser, ResourceStore, View
from kanal.api.resources import KindRegistry

__all__ = ["ConsolePages", "RecordNote", "ShownRecord"]


@dataclass(frozen=True, slots=True)
class ShownRecord:
    """A record the console's topic page shows, as the broker stores it."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # milliseconds since the epoch
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name`` (None when absent or null)."""
        found = None
        for key, value in self.headers:
            if key == name:
                found = value
        return found


@dataclass(frozen=True, slots=True)
class RecordNote:
    """What a plugin says of one record on the topic page: a ``badge`` beside it (a policy's name),
    the ``text`` of the plugin's column, and ``details`` shown when the record is opened. All plain
    text: the page escapes it."""

    badge: str | None = None
    text: str | None = None
    details: str | None = None


class ConsolePages(Protocol):
    """The console, for adding pages (see ``kanal_console_pages``)."""

    @property
    def store(self) -> ResourceStore:
        """The stored resources (the same as the admin API's)."""

    @property
    def kinds(self) -> KindRegistry:
        """The resource kinds by name."""

    def page(
        self,
        path: str,
        title: str | None = None,
        methods: Sequence[str] = ("GET",),
        *,
        read_only: bool | None = None,
    ) -> Callable[[View], View]:
        """Registers a view at ``/console/<path>`` (``path`` may hold ``<name>`` parts, as Quart
        routes do). With a ``title`` the page is listed in the console's navigation. GET views are
        open to every admin API user; other methods (forms) to admin users unless ``read_only``, and
        only with the form's CSRF token (``{{ csrf_field() }}`` in the template) from a logged-in
        browser session. A view returns :meth:`render`'s answer or :meth:`redirect`'s."""

    def templates(self, directory: Path | str) -> None:
        """Adds a folder of the plugin's Jinja2 templates. Name them under a folder of the plugin's
        own (``dataquality/policy.html``) so that plugins never shadow each other's. Templates
        extend ``"console/base.html"`` and may import the core's macros from
        ``"console/macros.html"`` (tables, SVG bar and line charts, badges, forms)."""

    def render(self, template: str, status: int = 200, **context: Any) -> Any:
        """The response of a page: ``template`` rendered with ``context``, the current user
        (``user``), the navigation and ``csrf_field()``."""

    def redirect(self, path: str, message: str | None = None, error: bool = False) -> Any:
        """A 303 to ``/console/<path>`` (after a form), showing ``message`` there once."""

    def current_user(self) -> AdminUser | None:
        """The logged-in user of the current request."""

    def audit(self, action: str, **fields: Any) -> None:
        """Records a change made through the console, as the admin API records its own."""

    async def form(self) -> Mapping[str, str]:
        """The submitted form of the current request (its CSRF token already checked)."""

    def record_column(self, title: str, note: Callable[[ShownRecord], RecordNote | None]) -> None:
        """Adds a column titled ``title`` to the topic page: ``note`` is called for every record shown
        (keep it cheap: a page shows up to a few hundred) and returns what to show, or None."""

    def value_decoder(self, name: str, decode: Callable[[ShownRecord], Awaitable[Any]]) -> None:
        """Adds a way to show record values the page cannot read by itself (it reads JSON and text):
        ``decode`` returns the value as JSON-like data, or None when the value is not its kind (an
        Avro value of a schema registry, say). Decoders are tried in the order they were added; the
        page names the decoder that read a value."""
