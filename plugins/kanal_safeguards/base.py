"""What every safeguard interceptor shares: the ``topic`` regex it applies to, its audit events,
and ``throttle_time_ms`` on a response (THROTTLE)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

from kanal.api import Connection, Interceptor, InterceptorConfigError

from .decisions import Decisions

__all__ = ["SafeguardInterceptor", "compile_topic", "with_throttle"]


def compile_topic(pattern: str, field: str = "topic") -> re.Pattern[str]:
    """The ``topic`` regex of a config (whole name; ``.*`` by default, internal topics included)."""
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise InterceptorConfigError(f"{field}: {pattern!r} is not a valid regex: {exc}") from None


def with_throttle(response: Any, throttle_ms: int) -> Any:
    """``response`` with ``throttle_time_ms`` at least ``throttle_ms`` (unchanged when its version
    has no such field)."""
    current = getattr(response, "throttle_time_ms", None)
    if current is None or current >= throttle_ms:
        return response
    return dataclasses.replace(response, throttle_time_ms=type(current)(throttle_ms))


class SafeguardInterceptor(Interceptor):
    """Base of the safeguard interceptor types: ``audit`` writes a :class:`Decisions` under the
    type's ``plugin_name``."""

    plugin_name: ClassVar[str] = ""

    def audit(self, decisions: Decisions, connection: Connection | None, **context: Any) -> None:
        decisions.audit(self.services, connection, self.plugin_name, **context)
