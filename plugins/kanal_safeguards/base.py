"""What every safeguard interceptor shares: the ``topic`` regex it applies to, the actions each
rule may take, its audit events, and the throttle time on a response (THROTTLE)."""

from __future__ import annotations

import dataclasses
import datetime
import re
from typing import Any, ClassVar

from kanal.api import Connection, Interceptor, InterceptorConfigError
from kanal_safeguards.decisions import Action, Decisions

__all__ = ["SafeguardInterceptor", "TopicMatcher", "check_action", "check_actions", "compile_topic", "with_throttle"]

_CACHE_LIMIT = 10_000


def compile_topic(pattern: str, field: str = "topic") -> re.Pattern[str]:
    """The ``topic`` regex of a config (whole name; ``.*`` by default, internal topics included)."""
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise InterceptorConfigError(f"{field}: {pattern!r} is not a valid regex: {exc}") from None


def with_throttle(response: Any, throttle_ms: int) -> Any:
    """``response`` whose throttle time (``throttle_time_ms`` on the wire) is at least
    ``throttle_ms``; unchanged when its version has none. kio names the field ``throttle_time`` and
    holds it as a timedelta."""
    current = getattr(response, "throttle_time", None)
    wanted = datetime.timedelta(milliseconds=throttle_ms)
    if current is None or current >= wanted:
        return response
    return dataclasses.replace(response, throttle_time=wanted)


class TopicMatcher:
    """The ``topic`` regex of a config (whole name), with a bounded cache of answers by topic: the
    instance is shared by every connection and asked on every request."""

    __slots__ = ("_cache", "_pattern")

    def __init__(self, pattern: str, field: str = "topic") -> None:
        self._pattern: re.Pattern[str] = compile_topic(pattern, field)
        self._cache: dict[str, bool] = {}

    def __call__(self, topic: str | None) -> bool:
        if topic is None:
            return False
        known = self._cache.get(topic)
        if known is None:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            known = self._cache[topic] = self._pattern.fullmatch(topic) is not None
        return known


def check_action(plugin: str, path: str, action: Action, allowed: frozenset[Action]) -> None:
    """Refuses an action the plugin cannot take (OVERRIDE on a produce rule), naming the field."""
    if action not in allowed:
        names = ", ".join(a.value for a in Action if a in allowed)
        raise InterceptorConfigError(f"{path}: {action.value} is not supported by {plugin} (use {names})")


def check_actions(plugin: str, rules: dict[str, Any], allowed: frozenset[Action]) -> None:
    """:func:`check_action` for each configured rule (``key.action``)."""
    for key, rule in rules.items():
        if rule is not None:
            check_action(plugin, f"{key}.action", rule.action, allowed)


class SafeguardInterceptor(Interceptor):
    """Base of the safeguard interceptor types: ``audit`` writes a :class:`Decisions` under the
    type's ``plugin_name``."""

    plugin_name: ClassVar[str] = ""

    def audit(self, decisions: Decisions, connection: Connection | None, **context: Any) -> None:
        decisions.audit(self.services, connection, self.plugin_name, **context)
