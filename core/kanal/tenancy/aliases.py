"""The alias topics the gateway knows (the AliasTopic resources applied on this node).

An alias is a logical topic name in a virtual cluster (or in the passthrough cluster) for a physical
topic of the cluster, any of them (the tenant's own, another's, one outside every prefix): the
tenant produces to it, fetches from it and commits offsets on it under the alias, and the cluster
sees the physical topic, so the alias shares the physical topic's records and its consumer groups'
offsets. An alias never points at
another alias: its physical name must not be where an alias of the same virtual cluster would be
stored (``<prefix><alias name>``), which would make the target depend on the order of resolution.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["AliasTopic", "AliasTopics", "alias_of_alias"]


@dataclass(frozen=True, slots=True)
class AliasTopic:
    """``name`` in virtual cluster ``vcluster`` (None: the passthrough cluster) stands for the
    cluster's topic ``physical_name``."""

    name: str
    vcluster: str | None
    physical_name: str


def alias_of_alias(aliases: Iterable[AliasTopic]) -> AliasTopic | None:
    """An alias whose physical name is where another alias of its virtual cluster would be stored
    (an alias of an alias), or None."""
    aliases = list(aliases)
    stored = {(a.vcluster, (a.vcluster or "") + a.name) for a in aliases}
    return next((a for a in aliases if (a.vcluster, a.physical_name) in stored), None)


@dataclass
class AliasTopics:
    """By virtual cluster; ``on_change`` is called after every :meth:`replace` (chains resolve again)."""

    on_change: Callable[[], None] = lambda: None
    _by_vcluster: dict[str | None, dict[str, str]] = field(default_factory=dict)

    def replace(self, aliases: Iterable[AliasTopic]) -> None:
        by_vcluster: dict[str | None, dict[str, str]] = {}
        for alias in aliases:
            by_vcluster.setdefault(alias.vcluster, {})[alias.name] = alias.physical_name
        self._by_vcluster = by_vcluster
        self.on_change()

    def of(self, vcluster: str | None) -> Mapping[str, str]:
        """A virtual cluster's aliases (None: the passthrough cluster's): logical name -> physical name."""
        return self._by_vcluster.get(vcluster, {})
