"""What the gateway offers plugins and interceptors: :class:`GatewayServices` and the protocols it uses.

Interceptors get it as the second constructor argument, plugins in ``kanal_admin_resources``,
``kanal_admin_routes`` and ``kanal_gateway_services``. It is a protocol, not the gateway: a plugin sees
the gateway's cluster id, metrics registry, topic names, its own Kafka client, settings, the
interceptors it installs, state logs, background tasks and the audit log, and nothing else.
``kanal.testing`` has an implementation without a gateway, for unit tests.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import trio

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from kanal.api.context import Connection
    from kanal.api.interceptor import InterceptorSpec
    from kanal.protocol.acl_codes import Operation as AclOperation
    from kanal.protocol.acl_codes import ResourceType as AclResourceType

__all__ = [
    "GatewayAcls",
    "GatewayServices",
    "Identities",
    "KafkaClient",
    "LogRecord",
    "Principal",
    "Service",
    "StateLog",
    "TopicNames",
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
