"""The implementation of :class:`kanal.api.services.GatewayServices`: what plugins get of the gateway.

One :class:`CoreServices` per gateway holds the shared parts; each plugin gets a
:class:`PluginServices` view of it, so ``install`` replaces exactly that plugin's interceptors. Tasks
started before the gateway serves wait in a queue and start with it. :class:`GatewayFleet` is the
plugins' view of the gateway's membership group (:class:`kanal.net.membership.FleetMembership`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import trio

from kanal import __version__
from kanal.api.context import Connection
from kanal.api.errors import UpstreamError
from kanal.api.interceptor import InterceptorSpec
from kanal.api.services import (
    Fleet,
    FleetMember,
    GatewayAcls,
    GatewayServices,
    Identities,
    KafkaClient,
    Principal,
    StateLog,
)
from kanal.audit import AuditLog
from kanal.authz.acl import user_principal
from kanal.authz.store import AclDirectory
from kanal.config.upstream import parse_upstream
from kanal.identity.accounts import ServiceAccounts, user_pool_secret
from kanal.identity.token_login import token_login
from kanal.net.kafka_client import GatewayKafkaClient
from kanal.net.state_log import CompactedLog
from kanal.protocol.acl_codes import Operation as AclOperation
from kanal.protocol.acl_codes import ResourceType as AclResourceType
from kanal.protocol.member_metadata import MemberMetadata
from kanal.protocol.membership import FleetStatus, NodeState
from kanal.protocol.topic_names import TopicNames

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from kanal.config.settings import Settings
    from kanal.net.membership import FleetMembership
    from kanal.pipeline.chain import Pipeline

log = logging.getLogger(__name__)

__all__ = ["CoreServices", "FleetHost", "GatewayFleet", "PluginServices", "ResolvingTopicNames", "TokenIdentities"]


class ResolvingTopicNames:
    """The gateway's topic-name cache, with resolution through its own Kafka client on a miss; the
    passthrough cluster's view (``aliases``: its alias topics, name -> physical name)."""

    def __init__(self, names: TopicNames, kafka: GatewayKafkaClient) -> None:
        self.names = names
        self.kafka = kafka
        self.aliases: Mapping[str, str] = {}

    def name(self, topic_id: uuid.UUID) -> str | None:
        return self.names.name(topic_id)

    def id(self, name: str) -> uuid.UUID | None:
        return self.names.id(name)

    async def resolve(self, topic_id: uuid.UUID) -> str:
        name = self.names.name(topic_id)
        if name is None:
            try:
                await self.kafka.metadata()  # the gateway's client feeds the names it answers
            except UpstreamError as exc:
                log.warning("cannot resolve topic id %s: %s", topic_id, exc)
            name = self.names.name(topic_id)
        return name if name is not None else str(topic_id)

    def stored(self, name: str) -> str:
        return self.aliases.get(name, name)


class TokenIdentities(Identities):
    """Gateway-token logins against the gateway's service accounts; without
    GATEWAY_USER_POOL_SECRET_KEY every token is refused (there is no key to check it with)."""

    def __init__(self, secret_key: str | None, accounts: ServiceAccounts) -> None:
        self._secret = user_pool_secret(secret_key) if secret_key else None
        self._accounts = accounts

    def verify_token(self, username: str, token: str) -> Principal | None:
        if self._secret is None:
            log.info("refused a gateway token for %r: GATEWAY_USER_POOL_SECRET_KEY is not set", username)
            return None
        identity = token_login(self._secret, self._accounts, username, token)
        if isinstance(identity, str):
            log.info("refused a gateway token for %r: %s", username, identity)
            return None
        return Principal(identity.principal, identity.groups, identity.vcluster)


class FleetHost(Protocol):
    """What the fleet view reads of the gateway (:class:`kanal.gateway.Gateway` is one)."""

    node_id: str
    fleet: FleetMembership | None  # None before the gateway serves, or when it joins no group
    advertised_host: str
    port_count: int | None
    started_ms: int


#: How often :meth:`GatewayFleet.changed` looks at the membership (it has no change callback).
FLEET_POLL = 0.1


def _member(metadata: MemberMetadata, leader: bool) -> FleetMember:
    return FleetMember(
        node_id=metadata.node_id,
        host=metadata.host,
        first_port=metadata.first_port,
        last_port=metadata.last_port,
        http_port=metadata.http_port,
        rack=metadata.rack,
        version=metadata.version,
        start_time_ms=metadata.start_time_ms,
        leader=leader,
    )


class GatewayFleet(Fleet):
    """The plugins' view of the gateway's membership group (:attr:`GatewayServices.fleet`), read
    from the gateway's :class:`~kanal.net.membership.FleetMembership` at each access. Without a
    membership (a gateway built with ``fleet=False``, or no gateway) the node is a fleet of one that
    it leads."""

    def __init__(self, core: CoreServices) -> None:
        self._core = core
        self._own_id = str(uuid.uuid4())  # (only without a gateway)
        self._started_ms = int(time.time() * 1000)

    def _status(self) -> FleetStatus | None:
        host = self._core.host()
        membership = host.fleet if host is not None else None
        return membership.status() if membership is not None else None

    def _alone(self) -> FleetMember:
        settings = self._core.gateway_settings
        host = self._core.host()
        count = (host.port_count if host is not None else None) or settings.port_count or 1
        return FleetMember(
            node_id=self.node_id,
            host=host.advertised_host if host is not None else settings.advertised_host or settings.bind_host,
            first_port=settings.port_start,
            last_port=settings.port_start + count - 1,
            http_port=settings.http_port,
            rack=settings.rack_id,
            version=__version__,
            start_time_ms=host.started_ms if host is not None else self._started_ms,
            leader=True,
        )

    @property
    def node_id(self) -> str:
        status = self._status()
        if status is not None:
            return status.node.node_id  # (the gateway's node id, as it announces it)
        host = self._core.host()
        return host.node_id if host is not None else self._own_id

    @property
    def members(self) -> tuple[FleetMember, ...]:
        status = self._status()
        if status is None:
            return (self._alone(),)
        leader = status.leader_id
        return tuple(
            _member(m.metadata, bool(leader) and m.member_id == leader)
            for m in status.members
            if m.metadata is not None
        )

    @property
    def leader(self) -> FleetMember | None:
        return next((m for m in self.members if m.leader), None)

    @property
    def is_leader(self) -> bool:
        status = self._status()
        if status is None:
            return True
        return status.state is NodeState.STABLE and bool(status.member_id) and status.leader_id == status.member_id

    @property
    def generation(self) -> int:
        status = self._status()
        return 0 if status is None else status.generation

    def _view(self) -> tuple[Any, ...]:
        status = self._status()
        if status is None:
            return (None,)
        member_ids = tuple(m.member_id for m in status.members)
        return (status.generation, status.leader_id, member_ids, self.is_leader)

    async def changed(self) -> None:
        seen = self._view()
        while True:
            await trio.sleep(FLEET_POLL)
            if self._view() != seen:
                return


class CoreServices:
    """What every plugin's services share: one per gateway."""

    def __init__(
        self,
        settings: Settings,
        environ: Mapping[str, str],
        metrics: CollectorRegistry,
        topic_names: ResolvingTopicNames,
        kafka: GatewayKafkaClient,
        pipeline: Pipeline | None = None,
    ) -> None:
        self.gateway_settings = settings
        self.environ = dict(environ)
        self.metrics = metrics
        self.topic_names = topic_names
        self.kafka = kafka
        self.pipeline = pipeline
        self.identities: Identities = TokenIdentities(settings.user_pool_secret_key, ServiceAccounts())
        self.audit_log: AuditLog | None = None  # the gateway's (plugins' events are dropped without one)
        self.acls: GatewayAcls | None = None  # the passthrough cluster's, when the gateway enforces them
        # The gateway, for its membership group (the gateway sets it: ``fleet_host = gateway``).
        self.fleet_host: FleetHost | None = None
        self.fleet = GatewayFleet(self)
        self._plugins: dict[str, PluginServices] = {}
        self._nursery: trio.Nursery | None = None
        self._queued: list[tuple[Callable[..., Awaitable[Any]], tuple[Any, ...], str]] = []

    def host(self) -> FleetHost | None:
        """The gateway whose membership :attr:`fleet` shows (None without a gateway)."""
        return self.fleet_host

    def for_plugin(self, plugin: str) -> PluginServices:
        services = self._plugins.get(plugin)
        if services is None:
            services = self._plugins[plugin] = PluginServices(self, plugin)
        return services

    def start_soon(self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...], name: str) -> None:
        if self._nursery is None:
            self._queued.append((fn, args, name))
        else:
            self._nursery.start_soon(_logged, fn, args, name, name=name)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Runs the plugins' background tasks until cancelled (a companion service of the gateway)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            queued, self._queued = self._queued, []
            for fn, args, name in queued:
                nursery.start_soon(_logged, fn, args, name, name=name)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None


async def _logged(fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...], name: str) -> None:
    try:
        await fn(*args)
    except Exception:
        log.exception("background task %s failed", name)


class PluginServices(GatewayServices):
    """One plugin's view of the gateway."""

    def __init__(self, core: CoreServices, plugin: str) -> None:
        self._core = core
        self.plugin = plugin
        self._shared: dict[str, Any] = {}

    @property
    def shared(self) -> dict[str, Any]:
        return self._shared

    @property
    def cluster_id(self) -> str:
        return self._core.gateway_settings.cluster_id

    @property
    def metrics(self) -> CollectorRegistry:
        return self._core.metrics

    @property
    def topic_names(self) -> ResolvingTopicNames:
        return self._core.topic_names

    @property
    def kafka(self) -> KafkaClient:
        return self._core.kafka

    @property
    def identities(self) -> Identities:
        return self._core.identities

    @property
    def acls(self) -> GatewayAcls | None:
        return self._core.acls

    @property
    def fleet(self) -> Fleet:
        return self._core.fleet

    @property
    def hook_timeout(self) -> float:
        return self._core.gateway_settings.hook_timeout_ms / 1000

    def settings(self, prefix: str) -> Mapping[str, str]:
        return {key: value for key, value in self._core.environ.items() if key.startswith(prefix)}

    def feature(self, name: str, default: bool = False) -> bool:
        return self._core.gateway_settings.feature(name, default)

    def install(self, specs: Sequence[InterceptorSpec]) -> None:
        if self._core.pipeline is None:
            raise RuntimeError(f"plugin {self.plugin}: no gateway pipeline to install interceptors in")
        self._core.pipeline.configure(specs, source=self.plugin)

    def state_log(self, topic: str, *, compacted: bool = True, retention_ms: int | None = None) -> StateLog:
        settings = self._core.gateway_settings
        return CompactedLog(
            topic,
            settings.upstream,
            settings.upstream_connect_timeout_ms / 1000,
            settings.state_replication_factor,
            compacted=compacted,
            retention_ms=retention_ms,
        )

    def connect(self, properties: Mapping[str, str]) -> KafkaClient:
        settings = self._core.gateway_settings
        return GatewayKafkaClient(
            parse_upstream({}, properties),
            settings.upstream_connect_timeout_ms / 1000,
            settings.max_frame_size,
            f"kanal-{self.plugin}",
        )

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str | None = None) -> None:
        self._core.start_soon(fn, args, f"{self.plugin}: {name or getattr(fn, '__name__', 'task')}")

    def audit(self, event_type: str, connection: Connection | None, event_data: Any) -> None:
        audit_log = self._core.audit_log
        if audit_log is None:
            return
        if connection is None:
            audit_log.emit(
                event_type, user=None, vcluster=None, local_address=None, remote_address=None, event_data=event_data
            )
        else:
            audit_log.connection_event(event_type, connection, event_data)


class PassthroughAcls(GatewayAcls):
    """The passthrough cluster's ACLs as plugins see them (:attr:`GatewayServices.acls`)."""

    def __init__(self, directory: AclDirectory) -> None:
        self._directory = directory

    def allows(
        self, principal: str, operation: AclOperation, resource_type: AclResourceType, name: str, host: str = "*"
    ) -> bool:
        authorizer = self._directory.authorizer(None)
        return authorizer.allows(user_principal(principal), host, operation, resource_type, name)
