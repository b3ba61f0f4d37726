"""The gateway: listeners, upstream discovery, shared state, and graceful shutdown."""

from __future__ import annotations

import errno
import gc
import itertools
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import trio

from kanal import __version__
from kanal.admin.store import ResourceStore
from kanal.api.context import Connection
from kanal.api.errors import UpstreamError
from kanal.api.interceptor import Interceptor, InterceptorSpec, Scope
from kanal.api.resources import KindRegistry
from kanal.api.services import Service
from kanal.api.services import TopicNames as TopicNamesView
from kanal.audit import AuditLog, node_source
from kanal.authz.enforcer import AclEnforcer
from kanal.authz.store import AclDirectory, acl_from_json
from kanal.config.settings import Settings
from kanal.identity.accounts import ServiceAccounts
from kanal.identity.directory import Directory
from kanal.identity.groups import Groups
from kanal.identity.scram_credentials import ScramCredentials
from kanal.metrics import GatewayMetrics
from kanal.net.authentication import authenticators
from kanal.net.channel import KafkaChannel
from kanal.net.connection import ClientConnection, FrameTap
from kanal.net.kafka_client import GatewayKafkaClient
from kanal.net.membership import FleetMembership
from kanal.net.peer_probe import probe_peers
from kanal.net.state_log import CompactedLog
from kanal.net.tls import CertificateRefused, certificate_principal, server_context, upstream_context
from kanal.net.upstream import open_upstream
from kanal.net.upstream_link import UpstreamLink
from kanal.net.upstream_pool import UpstreamPool
from kanal.pipeline.chain import PASSTHROUGH, Pipeline
from kanal.pipeline.core_rules import CoreRules
from kanal.pipeline.registry import PluginRegistry
from kanal.pipeline.topic_ids import TOPIC_IDS_FLAG, TopicIdsOff
from kanal.protocol.acl_codes import ACL_APIS
from kanal.protocol.api import ApiKey
from kanal.protocol.api import preload as preload_schemas
from kanal.protocol.api_versions import RecentAnswers
from kanal.protocol.balance import LoadBalancer, Standby, client_key, node_of
from kanal.protocol.member_metadata import MemberMetadata
from kanal.protocol.membership import FleetError, MemberConfig
from kanal.protocol.rewrite import Address, AddressOf, broker_racks
from kanal.protocol.sasl_mechanisms import Identity
from kanal.protocol.sasl_server import Authenticator
from kanal.protocol.topic_names import TopicNames
from kanal.services import CoreServices, PassthroughAcls, PluginServices, ResolvingTopicNames, TokenIdentities
from kanal.tenancy.aliases import AliasTopics
from kanal.tenancy.clusters import KAFKA_API, REST_API, VirtualClusters
from kanal.tenancy.interceptor import PassthroughAliases, VirtualClusterNames
from kanal.tenancy.names import VirtualNames
from kanal.tenancy.topic_ids import TenantTopicNames, VirtualTopicIds

log = logging.getLogger(__name__)
# accept(2) failing for lack of descriptors or memory: the listener waits and goes on (as trio's
# serve_listeners does) rather than the gateway stopping.
_ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
# Priorities of the core's built-in interceptors: outside and inside every configured one.
_OUTERMOST = -(2**63)
_INNERMOST = 2**63 - 1
# Longest the node waits for the coordinator's answer to its LeaveGroup at shutdown (the drain waits).
_LEAVE_TIMEOUT = 2.0


@dataclass(frozen=True)
class Listening:
    """What the gateway serves, once it is ready."""

    bootstrap: str
    first_port: int
    last_port: int
    min_broker_id: int
    upstream: str


def _host_port(stream: trio.abc.Stream) -> tuple[str, int, str, int]:
    """(peer host, peer port, local host, local port) of an accepted stream."""
    inner = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    assert isinstance(inner, trio.SocketStream)
    peer = inner.socket.getpeername()
    local = inner.socket.getsockname()
    return str(peer[0]), int(peer[1]), str(local[0]), int(local[1])


class Gateway:
    """One gateway node in front of one Kafka cluster."""

    def __init__(
        self,
        settings: Settings,
        registry: PluginRegistry,
        environ: Mapping[str, str] | None = None,
        *,
        fleet: bool = True,
    ) -> None:
        """``fleet``: whether the node joins its fleet's membership group (every deployment does;
        a replay against a scripted broker, which answers only what its capture holds, does not)."""
        self.settings = settings
        self.registry = registry
        self.metrics = GatewayMetrics()
        if settings.feature("lifecycle_metrics"):
            self.metrics.enable_lifecycle()
        self.topic_names = TopicNames()
        self._tenant_topic_names: dict[str, TenantTopicNames] = {}
        timeout = settings.upstream_connect_timeout_ms / 1000
        self.kafka = GatewayKafkaClient(
            settings.upstream,
            timeout,
            settings.max_frame_size,
            "kanal-gateway",
            on_metadata=self._own_metadata,
        )
        environ = os.environ if environ is None else environ
        self.core_services = CoreServices(
            settings,
            environ,
            self.metrics.registry,
            ResolvingTopicNames(self.topic_names, self.kafka),
            self.kafka,
        )
        self.core_services.fleet_host = self  # GatewayServices.fleet: this node's membership group
        self.pipeline = Pipeline(registry, self.services_for, self._retire, environ)
        self.service_accounts = ServiceAccounts()  # the GatewayServiceAccount resources applied
        self.groups = Groups(on_change=self.pipeline.groups_changed)  # the GatewayGroup resources applied
        self.directory = Directory(self.service_accounts, self.groups)
        self.pipeline.groups_of = self.groups.of  # live connections follow membership changes
        self.core_services.identities = TokenIdentities(settings.user_pool_secret_key, self.service_accounts)
        self.scram_credentials = ScramCredentials()  # the GatewayScramCredential resources applied
        self.recent_api_versions = RecentAnswers()  # answers ApiVersions before a login
        self._authenticators = authenticators(settings, self.service_accounts, self.scram_credentials)
        self.core_services.pipeline = self.pipeline
        self.pipeline.configure(settings.interceptors)
        self.core_rules = CoreRules(self.learn_brokers, self.topic_names, self.advertised_address)
        self.brokers: dict[int, Address] = {}
        self.broker_racks: dict[int, str | None] = {}
        # Internal load balancing (GATEWAY_FEATURE_FLAGS_INTERNAL_LOAD_BALANCING): the addresses each
        # client sees follow the fleet's live members; built with the membership (None: this node
        # answers with itself, as behind an external load balancer).
        self.balancer: LoadBalancer | None = None
        if settings.internal_load_balancing:
            self.core_rules.addresses_for = self.addresses_for
            self.core_rules.learn_racks = self.learn_racks
            self.core_rules.standbys_for = self.standbys_for
        self.min_broker_id = settings.min_broker_id
        self.port_count = settings.port_count
        self.advertised_host = settings.advertised_host or (
            socket.gethostname() if settings.bind_host in ("0.0.0.0", "::") else settings.bind_host
        )
        self._upstream_tls = upstream_context(settings.upstream)
        self._bootstrap = itertools.cycle(settings.upstream.bootstrap_servers)
        self._connection_ids = itertools.count(1)
        self.connections: set[ClientConnection] = set()
        self._pools: dict[int, UpstreamPool] = {}
        self._pool_nursery: trio.Nursery | None = None
        self._idle = trio.Event()
        self._idle.set()
        self._serve_scope = trio.CancelScope()
        self._accepting = trio.CancelScope()
        self._stopping = False
        self._unmapped_warned: set[int] = set()
        self.tap: FrameTap | None = None
        # Companion services (admin API, state followers...) started once the listeners are up:
        # each is ``async def service(gateway, *, task_status)`` and runs until cancelled.
        self.services: list[Service] = []
        if self._authenticators is not None:
            self.services.extend(self._authenticators.services)  # OAUTHBEARER's JWKS refresher
        self.stopping = trio.Event()
        # The membership group (GATEWAY_GROUP_ID), built once the ports are known; what stopped the
        # node, when its membership could not go on (the process's exit code).
        self._joins_fleet = fleet
        self.node_id = str(uuid.uuid4())
        self.started_ms = int(time.time() * 1000)
        self.fleet: FleetMembership | None = None
        self.failure: FleetError | None = None
        # The audit log (GATEWAY_FEATURE_FLAGS_AUDIT): logins here, admin changes and plugins' decisions.
        source = node_source(self.advertised_host, settings.port_start)
        self.audit_log = AuditLog.for_gateway(settings, self.metrics, source)
        self.core_services.audit_log = self.audit_log
        if self.audit_log.enabled:
            self.services.append(self.audit_log.run)
        super_users = settings.super_users
        if super_users is None:
            super_users = tuple(user.username for user in settings.admin_api_users)
        self.acls = AclDirectory(super_users, on_change=self.pipeline.decisions_changed)
        # Followed from startup when the passthrough cluster's ACLs are on, else from the first
        # virtual cluster with ACLs on (a request decided before it is read is denied).
        self._follow_acls: Service | None = self._acl_store()
        if settings.acl_enabled:
            self.services.append(self._follow_acls)
            self._follow_acls = None
        self.virtual_clusters = VirtualClusters(on_change=self._virtual_clusters_changed)
        self.aliases = AliasTopics(on_change=self._aliases_changed)  # the AliasTopic resources applied
        self.pipeline.builtins = self._builtins
        if settings.acl_enabled:
            self.core_rules.answered_here = ACL_APIS
            self.core_services.acls = PassthroughAcls(self.acls)

    def _virtual_clusters_changed(self) -> None:
        """The virtual clusters' ACL configuration and chains follow their resources."""
        clusters = list(self.virtual_clusters)
        self.acls.configure(
            {c.name: c.super_users for c in clusters if c.acl_mode == KAFKA_API},
            {c.name: [acl_from_json(a) for a in c.acls] for c in clusters if c.acl_mode == REST_API},
        )
        self.pipeline.builtins_changed()

    def _aliases_changed(self) -> None:
        """A virtual cluster's names follow its aliases: its chains and its interceptors' names."""
        self._tenant_topic_names.clear()
        self.core_services.topic_names.aliases = dict(self.aliases.of(None))
        self.pipeline.builtins_changed()

    def _acl_store(self) -> Service:
        """The ACLs created with the Kafka Admin API: a store on their own compacted topic,
        followed like the admin resources' (GATEWAY_ACLS_TOPIC)."""
        settings = self.settings
        topic = settings.acls_topic or f"_kanal_{settings.cluster_id}_acls"
        timeout = settings.upstream_connect_timeout_ms / 1000
        kinds = KindRegistry()
        kinds.add(self.acls.kind)
        store = ResourceStore(
            kinds,
            CompactedLog(topic, settings.upstream, timeout, settings.state_replication_factor),
            CompactedLog(topic, settings.upstream, timeout, settings.state_replication_factor),
        )
        self.acls.writes = store

        async def follow(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            try:
                await store.run(task_status=task_status)
            finally:
                with trio.CancelScope(shield=True):
                    await store.writer.aclose()
                    await store.reader.aclose()

        return follow

    def _builtins(self, vcluster: str | None) -> list[tuple[InterceptorSpec, Interceptor]]:
        """The core's interceptors of a virtual cluster's connections (None: the passthrough
        cluster's): ACL enforcement outermost when its ACLs are on, then the refusal of requests by
        topic id while topic ids are off, its names innermost."""
        services = self.services_for("core")
        scope = Scope(vcluster=PASSTHROUGH if vcluster is None else vcluster)
        cluster = None if vcluster is None else self.virtual_clusters.get(vcluster)
        names = None if vcluster is None else self._names_of(vcluster)
        ids = self._topic_ids(vcluster)
        items: list[tuple[InterceptorSpec, Interceptor]] = []
        if self.settings.acl_enabled if vcluster is None else cluster is not None and cluster.acl_enabled:
            if self._follow_acls is not None:
                self.core_services.start_soon(self._follow_acls, (), "following the ACL topic")
                self._follow_acls = None
            spec = InterceptorSpec("kanal-acls", AclEnforcer.plugin_name, _OUTERMOST, scope)
            logical = None if names is None else names.logical_topic
            resolve_id = None if ids is None else ids.resolve
            items.append((spec, AclEnforcer(self.acls, services, vcluster, logical, resolve_id)))
        if not self.settings.feature(TOPIC_IDS_FLAG):
            spec = InterceptorSpec("kanal-topic-ids-off", TopicIdsOff.plugin_name, _OUTERMOST, scope)
            items.append((spec, TopicIdsOff(None, services)))
        if names is not None:
            spec = InterceptorSpec("kanal-virtual-cluster", VirtualClusterNames.plugin_name, _INNERMOST, scope)
            items.append((spec, VirtualClusterNames(names, services, names.prefix, ids)))
        elif self.aliases.of(None):
            spec = InterceptorSpec("kanal-aliases", PassthroughAliases.plugin_name, _INNERMOST, scope)
            items.append((spec, PassthroughAliases(dict(self.aliases.of(None)), services)))
        return items

    def _names_of(self, vcluster: str) -> VirtualNames:
        """A virtual cluster's names: its prefix and its alias topics."""
        return VirtualNames(vcluster, dict(self.aliases.of(vcluster)))

    def _topic_ids(self, vcluster: str | None) -> VirtualTopicIds | None:
        """A virtual cluster's own topic ids, with topic-id support on (else it shows the physical ones)."""
        if vcluster is None or not self.settings.feature(TOPIC_IDS_FLAG):
            return None
        return VirtualTopicIds(vcluster, self.aliases.of(vcluster), self.topic_names.name)

    def topic_names_for(self, vcluster: str | None) -> TopicNamesView:
        """Topic names as the interceptors of a virtual cluster's connections see them (None: the
        passthrough cluster's): the tenant's names and ids."""
        if vcluster is None:
            return self.core_services.topic_names
        names = self._tenant_topic_names.get(vcluster)
        if names is None:
            ids = self._topic_ids(vcluster)
            names = TenantTopicNames(self.core_services.topic_names, self._names_of(vcluster), ids)
            self._tenant_topic_names[vcluster] = names
        return names

    def topic_id_name(self, topic_id: uuid.UUID) -> str | None:
        """The name of a topic id if the gateway has seen it (no I/O)."""
        return self.topic_names.name(topic_id)

    def services_for(self, plugin: str) -> PluginServices:
        """What plugin ``plugin`` gets of this gateway (the same object on every call)."""
        return self.core_services.for_plugin(plugin)

    def _retire(self, interceptor: Interceptor) -> None:
        """Closes an interceptor that was replaced or removed, in the background."""
        self.core_services.start_soon(interceptor.aclose, (), f"closing interceptor {type(interceptor).__name__}")

    # -- addresses -----------------------------------------------------------------------------

    def advertised_address(self, node_id: int) -> Address | None:
        """The gateway address that stands for an upstream broker, or None outside the port range."""
        assert self.min_broker_id is not None and self.port_count is not None
        index = node_id - self.min_broker_id
        if 0 <= index < self.port_count:
            return self.advertised_host, self.settings.port_start + index
        if node_id not in self._unmapped_warned:
            self._unmapped_warned.add(node_id)
            log.error(
                "broker %d is outside the gateway's port range (GATEWAY_MIN_BROKERID=%d, GATEWAY_PORT_COUNT=%d);"
                " clients will not reach it through the gateway",
                node_id,
                self.min_broker_id,
                self.port_count,
            )
        return None

    def addresses_for(self, client: Connection) -> AddressOf:
        """The broker addresses a client connection is to see: its share of the fleet (internal load
        balancing), keyed by its host, principal and client id; this node's own before the fleet is
        known, alone, or with the flag off."""
        balancer = self.balancer
        if balancer is None:
            return self.advertised_address
        return balancer.address_of(self._client_key(client))

    def standbys_for(self, client: Connection, brokers: Sequence[int]) -> tuple[Standby, ...]:
        """The other live nodes a client's Metadata answers list as brokers leading nothing, so
        that it knows where else to ask when its node dies (:mod:`kanal.protocol.balance`)."""
        balancer = self.balancer
        return () if balancer is None else balancer.standbys(self._client_key(client), brokers)

    @staticmethod
    def _client_key(client: Connection) -> str:
        return client_key(client.client_address.rpartition(":")[0], client.principal, client.client_id)

    def learn_racks(self, racks: dict[int, str | None]) -> None:
        """Records the brokers' racks a Metadata or DescribeCluster answer announces (rack-aware
        load balancing prefers a node in the broker's rack)."""
        if not racks:
            return
        self.broker_racks.update(racks)
        if self.balancer is not None:
            self.balancer.learn_racks(racks)

    def _own_metadata(self, response: Any) -> None:
        """What the gateway learns from the Metadata answers to its own requests."""
        self.topic_names.learn(ApiKey.METADATA, response)
        self.learn_racks(broker_racks(ApiKey.METADATA, response))

    def node_for_port(self, port: int) -> int:
        assert self.min_broker_id is not None
        return self.min_broker_id + port - self.settings.port_start

    def learn_brokers(self, brokers: dict[int, Address]) -> None:
        """Records upstream broker addresses announced in Metadata or DescribeCluster."""
        self.kafka.learn(brokers)
        for node_id, address in brokers.items():
            if self.brokers.get(node_id) != address:
                log.info("upstream broker %d is at %s:%d", node_id, *address)
                self.brokers[node_id] = address

    async def connect_upstream(self, node_id: int, *, relayed: bool = False) -> KafkaChannel:
        """A channel to the broker a client port stands for (a bootstrap server while unknown).
        ``relayed``: for a client that authenticates to the broker itself (KAFKA_MANAGED), so the
        gateway's own SASL credentials are not used on it (TLS still is)."""
        address = self.brokers.get(node_id) or next(self._bootstrap)
        upstream = self.settings.upstream
        if relayed and upstream.uses_sasl:
            upstream = replace(upstream, security_protocol="SSL" if upstream.uses_tls else "PLAINTEXT")
        return await open_upstream(
            address,
            upstream,
            self.settings.upstream_connect_timeout_ms / 1000,
            self.settings.max_frame_size,
            self._upstream_tls,
        )

    async def open_link(self, node_id: int, *, shared: bool) -> UpstreamLink:
        """A new link to broker ``node_id``, counted in ``gateway_upstream_connections_active``."""
        try:
            relayed = not shared and self.settings.security_mode == "kafka_managed"  # the client's own
            channel = await self.connect_upstream(node_id, relayed=relayed)
        except ConnectionError:
            self.metrics.upstream_error()
            raise
        gauge = self.metrics.upstream_connections
        gauge.inc()
        return UpstreamLink(
            channel,
            name=f"{'shared' if shared else 'own'}:{node_id}",
            request_timeout=self.settings.upstream_request_timeout_ms / 1000,
            shared=shared,
            tap=self.tap,
            on_closed=gauge.dec,
        )

    def identify(self, credential: Identity) -> Identity:
        return self.directory.identify(credential)

    def authentication_outcome(
        self, info: Connection, mechanism: str, failure: str | None, user: str | None = None
    ) -> None:
        if failure is not None:
            self.metrics.failed_authentication(mechanism)
        self.audit_log.authentication(info, failure, user)

    def authenticator(self, client_host: str) -> Authenticator | None:
        return self._authenticators(client_host) if self._authenticators is not None else None

    def upstream_pool(self, node_id: int) -> UpstreamPool | None:
        """The shared links to ``node_id`` (GATEWAY_UPSTREAM_CONNECTION_POOL_TYPE), or None."""
        if self.settings.upstream_pool_type == "none":
            return None
        pool = self._pools.get(node_id)
        if pool is None:
            assert self._pool_nursery is not None, "pools exist only while the gateway runs"

            async def open_link() -> UpstreamLink:
                return await self.open_link(node_id, shared=True)

            pool = self._pools[node_id] = UpstreamPool(
                self.settings.upstream_num_connection, open_link, self._pool_nursery
            )
        return pool

    # -- running -------------------------------------------------------------------------------

    async def discover(self) -> None:
        """Waits until the upstream answers Metadata, and derives the port mapping from it."""
        delay = 0.2
        while True:
            try:
                metadata = await self.kafka.metadata()
                break
            except UpstreamError as exc:
                log.warning("waiting for the upstream cluster: %s", exc)
                await trio.sleep(delay)
                delay = min(delay * 2, 5.0)
        preload_schemas(self.kafka.versions)
        self.learn_brokers({int(b.node_id): (str(b.host), int(b.port)) for b in metadata.brokers})
        ids = sorted(self.brokers)
        if not ids:
            log.warning("the upstream cluster announced no brokers yet")
        if self.min_broker_id is None:
            self.min_broker_id = ids[0] if ids else 0
        if self.port_count is None:
            self.port_count = (ids[-1] - self.min_broker_id if ids else 0) + 3
        for node_id in ids:
            self.advertised_address(node_id)  # warns now about brokers that no port serves

    def _fleet_membership(self) -> FleetMembership:
        """This node's membership, announcing its addresses (known once the upstream is discovered)."""
        settings = self.settings
        assert self.port_count is not None
        metadata = MemberMetadata(
            node_id=self.node_id,
            host=self.advertised_host,
            first_port=settings.port_start,
            last_port=settings.port_start + self.port_count - 1,
            http_port=settings.http_port,
            rack=settings.rack_id,
            version=__version__,
            start_time_ms=self.started_ms,
            min_broker_id=self.min_broker_id,
        )
        if settings.internal_load_balancing:
            assert self.min_broker_id is not None
            own = node_of(metadata)
            self.balancer = LoadBalancer(own, self.min_broker_id, self.advertised_address, self.broker_racks)
        upstream = settings.upstream
        config = MemberConfig(
            settings.fleet_group_id,
            metadata,
            session_timeout_ms=upstream.session_timeout_ms,
            heartbeat_interval_ms=upstream.heartbeat_interval_ms,
        )
        return FleetMembership(
            config,
            upstream,
            settings.upstream_connect_timeout_ms / 1000,
            settings.max_frame_size,
            on_members=self.metrics.fleet_members.set,
            on_fatal=self._fleet_failed,
            balancer=self.balancer,
        )

    def _fleet_failed(self, error: FleetError) -> None:
        """The membership cannot go on (another protocol in the group, no ACL): the node stops."""
        self.failure = error
        self.shutdown()

    async def run(self, *, task_status: trio.TaskStatus[Listening] = trio.TASK_STATUS_IGNORED) -> None:
        """Serves until :meth:`shutdown` completes."""
        await self.discover()
        assert self.port_count is not None and self.min_broker_id is not None
        if self._joins_fleet and self.fleet is None:
            self.fleet = self._fleet_membership()
        settings = self.settings
        ports = range(settings.port_start, settings.port_start + self.port_count)
        listeners: list[trio.abc.Listener[Any]] = []
        tls = server_context(settings)
        try:
            for port in ports:
                for tcp in await trio.open_tcp_listeners(port, host=settings.bind_host):
                    listeners.append(trio.SSLListener(tcp, tls) if tls is not None else tcp)
        except OSError as exc:
            for listener in listeners:
                await listener.aclose()
            raise OSError(
                exc.errno,
                f"cannot listen on {settings.bind_host}:{ports[0]}-{ports[-1]}: {exc.strerror}"
                " (set GATEWAY_PORT_START / GATEWAY_BIND_HOST)",
            ) from exc
        upstream = ",".join(f"{h}:{p}" for h, p in settings.upstream.bootstrap_servers)
        async with trio.open_nursery() as pools:
            self._pool_nursery = pools
            await self._serve(listeners, ports, upstream, task_status)
            pools.cancel_scope.cancel()  # the shared links, once every client connection is gone
        with trio.CancelScope(shield=True):
            for interceptor in self.pipeline.instances():
                try:
                    await interceptor.aclose()
                except Exception:
                    log.exception("closing interceptor %s failed", type(interceptor).__name__)
            await self.kafka.aclose()

    async def _serve(
        self,
        listeners: list[trio.abc.Listener[Any]],
        ports: range,
        upstream: str,
        task_status: trio.TaskStatus[Listening],
    ) -> None:
        settings = self.settings
        assert self.min_broker_id is not None
        async with trio.open_nursery() as nursery:

            async def accept(*, task_status: trio.TaskStatus[Any]) -> None:
                # Cancelled when shutdown starts: the listeners close, so a new connection is
                # refused rather than accepted and reset. Connections live in the outer nursery.
                with self._accepting:
                    async with trio.open_nursery() as accepting:
                        for listener in listeners:
                            accepting.start_soon(self._accept, listener, nursery)
                        task_status.started()

            with self._serve_scope:
                if settings.idle_connection_timeout_ms:
                    nursery.start_soon(self._close_idle, settings.idle_connection_timeout_ms / 1000)
                await nursery.start(accept)
                if self.fleet is not None:
                    await nursery.start(self.fleet.run)  # joins in the background: not a wait
                    if self.balancer is not None:
                        nursery.start_soon(probe_peers, self.balancer)
                await nursery.start(self.core_services.run)
                for service in self.services:
                    await nursery.start(service)
                # What startup built lives as long as the gateway: out of the collector's way, so
                # that a full collection while serving walks only what serving made (measured: 10-60
                # ms pauses at 3,000 requests a second, most of the p99, without it).
                gc.freeze()
                task_status.started(
                    Listening(f"{self.advertised_host}:{ports[0]}", ports[0], ports[-1], self.min_broker_id, upstream)
                )
                await trio.sleep_forever()
            # Shutdown: the listeners are closed. Leave the fleet first (the others learn at once that
            # this node is going), then let connections drain, then stop what is left.
            if self.fleet is not None:
                await self.fleet.leave(min(_LEAVE_TIMEOUT, settings.shutdown_timeout_ms / 1000))
            for connection in list(self.connections):
                connection.drain()
            with trio.move_on_after(settings.shutdown_timeout_ms / 1000) as draining:
                while self.connections:
                    await self._idle.wait()
            if draining.cancelled_caught and self.connections:
                log.warning("shutdown timeout: closing %d connections with requests in flight", len(self.connections))
            nursery.cancel_scope.cancel()

    def shutdown(self) -> None:
        """Stops accepting, stops reading new requests and lets in-flight ones finish."""
        if self._stopping:
            return
        self._stopping = True
        self.stopping.set()
        if self.balancer is not None:
            self.balancer.leave()  # from now on no answer names this node, its own neither
        log.info("shutting down: draining %d client connections", len(self.connections))
        self._accepting.cancel()
        self._serve_scope.cancel()  # (the serving task leaves the fleet, then drains the connections)

    async def _close_idle(self, timeout: float) -> None:
        """GATEWAY_IDLE_CONNECTION_TIMEOUT_MS: looks at every connection four times per timeout
        (at most once a second), so an idle one closes within 1.25 timeouts."""
        period = min(timeout / 4, 1.0)
        while True:
            await trio.sleep(period)
            now = trio.current_time()
            for connection in list(self.connections):
                connection.close_if_idle(now, timeout)

    async def _accept(self, listener: trio.abc.Listener[Any], connections: trio.Nursery) -> None:
        """Accepts clients until cancelled: ``trio.serve_listeners`` without its wrapper around each
        connection, which closed every stream a second time (in a cancelled scope: 5% of the CPU of
        a short connection, bench/auth_connections.py). :meth:`_handle` closes what it is given."""
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                        raise
                    log.error("accepting a client connection failed (%s); retrying in 100 ms", exc)
                    await trio.sleep(0.1)
                else:
                    connections.start_soon(self._handle, stream)

    async def _handle(self, stream: trio.abc.Stream) -> None:
        try:
            await self._serve_client(stream)
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            raise

    async def _serve_client(self, stream: trio.abc.Stream) -> None:
        """Serves one client until it leaves; the stream is closed on every way out."""
        try:
            peer_host, peer_port, local_host, local_port = _host_port(stream)
            if isinstance(stream, trio.SSLStream):
                with trio.move_on_after(self.settings.tls_handshake_timeout_ms / 1000) as handshake:
                    await stream.do_handshake()
                if handshake.cancelled_caught:
                    log.info(
                        "closing client %s:%d: no TLS handshake within GATEWAY_TLS_HANDSHAKE_TIMEOUT_MS (%d ms)",
                        peer_host,
                        peer_port,
                        self.settings.tls_handshake_timeout_ms,
                    )
                    await trio.aclose_forcefully(stream)
                    return
        except (trio.BrokenResourceError, OSError) as exc:
            # (trio's error says nothing of its own: the TLS reason, a missing client certificate..., is its cause)
            log.info("client connection failed before its first request: %s", exc.__cause__ or exc)
            await trio.aclose_forcefully(stream)
            return
        info = Connection(
            id=next(self._connection_ids),
            client_address=f"{peer_host}:{peer_port}",
            listener_address=f"{local_host}:{local_port}",
            node_id=self.node_for_port(local_port),
        )
        principal = None
        if isinstance(stream, trio.SSLStream):  # mTLS: the certificate names the client, before any request
            try:
                principal = certificate_principal(self.settings, stream.getpeercert(binary_form=True))
            except CertificateRefused as exc:
                log.info("closing client %s: %s", info.client_address, exc)
                self.authentication_outcome(info, "SSL", str(exc))
                await trio.aclose_forcefully(stream)
                return
        connection = ClientConnection(self, stream, info)
        if principal is not None:
            connection.identified(Identity(principal), "SSL")
            self.authentication_outcome(info, "SSL", None)
        self.connections.add(connection)
        if self._idle.is_set():
            self._idle = trio.Event()
        self.metrics.client_connections.inc()
        try:
            if self._stopping:
                connection.drain()
            await connection.run()
        except Exception:  # a plugin bug must cost one connection, never the listener
            log.exception("client connection %s failed", info.client_address)
        finally:
            self.metrics.client_connections.dec()
            self.connections.discard(connection)
            if not self.connections:
                self._idle.set()
