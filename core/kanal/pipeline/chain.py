"""From configured interceptors to the plain lists of callables that run per request.

Pluggy validates every interceptor's hook implementations against the hookspecs once, when the
chain is built; after that the hot path calls bound methods from lists, with no hook dispatch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pluggy

from kanal.pipeline.hookspecs import PROJECT, InterceptorHooks
from kanal.pipeline.interceptor import Interceptor, InterceptorConfigError, InterceptorSpec
from kanal.pipeline.registry import PluginRegistry
from kanal.protocol.api import ApiKey

log = logging.getLogger(__name__)

Hook = Callable[..., Any]

_HOOK_NAMES = (
    "kanal_connection_opened",
    "kanal_connection_closed",
    "kanal_request",
    "kanal_response",
    "kanal_produce_records",
    "kanal_fetch_records",
)


@dataclass(slots=True)
class Configured:
    """An interceptor spec with its live instance and validated hooks."""

    spec: InterceptorSpec
    instance: Interceptor
    hooks: dict[str, Hook]


def instantiate(spec: InterceptorSpec, registry: PluginRegistry) -> Configured:
    """Creates and validates one interceptor; errors name the interceptor and the problem."""
    cls = registry.interceptor_type(spec.plugin)
    if cls is None:
        known = ", ".join(sorted(registry.interceptor_types())) or "none installed"
        raise InterceptorConfigError(f"interceptor {spec.name!r}: unknown plugin {spec.plugin!r} (known: {known})")
    try:
        instance = cls(spec.config)
    except InterceptorConfigError as exc:
        raise InterceptorConfigError(f"interceptor {spec.name!r} ({spec.plugin}): {exc}") from exc
    except (TypeError, ValueError, KeyError) as exc:
        raise InterceptorConfigError(f"interceptor {spec.name!r} ({spec.plugin}): invalid config: {exc}") from exc
    manager = pluggy.PluginManager(PROJECT)
    manager.add_hookspecs(InterceptorHooks)
    try:
        manager.register(instance, name=spec.name)
        manager.check_pending()  # a misspelt kanal_* hook would otherwise never be called
    except pluggy.PluginValidationError as exc:
        raise InterceptorConfigError(f"interceptor {spec.name!r} ({spec.plugin}): {exc}") from exc
    hooks: dict[str, Hook] = {}
    for hook_name in _HOOK_NAMES:
        for impl in getattr(manager.hook, hook_name).get_hookimpls():
            hooks[hook_name] = impl.function
    return Configured(spec, instance, hooks)


@dataclass(slots=True)
class ResolvedChain:
    """The interceptors that apply to one connection identity, in order, as callables."""

    interceptors: tuple[Configured, ...]
    opened: list[Hook] = field(default_factory=list)
    closed: list[Hook] = field(default_factory=list)
    produce_records: list[Hook] = field(default_factory=list)
    produce_wants: list[Callable[[str], bool]] = field(default_factory=list)
    fetch_records: list[Hook] = field(default_factory=list)
    _requests: dict[int, list[Hook]] = field(default_factory=dict)
    _responses: dict[int, list[Hook]] = field(default_factory=dict)
    _always_decoded: dict[int, bool] = field(default_factory=dict)

    def requests_for(self, api_key: int) -> list[Hook]:
        """The ``kanal_request`` hooks that asked for this API, in priority order."""
        hooks = self._requests.get(api_key)
        if hooks is None:
            hooks = self._requests[api_key] = self._select("kanal_request", "request_api_keys", api_key)
        return hooks

    def responses_for(self, api_key: int) -> list[Hook]:
        """The ``kanal_response`` hooks that asked for this API, in priority order."""
        hooks = self._responses.get(api_key)
        if hooks is None:
            hooks = self._responses[api_key] = self._select("kanal_response", "response_api_keys", api_key)
        return hooks

    def _select(self, hook_name: str, keys_attr: str, api_key: int) -> list[Hook]:
        selected = []
        for item in self.interceptors:
            keys = getattr(type(item.instance), keys_attr)
            if hook_name in item.hooks and (keys is None or api_key in keys):
                selected.append(item.hooks[hook_name])
        return selected

    def name_of(self, hook: Hook) -> str:
        """The name of the interceptor a hook belongs to (for metrics and logs)."""
        owner = getattr(hook, "__self__", None)
        for item in self.interceptors:
            if item.instance is owner:
                return item.spec.name
        return ""

    def decode_request(self, api_key: int) -> bool:
        """Whether requests of this API must be decoded for a hook (Produce: see :meth:`decode_produce`)."""
        if api_key == ApiKey.PRODUCE and self.produce_records:
            return True
        return bool(self.requests_for(api_key))

    def decode_produce(self, topics: Sequence[str] | None) -> bool:
        """Whether a Produce request for ``topics`` (None: not known) must be decoded for a hook:
        for a request hook, or for a records hook whose interceptor wants one of the topics."""
        if self.requests_for(ApiKey.PRODUCE):
            return True
        if not self.produce_records:
            return False
        return topics is None or any(_wants(want, topic) for topic in topics for want in self.produce_wants)

    def decode_response(self, api_key: int) -> bool:
        """Whether every response of this API must be decoded for a hook (core rules and
        responses asked for by a request hook come on top)."""
        if api_key == ApiKey.FETCH and self.fetch_records:
            return True
        always = self._always_decoded.get(api_key)
        if always is None:
            owners = {getattr(hook, "__self__", None) for hook in self.responses_for(api_key)}
            always = self._always_decoded[api_key] = any(
                not type(item.instance).responses_on_demand for item in self.interceptors if item.instance in owners
            )
        return always


def _wants(want: Callable[[str], bool], topic: str) -> bool:
    """An interceptor's ``wants_produce_records``; one that fails wants the records (its hook then
    runs, with the hook's own error handling)."""
    try:
        return bool(want(topic))
    except Exception:
        log.exception("wants_produce_records failed for topic %r; decoding the request", topic)
        return True


def _build(interceptors: Sequence[Configured]) -> ResolvedChain:
    chain = ResolvedChain(tuple(interceptors))
    for item in interceptors:
        hooks = item.hooks
        for hook_name, target in (
            ("kanal_connection_opened", chain.opened),
            ("kanal_connection_closed", chain.closed),
            ("kanal_produce_records", chain.produce_records),
            ("kanal_fetch_records", chain.fetch_records),
        ):
            if hook_name in hooks:
                target.append(hooks[hook_name])
        if "kanal_produce_records" in hooks:
            chain.produce_wants.append(item.instance.wants_produce_records)
    return chain


class Pipeline:
    """All configured interceptors of a gateway; resolves the chain for a connection identity.

    Interceptors come from several sources, each replaced as a whole: ``config`` (the config
    file), ``admin`` (the admin API's resources), and plugins that install interceptors of their
    own for resources they manage (a source named after the plugin). ``version`` changes whenever
    any of them changes, so connections pick up a new chain on their next request without locks.
    """

    def __init__(self, registry: PluginRegistry) -> None:
        self.registry = registry
        self.version = 0
        self._sources: dict[str, dict[tuple[str, Any], Configured]] = {}
        self._cache: dict[tuple[str | None, tuple[str, ...], str | None], ResolvedChain] = {}

    def configure(self, specs: Sequence[InterceptorSpec], source: str = "config") -> None:
        """Replaces the interceptors of one source; raises before changing anything if one spec is
        invalid or takes a name and scope another source already has."""
        taken = {key: name for name, items in self._sources.items() if name != source for key in items}
        configured: dict[tuple[str, Any], Configured] = {}
        for spec in specs:
            key = (spec.name, spec.scope)
            if key in configured:
                raise InterceptorConfigError(f"interceptor {spec.name!r} is defined twice for the same scope")
            if key in taken:
                raise InterceptorConfigError(
                    f"interceptor {spec.name!r} with this scope is already defined by {taken[key]}"
                )
            configured[key] = instantiate(spec, self.registry)
        self._sources[source] = configured
        self._cache.clear()
        self.version += 1

    def specs(self, source: str | None = None) -> list[InterceptorSpec]:
        """The configured interceptors, of one source or of all."""
        if source is not None:
            return [c.spec for c in self._sources.get(source, {}).values()]
        return [c.spec for items in self._sources.values() for c in items.values()]

    def resolve(
        self, username: str | None = None, groups: tuple[str, ...] = (), vcluster: str | None = None
    ) -> ResolvedChain:
        """The effective chain: the most specific scope wins per interceptor name, then priority."""
        key = (username, groups, vcluster)
        chain = self._cache.get(key)
        if chain is None:
            chosen: dict[str, Configured] = {}
            for item in (c for items in self._sources.values() for c in items.values()):
                if not item.spec.scope.matches(username, groups, vcluster):
                    continue
                current = chosen.get(item.spec.name)
                if current is None or item.spec.scope.specificity() > current.spec.scope.specificity():
                    chosen[item.spec.name] = item
            ordered = sorted(chosen.values(), key=lambda c: (c.spec.priority, c.spec.name))
            chain = self._cache[key] = _build(ordered)
        return chain
