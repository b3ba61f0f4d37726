"""The data-quality pages of the web console (``/console/data-quality/...``).

Policies (status, counts, the violations chart and history refreshed live, Block behind a typed
confirmation, Mark, a backtest), rules (create, edit, test against a sample), alerts, and backtests
(a job's progress, live, and its report). The pages read what the
admin API's data-quality routes read (the plugin's :class:`~kanal_dataquality.runtime.Runtime`: its
history, statuses and alerts) and change resources through the console's store, so every change is
validated, stored, applied and audited exactly as through the API. Templates are
``templates/dataquality/*.html`` beside this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kanal.api import ConsolePages

if TYPE_CHECKING:
    from kanal_dataquality.backtest_service import Backtests
    from kanal_dataquality.runtime import Runtime

__all__ = ["TEMPLATES", "add_pages"]

TEMPLATES = Path(__file__).parent / "templates"


def add_pages(console: ConsolePages, runtime: Runtime, backtests: Backtests) -> None:
    """Adds the pages and their templates (the navigation lists policies, rules, then alerts; the
    backtests are reached from the policies' pages; ``backtests`` are the admin API's), and the topic
    page's "Marking violations" column."""
    # imported here: the plugin module imports this package (for its hook) wherever it is loaded, the
    # command line included, and the pages need Quart only in a gateway
    from kanal_dataquality.console.alerts import add_alert_pages
    from kanal_dataquality.console.backtests import add_backtest_pages
    from kanal_dataquality.console.marks import COLUMN, marking_note
    from kanal_dataquality.console.policies import add_policy_pages
    from kanal_dataquality.console.rules import add_rule_pages

    console.templates(TEMPLATES)
    add_policy_pages(console, runtime, backtests)
    add_rule_pages(console, runtime)
    add_alert_pages(console, runtime)
    add_backtest_pages(console, backtests)
    console.record_column(COLUMN, marking_note)  # the topic page: marked records' policies and rules
