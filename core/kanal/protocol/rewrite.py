"""Broker address rewriting, sans-I/O.

Every broker address a client sees must be the gateway's, or the client would connect to the
cluster directly. These functions take a decoded response and a mapping from node id to the
gateway's address for that broker, and return a new response (kio messages are frozen) or ``None``
when nothing needed to change, so the caller can forward the original bytes. The mapping is a
node's own address (its host, its port for the broker) or, with internal load balancing, the
client's share of the fleet (:mod:`kanal.protocol.balance`); either way only the brokers' entries
change, never the partitions, which name their leaders by broker id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from kanal.protocol.api import ApiKey

Address = tuple[str, int]
AddressOf = Callable[[int], Address | None]

# Which responses carry broker addresses, and from which version.
_MIN_VERSION = {
    ApiKey.METADATA: 0,
    ApiKey.DESCRIBE_CLUSTER: 0,
    ApiKey.FIND_COORDINATOR: 0,
    ApiKey.PRODUCE: 10,
    ApiKey.FETCH: 16,
}


def carries_addresses(api_key: int, version: int) -> bool:
    """Whether responses of (api key, version) may hold broker addresses."""
    minimum = _MIN_VERSION.get(api_key)  # type: ignore[call-overload]
    return minimum is not None and version >= minimum


def _node_id(entity: Any) -> int:
    return int(entity.broker_id if hasattr(entity, "broker_id") else entity.node_id)


def _rewrite_entity(entity: Any, address_of: AddressOf) -> Any:
    node = _node_id(entity)
    if node < 0:
        return entity  # "no coordinator" and similar placeholders
    target = address_of(node)
    if target is None or (entity.host == target[0] and entity.port == target[1]):
        return entity
    return replace(entity, host=target[0], port=target[1])


def _rewrite_list(entities: Iterable[Any], address_of: AddressOf) -> tuple[Any, ...] | None:
    old = tuple(entities)
    new = tuple(_rewrite_entity(e, address_of) for e in old)
    return None if all(a is b for a, b in zip(old, new, strict=True)) else new


def rewrite_addresses(api_key: int, body: Any, address_of: AddressOf) -> Any | None:
    """The response with every broker address replaced, or None when it had none to replace."""
    if api_key in (ApiKey.METADATA, ApiKey.DESCRIBE_CLUSTER):
        brokers = _rewrite_list(body.brokers, address_of)
        return None if brokers is None else replace(body, brokers=brokers)
    if api_key in (ApiKey.PRODUCE, ApiKey.FETCH):
        endpoints = getattr(body, "node_endpoints", ())
        if not endpoints:
            return None
        new = _rewrite_list(endpoints, address_of)
        return None if new is None else replace(body, node_endpoints=new)
    if api_key == ApiKey.FIND_COORDINATOR:
        if hasattr(body, "coordinators"):  # v4+: one entry per requested key
            coordinators = _rewrite_list(body.coordinators, address_of)
            return None if coordinators is None else replace(body, coordinators=coordinators)
        new_body = _rewrite_entity(body, address_of)
        return None if new_body is body else new_body
    return None


def broker_addresses(api_key: int, body: Any) -> dict[int, Address]:
    """The upstream brokers a Metadata or DescribeCluster response announces."""
    if api_key not in (ApiKey.METADATA, ApiKey.DESCRIBE_CLUSTER):
        return {}
    return {_node_id(b): (str(b.host), int(b.port)) for b in body.brokers}


def broker_racks(api_key: int, body: Any) -> dict[int, str | None]:
    """The racks of the upstream brokers a Metadata or DescribeCluster response announces (nothing
    for versions without the field: Metadata v0 says nothing of racks, rather than "none")."""
    if api_key not in (ApiKey.METADATA, ApiKey.DESCRIBE_CLUSTER):
        return {}
    return {_node_id(b): (None if b.rack is None else str(b.rack)) for b in body.brokers if hasattr(b, "rack")}
