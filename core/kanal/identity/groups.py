"""GatewayGroups as connections look them up: which groups a principal is in.

A group (the admin API's ``GatewayGroup`` kind) lists members by name and virtual cluster, and
external group names: the groups a credential may claim (an OAuth token's groups claim). A
connection is in a group when its principal is a member, or when its credential claims one of the
group's external groups. The connection's groups are these GatewayGroup names only: a claimed group
that no GatewayGroup lists gives nothing, so that an identity provider cannot put a client in a group
the gateway's operator did not define. Groups only choose which interceptors apply (scope
``group``); they grant no right. Lookups are dictionary reads, with no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from kanal.pipeline.chain import PASSTHROUGH


def _vcluster(name: str | None) -> str | None:
    """None for the passthrough cluster, however it is written."""
    return None if name in (None, "", PASSTHROUGH) else name


@dataclass(frozen=True, slots=True)
class Member:
    """A principal by name, in a virtual cluster (None: in none). It need not be a service account."""

    name: str
    vcluster: str | None = None


@dataclass(frozen=True, slots=True)
class Group:
    """One GatewayGroup: its members and the external groups that make a credential a member."""

    name: str
    members: tuple[Member, ...] = ()
    external_groups: tuple[str, ...] = ()


class Groups:
    """The groups the admin API applied on this node, replaced whole on each change.

    One instance lives as long as the gateway; readers keep a reference to it. ``on_change`` is
    called after each replacement: the gateway uses it to have live connections work out their
    groups again (see :meth:`kanal.pipeline.chain.Pipeline.groups_changed`).
    """

    def __init__(self, groups: Iterable[Group] = (), on_change: Callable[[], None] = lambda: None) -> None:
        self._on_change = on_change
        self._groups: dict[str, Group] = {}
        self._by_member: dict[tuple[str | None, str], frozenset[str]] = {}
        self._by_external: dict[str, frozenset[str]] = {}
        self.replace(groups)

    def replace(self, groups: Iterable[Group]) -> None:
        """Makes ``groups`` the whole set (a name given twice: the last one counts)."""
        by_name = {group.name: group for group in groups}
        by_member: dict[tuple[str | None, str], set[str]] = {}
        by_external: dict[str, set[str]] = {}
        for group in by_name.values():
            for member in group.members:
                by_member.setdefault((_vcluster(member.vcluster), member.name), set()).add(group.name)
            for external in group.external_groups:
                by_external.setdefault(external, set()).add(group.name)
        self._groups = by_name
        self._by_member = {key: frozenset(names) for key, names in by_member.items()}
        self._by_external = {key: frozenset(names) for key, names in by_external.items()}
        self._on_change()

    def of(self, principal: str, vcluster: str | None = None, claimed: Iterable[str] = ()) -> tuple[str, ...]:
        """The names of the groups ``principal`` (of ``vcluster``) is in, its credential claiming the
        external groups ``claimed``; sorted, so that equal memberships are equal tuples."""
        names = self._by_member.get((_vcluster(vcluster), principal), frozenset())
        if self._by_external:
            for external in claimed:
                more = self._by_external.get(external)
                if more:
                    names = names | more
        return tuple(sorted(names))

    def get(self, name: str) -> Group | None:
        return self._groups.get(name)

    def __iter__(self) -> Iterator[Group]:
        return iter(list(self._groups.values()))

    def __len__(self) -> int:
        return len(self._groups)


__all__ = ["Group", "Groups", "Member"]
