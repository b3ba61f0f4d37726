"""Internal load balancing: which gateway node a client is sent to for each backing broker, sans-I/O.

Every node of a fleet listens on one port per backing broker (``GATEWAY_PORT_START + broker id -
GATEWAY_MIN_BROKERID``), so any node can serve any broker. With internal load balancing
(``GATEWAY_FEATURE_FLAGS_INTERNAL_LOAD_BALANCING``, on by default) the broker addresses of a
Metadata, DescribeCluster or FindCoordinator answer (and the KIP-951 leader hints) name, for each
backing broker, one live node of the fleet: that node's host and its port for the broker. Broker ids
stay those of the backing cluster, so partitions, which name their leaders by id, need no change.

The node is chosen by rendezvous (highest random weight) hashing: for the client key, the broker and
each candidate node a 64-bit BLAKE2b hash, and the node with the highest one wins. So

* a client is sent to the same node for a broker on every request and by every node of the fleet
  (the hash is the same everywhere: it does not depend on Python's per-process string hashing), as
  long as the member list is the same;
* clients spread evenly: each (client, broker) pair lands on each of N candidates with chance 1/N;
* when a node leaves, only the pairs it had move (each to its runner-up); when a node joins, it takes
  a 1/N share, from every other node alike. A node is identified by its advertised host and first
  port, not by the id it draws at each start, so a node restarted in place gets its clients back;
* a node in the rack of the broker (``GATEWAY_RACK_ID``; Metadata and DescribeCluster carry the
  brokers' racks) is preferred: when the fleet has one or more there, the choice is among them.

A Metadata answer also lists, after the backing brokers, the live nodes it does not otherwise name,
as *standby brokers*: brokers that lead no partition, with ids from :data:`STANDBY_ID_BASE` up (a
hash of the node's identity, so every node gives a node the same id). A client learns the other
nodes' addresses that way: when the node it was sent to dies, it asks one of them for Metadata and
is sent elsewhere, instead of knowing no other address than the dead one (librdkafka forgets its
bootstrap servers once it has Metadata, and asks for them again only after
``metadata.recovery.rebootstrap.trigger.ms``, 5 minutes by default). A standby's port is the node's
port for the answer's first broker, so whatever a client asks there is served by a real broker.

A member the other nodes cannot reach (a probe of its admin port fails, :mod:`kanal.net.peer_probe`)
is left out of the answers until it answers again or leaves the group: a killed node stays a member
until its session expires (``KAFKA_SESSION_TIMEOUT_MS``, and the rebalance after it), and its
clients would be sent back to it all that time.

The choice is made once per (client, broker) and member list, and cached: a Metadata answer costs a
dictionary lookup per broker, whatever its number of partitions. A new member list (or a broker's
rack changing, a member found dead or alive again, this node leaving) starts a new, empty cache;
nothing is locked (one trio thread).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import Final

from kanal.protocol.member_metadata import MemberMetadata

Address = tuple[str, int]
AddressOf = Callable[[int], Address | None]

__all__ = ["STANDBY_ID_BASE", "GatewayNode", "LoadBalancer", "Standby", "client_key", "node_of", "rendezvous"]

#: Clients whose choices a member list keeps; past it the cache starts afresh (each choice is a few
#: microseconds to redo, so a bound protects the memory of a node with ever-new client ids).
MAX_CACHED_CLIENTS: Final = 16384
_MISSING: Final = object()
#: The first id of standby brokers (2^30): far above the ids of real clusters, below int32's limit.
STANDBY_ID_BASE: Final = 1 << 30
_STANDBY_ID_SPAN: Final = 1 << 24


@dataclass(frozen=True, slots=True)
class Standby:
    """A node listed in a Metadata answer as a broker that leads nothing (see the module's doc)."""

    node_id: int
    host: str
    port: int
    rack: str | None


@dataclass(frozen=True, slots=True)
class GatewayNode:
    """A node a client may be sent to: where it listens, as its member metadata announces."""

    host: str
    first_port: int
    last_port: int
    rack: str | None = None
    #: Its admin API port (``GATEWAY_HTTP_PORT``), which the other nodes probe to see it alive.
    http_port: int | None = None
    #: The broker its first port stands for (``GATEWAY_MIN_BROKERID``); None: as this node's.
    min_broker_id: int | None = None

    @property
    def identity(self) -> bytes:
        """What the hash knows the node by: its advertised host and first client port."""
        return f"{self.host}:{self.first_port}".encode()

    def port(self, index: int) -> int | None:
        """The node's port for the broker at ``index`` (broker id - GATEWAY_MIN_BROKERID), or None
        when its ports do not reach that far."""
        port = self.first_port + index
        return port if index >= 0 and port <= self.last_port else None

    def broker_port(self, broker: int, min_broker_id: int) -> int | None:
        """The node's port for ``broker``, from its own GATEWAY_MIN_BROKERID when it announced one
        (``min_broker_id``, this node's, otherwise): nodes whose settings differ still agree on it."""
        first = self.min_broker_id if self.min_broker_id is not None else min_broker_id
        return self.port(broker - first)


def node_of(metadata: MemberMetadata) -> GatewayNode:
    """The node a member's metadata announces."""
    m = metadata
    return GatewayNode(m.host, m.first_port, m.last_port, m.rack, m.http_port, m.min_broker_id)


def client_key(host: str, principal: str | None, client_id: str | None) -> str:
    """What a client is known by: the host it connects from (not its port: each of its connections
    has another), the principal it authenticated as, and its client id. The same client instance
    sends all three alike on every connection, to every node."""
    return f"{host}\x00{principal or ''}\x00{client_id or ''}"


def _score(client: bytes, broker: int, node: bytes) -> bytes:
    """The rendezvous weight of ``node`` for (client, broker): 8 bytes compared as a big-endian number."""
    return blake2b(b"%s\x00%d\x00%s" % (client, broker, node), digest_size=8).digest()


def standby_ids(nodes: Sequence[GatewayNode]) -> dict[bytes, int]:
    """Each node's standby broker id: from a hash of its identity, so the same on every node for as
    long as the node lives; two nodes whose hashes meet are told apart in the order of their
    identities (the same order everywhere)."""
    ids: dict[bytes, int] = {}
    taken: set[int] = set()
    for node in sorted(nodes, key=lambda n: n.identity):
        offset = int.from_bytes(blake2b(node.identity, digest_size=8).digest()) % _STANDBY_ID_SPAN
        while STANDBY_ID_BASE + offset in taken:
            offset = (offset + 1) % _STANDBY_ID_SPAN
        ids[node.identity] = STANDBY_ID_BASE + offset
        taken.add(STANDBY_ID_BASE + offset)
    return ids


def rendezvous(client: str, broker: int, nodes: Sequence[GatewayNode]) -> GatewayNode:
    """The node of ``nodes`` (not empty) that ``client`` is sent to for ``broker``."""
    if len(nodes) == 1:
        return nodes[0]
    key = client.encode()
    return max(nodes, key=lambda node: _score(key, broker, node.identity))


class _Choices:
    """One member list's choices: the candidates of each broker, and each client's nodes."""

    __slots__ = ("_candidates", "_standby_ids", "clients", "first_broker_id", "nodes", "own_address", "racks")

    def __init__(
        self,
        nodes: tuple[GatewayNode, ...],
        racks: Mapping[int, str | None],
        first_broker_id: int,
        own_address: AddressOf,
    ) -> None:
        self.nodes = nodes
        self.racks = racks
        self.first_broker_id = first_broker_id
        self.own_address = own_address
        self._candidates: dict[int, tuple[GatewayNode, ...]] = {}
        self._standby_ids = standby_ids(nodes)
        self.clients: dict[str, AddressOf] = {}

    def candidates(self, broker: int) -> tuple[GatewayNode, ...]:
        """The nodes that serve ``broker``'s port, those in the broker's rack if there are any."""
        found = self._candidates.get(broker)
        if found is None:
            found = tuple(n for n in self.nodes if n.broker_port(broker, self.first_broker_id) is not None)
            rack = self.racks.get(broker)
            if rack is not None:
                found = tuple(n for n in found if n.rack == rack) or found
            self._candidates[broker] = found
        return found

    def choose(self, client: str, broker: int) -> Address | None:
        candidates = self.candidates(broker)
        if not candidates:  # no member serves that port: as a node alone would answer
            return self.own_address(broker)
        node = rendezvous(client, broker, candidates)
        port = node.broker_port(broker, self.first_broker_id)
        assert port is not None  # (a candidate has a port for the broker)
        return node.host, port

    def address_of(self, client: str) -> AddressOf:
        found = self.clients.get(client)
        if found is None:
            if len(self.clients) >= MAX_CACHED_CLIENTS:
                self.clients.clear()
            chosen: dict[int, Address | None] = {}

            def address_of(broker: int) -> Address | None:
                address = chosen.get(broker, _MISSING)
                if address is _MISSING:
                    address = chosen[broker] = self.choose(client, broker)
                return address  # type: ignore[return-value]

            found = self.clients[client] = address_of
        return found

    def standbys(self, client: str, brokers: Sequence[int]) -> tuple[Standby, ...]:
        """The nodes an answer naming ``brokers`` does not send ``client`` to, as standby brokers."""
        if not brokers:
            return ()
        address_of = self.address_of(client)
        named = {address_of(broker) for broker in brokers}
        anchor = min(brokers)
        found = []
        for node in self.nodes:
            port = node.broker_port(anchor, self.first_broker_id)
            if port is None or any(
                a is not None and a[0] == node.host and node.first_port <= a[1] <= node.last_port for a in named
            ):
                continue
            found.append(Standby(self._standby_ids[node.identity], node.host, port, node.rack))
        return tuple(found)


class LoadBalancer:
    """The brokers' addresses each client is to see, following the fleet's live members.

    ``own`` is this node; ``own_address`` is what it answers alone (its host and its port for the
    broker, or None for a broker outside its ports): until the first member list, while it is the
    only member (or the only one left when it leaves), and for a broker no member has a port for.
    """

    def __init__(
        self,
        own: GatewayNode,
        first_broker_id: int,
        own_address: AddressOf,
        racks: Mapping[int, str | None] | None = None,
    ) -> None:
        self.own = own
        self.first_broker_id = first_broker_id
        self.own_address = own_address
        self.members: tuple[GatewayNode, ...] = ()  # the last member list (empty: not known yet)
        self.racks: dict[int, str | None] = dict(racks or {})
        self.leaving = False
        #: Members the other nodes cannot reach (by identity): left out until they answer again or
        #: leave the group (a killed node stays a member until its session expires).
        self.unreachable: frozenset[bytes] = frozenset()
        #: Bumped at each change of what the answers depend on (member list, racks, leaving).
        self.version = 0
        self._choices: _Choices | None = None

    # -- what changes the answers -------------------------------------------------------------------

    def members_changed(self, members: Iterable[GatewayNode]) -> None:
        """A new member list (each SyncGroup): a node listed twice (a restarted node whose old
        session has not expired yet) counts once."""
        unique: dict[bytes, GatewayNode] = {}
        for node in members:
            unique.setdefault(node.identity, node)
        listed = tuple(sorted(unique.values(), key=lambda n: n.identity))
        if listed != self.members:
            self.members = listed
            self._rebuild()

    def leave(self) -> None:
        """This node started shutting down: its own answers stop naming it too."""
        if not self.leaving:
            self.leaving = True
            self._rebuild()

    def set_unreachable(self, unreachable: Iterable[bytes]) -> None:
        """The members (identities) this node's probes find dead now (:mod:`kanal.net.peer_probe`)."""
        found = frozenset(unreachable) - {self.own.identity}
        if found != self.unreachable:
            self.unreachable = found
            self._rebuild()

    def learn_racks(self, racks: Mapping[int, str | None]) -> None:
        """Brokers' racks, as a Metadata or DescribeCluster answer gives them."""
        known = self.racks
        if all(known.get(broker, _MISSING) == rack for broker, rack in racks.items()):
            return
        known.update(racks)
        self._rebuild()

    def _rebuild(self) -> None:
        self.version += 1
        nodes = self.nodes
        own = self.own.identity
        if not nodes or all(n.identity == own for n in nodes):
            self._choices = None  # alone: as a node without a fleet answers
        else:
            self._choices = _Choices(nodes, dict(self.racks), self.first_broker_id, self.own_address)

    # -- what the answers use ---------------------------------------------------------------------

    @property
    def nodes(self) -> tuple[GatewayNode, ...]:
        """The nodes answers may name now: the members found alive, without this node once it is
        leaving."""
        gone = self.unreachable | {self.own.identity} if self.leaving else self.unreachable
        if not gone:
            return self.members
        return tuple(n for n in self.members if n.identity not in gone)

    @property
    def balancing(self) -> bool:
        """Whether answers name other nodes than this one (else they are a lone node's)."""
        return self._choices is not None

    def address_of(self, client: str) -> AddressOf:
        """The address function of a client (see :func:`client_key`): broker id -> (host, port)."""
        choices = self._choices
        if choices is None:
            return self.own_address
        return choices.address_of(client)

    def standbys(self, client: str, brokers: Sequence[int]) -> tuple[Standby, ...]:
        """The standby brokers a Metadata answer naming ``brokers`` lists for ``client``: none while
        this node answers alone."""
        choices = self._choices
        return () if choices is None else choices.standbys(client, brokers)
