"""The safeguards plugin's console pages: traffic control (``/console/traffic``: every safeguards
interceptor by what it does, the limits with this node's share and counts, live) and chargeback
usage (``/console/traffic/usage``). Read-only: interceptors change through the admin API. Templates
are ``templates/safeguards/*.html`` beside this module; see docs/console-safeguards.md."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from kanal.api import ConsolePages, GatewayServices

__all__ = ["TEMPLATES", "add_pages"]

TEMPLATES: Final = Path(__file__).parent / "templates"


def add_pages(console: ConsolePages, services: GatewayServices) -> None:
    """Adds the pages and their templates."""
    # imported here: the plugin module imports this package wherever it is loaded (the command line
    # included), and the pages need Quart only in a gateway
    from kanal_safeguards.console.pages import add_traffic_pages

    console.templates(TEMPLATES)
    add_traffic_pages(console, services)
