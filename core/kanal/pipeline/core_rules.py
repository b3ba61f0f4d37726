"""The gateway's own rules on responses, run innermost (before any interceptor's response hook), so
every plugin sees the gateway's view: the ApiVersions a client may use (what both the gateway and
the cluster speak), broker addresses that are the gateway's, and topic ids learnt for naming."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from kanal.api.context import Connection
from kanal.protocol.api import ApiKey
from kanal.protocol.api_versions import intersect
from kanal.protocol.balance import Standby
from kanal.protocol.rewrite import (
    Address,
    AddressOf,
    broker_addresses,
    broker_racks,
    carries_addresses,
    rewrite_addresses,
)
from kanal.protocol.topic_names import TopicNames

__all__ = ["CORE_RESPONSES", "CoreRules"]

# Responses the core itself must see: address rewriting, version negotiation, topic-id learning.
CORE_RESPONSES = frozenset({ApiKey.API_VERSIONS, ApiKey.METADATA, ApiKey.DESCRIBE_CLUSTER, ApiKey.FIND_COORDINATOR})


class CoreRules:
    """Applies the core rules to a decoded response; the gateway supplies what they learn from and
    answer with."""

    def __init__(
        self,
        learn_brokers: Callable[[dict[int, Address]], None],
        topic_names: TopicNames,
        advertised_address: AddressOf,
    ) -> None:
        self.learn_brokers = learn_brokers
        self.topic_names = topic_names
        self.advertised_address = advertised_address
        #: APIs the gateway answers itself whatever the broker supports (ApiVersions offers them).
        self.answered_here: frozenset[int] = frozenset()
        #: The addresses a client connection is to see (internal load balancing: its share of the
        #: fleet), with what the brokers' racks are; None: :attr:`advertised_address` for everyone.
        self.addresses_for: Callable[[Connection], AddressOf] | None = None
        self.learn_racks: Callable[[dict[int, str | None]], None] | None = None
        #: The other fleet nodes a client's Metadata answers list as brokers that lead nothing
        #: (:class:`~kanal.protocol.balance.Standby`), given the backing brokers' ids; None: none.
        self.standbys_for: Callable[[Connection, Sequence[int]], tuple[Standby, ...]] | None = None

    def response(self, api_key: int, version: int, body: Any, client: Connection | None = None) -> Any:
        """The response as the client (``client``'s connection, when known) is to see it (``body``
        itself when nothing changed)."""
        if api_key == ApiKey.API_VERSIONS:
            body = intersect(body, self.answered_here) or body
        elif api_key in (ApiKey.METADATA, ApiKey.DESCRIBE_CLUSTER):
            self.learn_brokers(broker_addresses(api_key, body))
            if self.learn_racks is not None:
                self.learn_racks(broker_racks(api_key, body))
            self.topic_names.learn(api_key, body)
        if carries_addresses(api_key, version):
            if api_key in (ApiKey.PRODUCE, ApiKey.FETCH) and not getattr(body, "node_endpoints", ()):
                return body  # (no leader hints: the common case, with nothing to look up)
            address_of = self.advertised_address
            if client is not None and self.addresses_for is not None:
                address_of = self.addresses_for(client)
            body = rewrite_addresses(api_key, body, address_of) or body
            if api_key == ApiKey.METADATA and client is not None and self.standbys_for is not None:
                body = with_standbys(body, self.standbys_for(client, [int(b.node_id) for b in body.brokers]))
        return body


def with_standbys(body: Any, standbys: Sequence[Standby]) -> Any:
    """A Metadata answer with ``standbys`` listed after its brokers (in the brokers' entity type)."""
    if not standbys or not body.brokers:
        return body
    model = body.brokers[0]
    racked = hasattr(model, "rack")
    extra = tuple(
        replace(model, node_id=s.node_id, host=s.host, port=s.port, **({"rack": s.rack} if racked else {}))
        for s in standbys
    )
    return replace(body, brokers=(*body.brokers, *extra))
