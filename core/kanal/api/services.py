"""What the gateway offers plugins and interceptors: :class:`GatewayServices` and the protocols it uses.

Interceptors get it as the second constructor argument, plugins in ``kanal_admin_resources``,
``kanal_admin_routes`` and ``kanal_gateway_services``. It is a protocol, not the gateway: a plugin sees
the gateway's cluster id, metrics registry, topic names, its own Kafka client, settings, the
interceptors it installs, state logs, background tasks, the audit log and the fleet (:class:`Fleet`),
and nothing else.
``kanal.testing`` has an implementation without a gateway, for unit tests.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import trio

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from kanal.api.context import Connection
    from kanal.api.interceptor import InterceptorSpec
    from kanal.protocol.acl_codes import Operation as AclOperation
    from kanal.protocol.acl_codes import ResourceType as AclResourceType

__all__ = [
    "Fleet",
    "FleetMember",
    "GatewayAcls",
    "GatewayServices",
    "Identities",
    "KafkaClient",
    "LogRecord",
    "Principal",
    "Service",
    "StateLog",
    "TopicNames",
    "while_leader",
]


class TopicNames(Protocol):
    """Topic ids and names as the gateway knows them (from its clients' and its own Metadata)."""

    def name(self, topic_id: uuid.UUID) -> str | None:
        """The name of a topic id, or None when the gateway has not seen it (no I/O)."""

    def id(self, name: str) -> uuid.UUID | None:
        """The id of a topic name, or None when the gateway has not seen it (no I/O)."""

    async def resolve(self, topic_id: uuid.UUID) -> str:
        """The name of a topic id, asking the cluster on a miss; the id as text when nobody knows it."""

    def stored(self, name: str) -> str:
        """The name the cluster stores topic ``name`` under: a virtual cluster's prefix added, an
        alias followed; the name itself for the passthrough cluster. Data bound to a topic (an
        encryption's associated data) is bound to this name, so every way of reading the topic
        (another virtual cluster's alias, the passthrough cluster) agrees on it."""


class KafkaClient(Protocol):
    """The gateway's own Kafka client: one connection per broker, each request at the highest
    version both sides speak. Calls to different brokers never wait for each other."""

    def request_class(self, api_key: int) -> Any:
        """The kio request class of ``api_key`` at the version the gateway uses for its own calls
        (raises :class:`~kanal.api.errors.UpstreamError` when the cluster offers none of them)."""

    async def call(self, request: Any, *, node_id: int | None = None, timeout: float | None = None) -> Any:
        """Sends a kio request to broker ``node_id`` (None: any broker) and returns the decoded
        response. A broken connection is reopened once; failures raise ``UpstreamError``."""

    async def metadata(self, topics: Sequence[str] | None = None) -> Any:
        """A Metadata response for ``topics`` (None: every topic); the brokers it names can then be
        called by ``node_id``."""

    async def aclose(self) -> None:
        """Closes the connections (the gateway closes its own client at shutdown)."""


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One record of a state log; ``value`` None is a tombstone (a deletion)."""

    offset: int
    key: bytes
    value: bytes | None
    timestamp: int


class StateLog(Protocol):
    """Partition 0 of one topic on the backing cluster, for state a plugin shares across the fleet
    (compacted by default: the last value of each key is the state)."""

    topic: str

    async def ensure_topic(self) -> None:
        """Creates the topic unless it exists."""

    async def append(self, key: bytes, value: bytes | None) -> int:
        """Writes one record (acks=all); returns its offset. ``None`` deletes the key."""

    async def append_many(self, items: Sequence[tuple[bytes, bytes | None]]) -> int:
        """Writes records in one request; returns the offset of the last."""

    async def end_offset(self) -> int:
        """The offset the next record will get."""

    async def read(self, offset: int, max_wait: float = 0.5) -> tuple[list[LogRecord], int]:
        """Records from ``offset`` (waiting up to ``max_wait`` seconds for some) and the next offset."""

    async def aclose(self) -> None:
        """Closes the log's connections."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a client is, as the gateway's connections know it: the name interceptor scopes match as
    ``username``, the groups it belongs to, its virtual cluster (None: the gateway's own cluster)."""

    name: str
    groups: tuple[str, ...] = ()
    vcluster: str | None = None


class Identities(Protocol):
    """The gateway's service accounts and tokens, for a plugin that authenticates clients of its own
    (an HTTP endpoint) with the same credentials Kafka clients use."""

    def verify_token(self, username: str, token: str) -> Principal | None:
        """The principal of a login with a gateway token (``POST /gateway/v2/token``) as the password,
        or None when refused: a bad, expired or forged token, a token of another user, or no such
        LOCAL service account. The reason goes to the gateway's log (never the token)."""


class GatewayAcls(Protocol):
    """The Kafka ACLs the gateway enforces on its passthrough cluster (``GATEWAY_ACL_ENABLED``), with
    Kafka's rules and the gateway's super users: one source of truth for plugins that authorize
    something by topic ACLs (the schema registry proxy's topic-acl mode)."""

    def allows(
        self, principal: str, operation: AclOperation, resource_type: AclResourceType, name: str, host: str = "*"
    ) -> bool:
        """Whether ``principal`` (``alice`` or ``User:alice``) from ``host`` may do ``operation`` on the
        resource. With ``host="*"`` (a caller that knows no client address) only ACLs for every host
        apply."""


@dataclass(frozen=True, slots=True)
class FleetMember:
    """One gateway node of the fleet, as it announced itself when it joined the membership group."""

    #: A random id the node draws at each start (a restarted node has a new one).
    node_id: str
    #: The host its clients connect to (``GATEWAY_ADVERTISED_HOST``).
    host: str
    #: Its first and last Kafka client ports (``GATEWAY_PORT_START`` and the ports after it).
    first_port: int
    last_port: int
    #: Its admin API, health and metrics port (``GATEWAY_HTTP_PORT``).
    http_port: int
    #: Its rack or zone (``GATEWAY_RACK_ID``), None when it announced none.
    rack: str | None
    #: Its Kanal version.
    version: str
    #: When it started, in milliseconds since the epoch.
    start_time_ms: int
    #: Whether it leads the group in the generation of the member list.
    leader: bool = False


class Fleet(Protocol):
    """The gateway nodes of this node's fleet: the members of its membership group on the backing
    cluster (``GATEWAY_GROUP_ID``, docs/fleet.md), for a plugin that must do something on one node of
    the fleet at a time (follow an external system, run a periodic job): let the group's leader do it.

    The group's coordinator elects the leader; when the leader stops or vanishes, the next generation
    of the group has another one. A gateway that joins no group (a test gateway) is a fleet of one
    that it leads. :func:`while_leader` runs a task on the leader only::

        async def follow(services: GatewayServices) -> None:
            await while_leader(services.fleet, poll_the_thing, services)  # in a companion service
    """

    @property
    def node_id(self) -> str:
        """This node's id (:attr:`FleetMember.node_id`): its entry in :attr:`members`."""

    @property
    def members(self) -> tuple[FleetMember, ...]:
        """The members of the group's last generation, as its leader handed the list out (this node
        alone before its first join); a member whose announcement cannot be read is left out."""

    @property
    def leader(self) -> FleetMember | None:
        """The member that leads the last generation (None before the first join, or when its
        announcement cannot be read). It is not necessarily still alive: a killed leader stays
        until the group's coordinator drops it (``KAFKA_SESSION_TIMEOUT_MS``)."""

    @property
    def is_leader(self) -> bool:
        """Whether this node leads its fleet now: it is in the group's current generation, as its
        leader. False while it joins, while the group rebalances (a node came or went), during a
        cluster outage and once it leaves (at shutdown, before it drains its clients). At most one
        node says True at a time, except that a node cut off from the cluster learns it only when
        its session expires, as a Kafka consumer does: a task that must never overlap with its
        successor's fences its own writes."""

    @property
    def generation(self) -> int:
        """The group generation of :attr:`members` (-1 before the first join; 0 without a group)."""

    async def changed(self) -> None:
        """Returns once what this view shows has changed (members, leader, :attr:`is_leader`,
        generation). Read the view, then ``await fleet.changed()``, then read it again: nothing is
        missed between the read and the call (a trio task is switched only at an ``await``)."""


async def while_leader(fleet: Fleet, fn: Callable[..., Awaitable[Any]], *args: Any) -> NoReturn:
    """Runs ``fn(*args)`` while this node leads its fleet: started when it becomes the leader,
    cancelled when it stops being the leader, started again when it leads again. Never returns;
    cancel it (it is cancelled with the gateway when it runs in a companion service or through
    ``start_soon``). ``fn`` cleans up in ``finally`` (shielded for I/O, with a timeout); an exception
    it raises ends ``while_leader`` with it. When ``fn`` returns while the node leads, it is not
    started again before the node has stopped leading and leads again."""
    while True:
        while not fleet.is_leader:
            await fleet.changed()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fn, *args)
            while fleet.is_leader:
                await fleet.changed()
            nursery.cancel_scope.cancel()


class GatewayServices(Protocol):
    """The gateway as a plugin sees it."""

    @property
    def cluster_id(self) -> str:
        """The gateway cluster's name (``GATEWAY_CLUSTER_ID``): names state topics and metrics."""

    @property
    def metrics(self) -> CollectorRegistry:
        """The Prometheus registry the admin API's ``/metrics`` serves: register metrics here."""

    @property
    def topic_names(self) -> TopicNames:
        """Topic ids and names (Produce and Fetch v13+ name topics by id)."""

    @property
    def kafka(self) -> KafkaClient:
        """The gateway's own Kafka client for the backing cluster."""

    @property
    def shared(self) -> dict[str, Any]:
        """State this plugin shares between its plugin hooks and its interceptors on this gateway
        (one dict per plugin per gateway; empty at first). An interceptor finds here what its
        plugin built (compiled rules, a helper process) instead of in a module-global registry."""

    @property
    def identities(self) -> Identities:
        """Checks credentials against the gateway's service accounts and tokens."""

    @property
    def acls(self) -> GatewayAcls | None:
        """The ACLs the gateway enforces on its passthrough cluster, or None when it enforces none
        (``GATEWAY_ACL_ENABLED`` unset: the cluster's own ACLs, if any, are the ones that count)."""

    @property
    def fleet(self) -> Fleet:
        """The nodes of this gateway's fleet and whether this one leads it (the same object on every
        call)."""

    @property
    def hook_timeout(self) -> float:
        """Seconds a hook may run before the core fails its request and closes the connection
        (``GATEWAY_HOOK_TIMEOUT_MS``, from the environment or the config file): an interceptor that
        holds requests back, a rate limiter, keeps its holds under it."""

    def settings(self, prefix: str) -> Mapping[str, str]:
        """The gateway's environment variables that start with ``prefix`` (``"DATA_QUALITY_"``).
        Plugins read their settings here, not from ``os.environ``, so tests and fleets can set them."""

    def feature(self, name: str, default: bool = False) -> bool:
        """The feature flag ``GATEWAY_FEATURE_FLAGS_<NAME>`` (``name`` in any case), from the
        environment or the config file's ``gateway.featureFlags``; ``default`` when unset."""

    def install(self, specs: Sequence[InterceptorSpec]) -> None:
        """Replaces the interceptors this plugin installs (all of them at once; ``[]`` removes them).
        Raises :class:`~kanal.api.errors.InterceptorConfigError` before changing anything if one is
        invalid. Connections pick up the change on their next request."""

    def state_log(self, topic: str, *, compacted: bool = True, retention_ms: int | None = None) -> StateLog:
        """A state log on ``topic`` of the backing cluster (created by ``ensure_topic``)."""

    def connect(self, properties: Mapping[str, str]) -> KafkaClient:
        """A Kafka client for another cluster, configured like the gateway's upstream: ``properties``
        are the ``KAFKA_*``-style names without the prefix (``{"bootstrap.servers": "h:9092",
        "security.protocol": "SASL_SSL", ...}``). Raises ``ConfigError`` naming a bad property.
        Close it with ``aclose()`` when done."""

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str | None = None) -> None:
        """Runs ``fn(*args)`` in the background until it returns or the gateway shuts down (it is then
        cancelled). An exception it raises is logged with ``name``, and does not stop the gateway."""

    def audit(self, event_type: str, connection: Connection | None, event_data: Any) -> None:
        """Records a decision in the gateway's audit log (the topic ``_kanal_<cluster>_auditlogs``,
        served by ``GET /gateway/v2/audit``): ``event_type`` names it (``SAFEGUARD``,
        ``DATA_QUALITY``...), ``connection`` is the client it concerns (its principal, virtual cluster
        and addresses go into the event; None: no client), ``event_data`` is a string or a JSON-ready
        value, never a secret. One event per decision (per request, not per record). It never waits:
        events are buffered and written in the background; with GATEWAY_FEATURE_FLAGS_AUDIT=false it
        does nothing."""


class Service(Protocol):
    """A companion service of the gateway (``kanal_gateway_services``): it calls
    ``task_status.started()`` once it serves, and runs until cancelled at shutdown."""

    async def __call__(self, *, task_status: trio.TaskStatus[None]) -> None: ...
