"""The virtual clusters the gateway knows (the VirtualCluster resources applied on this node)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["KAFKA_API", "REST_API", "VirtualCluster", "VirtualClusters"]

#: ACLs managed with the Kafka Admin API by the virtual cluster's super users.
KAFKA_API = "KAFKA_API"
#: ACLs declared in the VirtualCluster resource (the whole list, replaced on every apply).
REST_API = "REST_API"


@dataclass(frozen=True, slots=True)
class VirtualCluster:
    """One tenant: its name is the physical prefix of its topics, groups and transactional ids."""

    name: str
    acl_enabled: bool = False
    acl_mode: str = KAFKA_API
    super_users: tuple[str, ...] = ()
    acls: tuple[Mapping[str, Any], ...] = ()  # REST_API: as the resource lists them
    type: str = "Standard"


@dataclass
class VirtualClusters:
    """By name; ``on_change`` is called after every :meth:`replace` (chains are resolved again)."""

    on_change: Callable[[], None] = lambda: None
    _by_name: dict[str, VirtualCluster] = field(default_factory=dict)

    def replace(self, clusters: Iterable[VirtualCluster]) -> None:
        self._by_name = {cluster.name: cluster for cluster in clusters}
        self.on_change()

    def get(self, name: str) -> VirtualCluster | None:
        return self._by_name.get(name)

    def __iter__(self) -> Any:
        return iter(list(self._by_name.values()))
