"""From configured interceptors to the plain lists of callables that run per request.

Pluggy validates every interceptor's hook implementations against the hookspecs once, when the
chain is built; after that the hot path calls bound methods from lists, with no hook dispatch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pluggy

from kanal.api.errors import ConfigError
from kanal.api.hookspecs import PROJECT, InterceptorHooks
from kanal.api.interceptor import Interceptor, InterceptorConfigError, InterceptorSpec, Scope, validate_config
from kanal.api.placeholders import expand_placeholders
from kanal.api.services import GatewayServices
from kanal.pipeline.registry import PluginRegistry
from kanal.pipeline.wire import WireStage
from kanal.protocol.api import ApiKey

log = logging.getLogger(__name__)

Hook = Callable[..., Any]

#: The name scopes give the virtual cluster of the connections that are in none (the default one).
PASSTHROUGH = "passthrough"

#: The GatewayGroups a connection is in: (principal, virtual cluster, groups its credential claims)
#: -> group names, sorted. The gateway sets :attr:`Pipeline.groups_of` to its group directory's.
GroupsOf = Callable[[str, str | None, tuple[str, ...]], tuple[str, ...]]


def _no_groups(principal: str, vcluster: str | None, claimed: tuple[str, ...]) -> tuple[str, ...]:
    return ()


#: The core's built-in interceptors of a virtual cluster (None: the passthrough one), with their specs.
Builtins = Callable[[str | None], Sequence[tuple[InterceptorSpec, Interceptor]]]


def _no_builtins(vcluster: str | None) -> Sequence[tuple[InterceptorSpec, Interceptor]]:
    return ()


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
    builtin: bool = False  # the core's own (ACLs, virtual-cluster names): not a configured resource


ServicesFor = Callable[[str], GatewayServices]


def check(spec: InterceptorSpec, registry: PluginRegistry, environ: Mapping[str, str]) -> tuple[type[Interceptor], Any]:
    """The type of an interceptor and its validated config, its ``${VAR|default}`` placeholders
    expanded from ``environ``, without constructing it (the admin API's validation: a 400 naming
    the field)."""
    cls = registry.interceptor_type(spec.plugin)
    if cls is None:
        known = ", ".join(sorted(registry.interceptor_types())) or "none installed"
        raise InterceptorConfigError(f"interceptor {spec.name!r}: unknown plugin {spec.plugin!r} (known: {known})")
    try:
        config = expand_placeholders(dict(spec.config), environ, "config")
        return cls, validate_config(cls, config, expanded=config != spec.config)
    except ConfigError as exc:
        raise InterceptorConfigError(f"interceptor {spec.name!r} ({spec.plugin}): {exc.key}: {exc.problem}") from exc
    except InterceptorConfigError as exc:
        raise InterceptorConfigError(f"interceptor {spec.name!r} ({spec.plugin}): {exc}") from exc


def instantiate(
    spec: InterceptorSpec, registry: PluginRegistry, services_for: ServicesFor, environ: Mapping[str, str]
) -> Configured:
    """Creates one interceptor from its validated config; errors name the interceptor and the problem."""
    cls, config = check(spec, registry, environ)
    try:
        instance = cls(config, services_for(registry.plugin_of(cls.plugin_name) or cls.plugin_name))
    except InterceptorConfigError as exc:
        raise InterceptorConfigError(f"interceptor {spec.name!r} ({spec.plugin}): {exc}") from exc
    except (TypeError, ValueError, KeyError) as exc:
        raise InterceptorConfigError(f"interceptor {spec.name!r} ({spec.plugin}): invalid config: {exc}") from exc
    return configured(spec, instance)


def configured(spec: InterceptorSpec, instance: Interceptor) -> Configured:
    """An interceptor with its hooks, checked against the hookspecs (a misspelt hook name, a wrong
    argument name: refused naming the interceptor). Tells the instance its spec
    (:attr:`Interceptor.spec`)."""
    instance.spec = spec
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


@dataclass(frozen=True, slots=True)
class Entry:
    """One interceptor's hook in a resolved chain. ``position`` is the interceptor's place in the
    chain (0 outermost): it decides which response hooks a short-circuit goes back through, and
    whose notes a hook sees."""

    position: int
    name: str
    hook: Hook


@dataclass(slots=True)
class ResolvedChain:
    """The interceptors that apply to one connection identity, in order, as callables.

    Request-direction lists are in chain order (1→n); response-direction lists in reverse (n→1),
    the onion of :mod:`kanal.pipeline.dispatch`.
    """

    interceptors: tuple[Configured, ...]
    opened: list[Entry] = field(default_factory=list)
    closed: list[Entry] = field(default_factory=list)
    produce_records: list[Entry] = field(default_factory=list)
    produce_wants: list[Callable[[str], bool]] = field(default_factory=list)
    fetch_records: list[Entry] = field(default_factory=list)
    _requests: dict[int, list[Entry]] = field(default_factory=dict)
    _responses: dict[int, list[Entry]] = field(default_factory=dict)
    _always_decoded: dict[int, bool] = field(default_factory=dict)
    _wire: dict[int, tuple[WireStage, ...]] = field(default_factory=dict)

    def requests_for(self, api_key: int) -> list[Entry]:
        """The ``kanal_request`` hooks that asked for this API, in chain order."""
        hooks = self._requests.get(api_key)
        if hooks is None:
            hooks = self._requests[api_key] = self._select("kanal_request", "request_api_keys", api_key)
        return hooks

    def responses_for(self, api_key: int) -> list[Entry]:
        """The ``kanal_response`` hooks that asked for this API, innermost first (n→1)."""
        hooks = self._responses.get(api_key)
        if hooks is None:
            selected = self._select("kanal_response", "response_api_keys", api_key)
            hooks = self._responses[api_key] = selected[::-1]
        return hooks

    def _select(self, hook_name: str, keys_attr: str, api_key: int) -> list[Entry]:
        selected = []
        for position, item in enumerate(self.interceptors):
            keys = getattr(type(item.instance), keys_attr)
            if hook_name in item.hooks and (keys is None or api_key in keys):
                selected.append(Entry(position, item.spec.name, item.hooks[hook_name]))
        return selected

    def wire_for(self, api_key: int) -> tuple[WireStage, ...]:
        """The stages that handle this API's requests on their bytes (:mod:`kanal.pipeline.wire`),
        in chain order: when every request hook for it is a built-in's with a stage for it; else none."""
        stages = self._wire.get(api_key)
        if stages is None:
            found: list[WireStage] = []
            for entry in self.requests_for(api_key):
                item = self.interceptors[entry.position]
                instance = item.instance
                if not (item.builtin and isinstance(instance, WireStage) and api_key in instance.wire_api_keys):
                    found = []
                    break
                found.append(instance)
            stages = self._wire[api_key] = tuple(found)
        return stages

    def decode_request(self, api_key: int) -> bool:
        """Whether requests of this API must be decoded for a hook (Produce: see :meth:`decode_produce`)."""
        if api_key == ApiKey.PRODUCE and self.produce_records:
            return True
        return bool(self.requests_for(api_key)) and not self.wire_for(api_key)

    def decode_produce(self, topics: Sequence[str] | None) -> bool:
        """Whether a Produce request for ``topics`` (None: not known) must be decoded for a hook:
        for a request hook, or for a records hook whose interceptor wants one of the topics."""
        if self.requests_for(ApiKey.PRODUCE) and not self.wire_for(ApiKey.PRODUCE):
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
            positions = {entry.position for entry in self.responses_for(api_key)}
            always = self._always_decoded[api_key] = any(
                not type(self.interceptors[position].instance).responses_on_demand for position in positions
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


def build_chain(interceptors: Sequence[Configured]) -> ResolvedChain:
    chain = ResolvedChain(tuple(interceptors))
    for position, item in enumerate(interceptors):
        hooks = item.hooks
        for hook_name, target in (
            ("kanal_connection_opened", chain.opened),
            ("kanal_connection_closed", chain.closed),
            ("kanal_produce_records", chain.produce_records),
            ("kanal_fetch_records", chain.fetch_records),
        ):
            if hook_name in hooks:
                target.append(Entry(position, item.spec.name, hooks[hook_name]))
        if "kanal_produce_records" in hooks:
            chain.produce_wants.append(item.instance.wants_produce_records)
    chain.closed.reverse()
    chain.fetch_records.reverse()
    return chain


class Pipeline:
    """All configured interceptors of a gateway; resolves the chain for a connection identity.

    Interceptors come from several sources, each replaced as a whole: ``config`` (the config
    file), ``admin`` (the admin API's resources), and plugins that install interceptors of their
    own for resources they manage (a source named after the plugin). ``version`` changes whenever
    any of them changes, and when group memberships change (:meth:`groups_changed`), so connections
    pick up a new chain, and their new groups (:attr:`groups_of`), on their next request without locks.

    A scope's virtual cluster None means every virtual cluster; :data:`PASSTHROUGH` means the
    connections in none (what an Interceptor manifest without ``scope.vCluster`` targets). For one
    interceptor name the most specific matching scope replaces the others (:func:`_beats`).
    """

    def __init__(
        self,
        registry: PluginRegistry,
        services_for: ServicesFor,
        retire: Callable[[Interceptor], None] = lambda interceptor: None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.registry = registry
        #: What interceptor configs' ``${VAR|default}`` placeholders read (the gateway's environment).
        self.environ: Mapping[str, str] = os.environ if environ is None else environ
        self.services_for = services_for
        self.retire = retire  # called with each interceptor replaced or removed, to be closed
        self.version = 0
        self.groups_of: GroupsOf = _no_groups
        #: The core's own interceptors for the connections of a virtual cluster (None: in none), such
        #: as ACL enforcement and virtual-cluster names; set by the gateway, they sort by priority
        #: with the configured ones (the core's take the extreme priorities).
        self.builtins: Builtins = _no_builtins
        self._builtins: dict[str | None, list[Configured]] = {}
        self._sources: dict[str, dict[tuple[str, Any], Configured]] = {}
        self._cache: dict[tuple[str | None, tuple[str, ...], str | None], ResolvedChain] = {}

    def configure(
        self,
        specs: Sequence[InterceptorSpec],
        source: str = "config",
        failed: dict[tuple[str, Any], str] | None = None,
    ) -> None:
        """Replaces the interceptors of one source; raises before changing anything if one spec is
        invalid or takes a name and scope another source already has. With ``failed``, a spec whose
        interceptor cannot be created is left out instead, its error recorded there by (name, scope)."""
        taken = {key: name for name, items in self._sources.items() if name != source for key in items}
        previous = self._sources.get(source, {})
        configured: dict[tuple[str, Any], Configured] = {}
        try:
            for spec in specs:
                key = (spec.name, spec.scope)
                if key in configured:
                    raise InterceptorConfigError(f"interceptor {spec.name!r} is defined twice for the same scope")
                if key in taken:
                    raise InterceptorConfigError(
                        f"interceptor {spec.name!r} with this scope is already defined by {taken[key]}"
                    )
                kept = previous.get(key)
                if kept is not None and kept.spec == spec:
                    configured[key] = kept  # unchanged: keeps what it holds (caches, connections)
                    continue
                try:
                    configured[key] = instantiate(spec, self.registry, self.services_for, self.environ)
                except InterceptorConfigError as exc:
                    if failed is None:
                        raise
                    failed[key] = str(exc)
        except BaseException:
            for item in configured.values():
                if item not in previous.values():
                    self.retire(item.instance)
            raise
        self._sources[source] = configured
        self._cache.clear()
        self.version += 1
        kept_now = {id(item.instance) for item in configured.values()}
        for item in previous.values():
            if id(item.instance) not in kept_now:
                self.retire(item.instance)

    def builtins_changed(self) -> None:
        """The core's built-in interceptors changed (:attr:`builtins`): every chain is resolved again."""
        previous, self._builtins = self._builtins, {}
        self._cache.clear()
        self.version += 1
        for items in previous.values():
            for item in items:
                self.retire(item.instance)

    def _builtins_of(self, vcluster: str | None) -> list[Configured]:
        items = self._builtins.get(vcluster)
        if items is None:
            built = [configured(spec, instance) for spec, instance in self.builtins(vcluster)]
            items = self._builtins[vcluster] = [replace(item, builtin=True) for item in built]
        return items

    def groups_changed(self) -> None:
        """Group memberships changed: every connection works out its groups and chain again at its
        next request (chains already resolved stay right for the groups they were resolved for)."""
        self.version += 1

    def decisions_changed(self) -> None:
        """What the built-ins decide on changed (the ACLs): connections forget the wire outcomes
        they remember (:class:`kanal.pipeline.wire.WirePath`), which hold for one version only."""
        self.version += 1

    def instances(self) -> list[Interceptor]:
        """Every live interceptor, of every source (the built-in ones included)."""
        configured = [c.instance for items in self._sources.values() for c in items.values()]
        return configured + [c.instance for items in self._builtins.values() for c in items]

    def specs(self, source: str | None = None) -> list[InterceptorSpec]:
        """The configured interceptors, of one source or of all."""
        if source is not None:
            return [c.spec for c in self._sources.get(source, {}).values()]
        return [c.spec for items in self._sources.values() for c in items.values()]

    def resolve(
        self, username: str | None = None, groups: tuple[str, ...] = (), vcluster: str | None = None
    ) -> ResolvedChain:
        """The effective chain of a connection of ``username``, in the GatewayGroups ``groups``, in
        virtual cluster ``vcluster`` (None: in none): the most specific scope wins per interceptor
        name, then the chain runs by priority."""
        key = (username, groups, vcluster)
        chain = self._cache.get(key)
        if chain is None:
            where = PASSTHROUGH if vcluster is None else vcluster
            chosen: dict[str, Configured] = {}
            for item in (c for items in self._sources.values() for c in items.values()):
                if item.spec.scope.matches(username, groups, where):
                    current = chosen.get(item.spec.name)
                    if current is None or _beats(item.spec.scope, current.spec.scope):
                        chosen[item.spec.name] = item
            items = [*chosen.values(), *self._builtins_of(vcluster)]
            ordered = sorted(items, key=lambda c: (c.spec.priority, c.spec.name))
            chain = self._cache[key] = build_chain(ordered)
        return chain


def _beats(scope: Scope, other: Scope) -> bool:
    """Whether ``scope`` replaces ``other`` (both matching one connection): username > group >
    virtual cluster > global; at one level, a named virtual cluster over every virtual cluster; then
    the group first in alphabetical order (so the winner never depends on configuration order)."""
    rank = (scope.specificity(), scope.vcluster is not None)
    other_rank = (other.specificity(), other.vcluster is not None)
    if rank != other_rank:
        return rank > other_rank
    return (scope.group or "") < (other.group or "")
