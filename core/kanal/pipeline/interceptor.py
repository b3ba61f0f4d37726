"""Interceptors: configured instances of a plugin's interceptor class, and their model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar


class InterceptorConfigError(ValueError):
    """An interceptor's config is invalid; the message names the key."""


class Interceptor:
    """Base class of interceptor types. Subclasses set ``plugin_name`` and implement hooks
    (see :mod:`kanal.pipeline.hookspecs`) as methods marked with ``@hookimpl``.

    ``request_api_keys`` and ``response_api_keys`` say which APIs ``kanal_request`` and
    ``kanal_response`` want; everything else stays opaque bytes, which is what keeps the
    gateway fast. With ``responses_on_demand``, a response is decoded for this interceptor only
    when its ``kanal_request`` asked for it (``ctx.want_response()``): an interceptor that changes
    a few requests then costs nothing on the responses to all the others.
    """

    plugin_name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    config_schema: ClassVar[Mapping[str, Any] | None] = None
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset()
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset()
    responses_on_demand: ClassVar[bool] = False

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = dict(config)

    def wants_produce_records(self, topic: str) -> bool:
        """Whether ``kanal_produce_records`` is to see the records produced to ``topic``.

        The default, True, has every Produce request decoded for this interceptor. Answer False for
        the topics your hook would return at once for: a Produce request none of whose topics any
        interceptor wants is forwarded as it arrived (a large one while it arrives, its records never
        entering the gateway). The hook may still be called for such a topic when the request also
        holds a wanted one. Called per request, so keep it to a lookup.
        """
        return True


@dataclass(frozen=True, slots=True)
class Scope:
    """Who an interceptor applies to. All None: every connection (global)."""

    vcluster: str | None = None
    group: str | None = None
    username: str | None = None

    def specificity(self) -> int:
        """Username beats group beats virtual cluster beats global."""
        if self.username is not None:
            return 3
        if self.group is not None:
            return 2
        if self.vcluster is not None:
            return 1
        return 0

    def matches(self, username: str | None, groups: tuple[str, ...], vcluster: str | None) -> bool:
        if self.vcluster is not None and self.vcluster != vcluster:
            return False
        if self.group is not None and self.group not in groups:
            return False
        return self.username is None or self.username == username


@dataclass(frozen=True, slots=True)
class InterceptorSpec:
    """An interceptor as configured: which plugin, where in the chain, for whom, with what."""

    name: str
    plugin: str
    priority: int = 100
    scope: Scope = field(default_factory=Scope)
    config: Mapping[str, Any] = field(default_factory=dict)
