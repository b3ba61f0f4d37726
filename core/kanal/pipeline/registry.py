"""Plugin discovery through the ``kanal.plugins`` entry-point group, first-party plugins included."""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, cast

import pluggy

from kanal.api.hookspecs import PROJECT, PluginHooks
from kanal.api.interceptor import Interceptor
from kanal.api.settings import SettingsFamily

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "kanal.plugins"


class PluginError(RuntimeError):
    """A plugin could not be loaded or declares something invalid."""


class PluginRegistry:
    """The loaded plugins and the interceptor types they provide, by ``plugin_name``."""

    def __init__(self) -> None:
        self.manager = pluggy.PluginManager(PROJECT)
        self.manager.add_hookspecs(PluginHooks)
        self._types: dict[str, type[Interceptor]] = {}
        self._origin: dict[str, str] = {}

    def load_entry_points(self) -> None:
        """Loads every installed plugin; a plugin that fails to import is reported and skipped."""
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken third-party plugin must not stop the gateway
                log.error("plugin %s (%s) failed to load: %s", ep.name, ep.value, exc)
                continue
            self.register(plugin, ep.name)

    def register(self, plugin: Any, name: str) -> None:
        """Registers a plugin object and collects its interceptor types."""
        if self.manager.has_plugin(name):
            return
        self.manager.register(plugin, name=name)
        impls = [i for i in self.manager.hook.kanal_interceptor_types.get_hookimpls() if i.plugin is plugin]
        for impl in impls:
            types = cast(list[type[Interceptor]], impl.function())
            for cls in types:
                self._add_type(cls, name)

    def _add_type(self, cls: type[Interceptor], plugin_name: str) -> None:
        if not (isinstance(cls, type) and issubclass(cls, Interceptor)) or not cls.plugin_name:
            raise PluginError(f"plugin {plugin_name}: {cls!r} is not an Interceptor subclass with a plugin_name")
        if cls.plugin_name in self._types and self._types[cls.plugin_name] is not cls:
            raise PluginError(
                f"interceptor type {cls.plugin_name!r} is provided by both "
                f"{self._origin[cls.plugin_name]} and {plugin_name}"
            )
        self._types[cls.plugin_name] = cls
        self._origin[cls.plugin_name] = plugin_name

    def call_each(self, hook_name: str, services_for: Callable[[str], Any], **kwargs: Any) -> list[tuple[str, Any]]:
        """Calls a plugin hook of every plugin that implements it, each with its own ``services``
        (``services_for(plugin name)``) besides ``kwargs``; returns (plugin name, result) pairs."""
        results = []
        for impl in getattr(self.manager.hook, hook_name).get_hookimpls():
            name = self.manager.get_name(impl.plugin) or "?"
            arguments = {**kwargs, "services": services_for(name)}
            results.append((name, impl.function(**{arg: arguments[arg] for arg in impl.argnames})))
        return results

    def declared_settings(self) -> list[str | SettingsFamily]:
        """The ``GATEWAY_*`` names and families every plugin declares it reads (``kanal_settings``)."""
        declared: list[str | SettingsFamily] = []
        for impl in self.manager.hook.kanal_settings.get_hookimpls():
            for item in cast(list[object] | None, impl.function()) or ():
                if not isinstance(item, str | SettingsFamily):
                    name = self.manager.get_name(impl.plugin)
                    raise PluginError(
                        f"plugin {name}: kanal_settings returned {item!r}, not a name or a SettingsFamily"
                    )
                declared.append(item)
        return declared

    def interceptor_type(self, name: str) -> type[Interceptor] | None:
        """The type named ``name`` (its plugin_name, or ``module:Class``)."""
        found = self._types.get(name)
        if found is not None:
            return found
        for cls in self._types.values():
            if name in (f"{cls.__module__}:{cls.__qualname__}", f"{cls.__module__}.{cls.__qualname__}"):
                return cls
        return None

    def interceptor_types(self) -> dict[str, type[Interceptor]]:
        return dict(self._types)

    def plugin_of(self, type_name: str) -> str | None:
        return self._origin.get(type_name)
