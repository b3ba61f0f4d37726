"""What the admin plane needs of the gateway it serves: a protocol, so that the admin API depends on
the gateway's interface and never imports ``kanal.gateway`` (which composes the admin plane)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import trio

    from kanal.api.services import GatewayServices, Service
    from kanal.config.settings import Settings
    from kanal.identity.accounts import ServiceAccounts
    from kanal.identity.directory import Directory
    from kanal.identity.groups import Groups
    from kanal.identity.scram_credentials import ScramCredentials
    from kanal.metrics import GatewayMetrics
    from kanal.net.membership import FleetMembership
    from kanal.pipeline.chain import Pipeline
    from kanal.pipeline.registry import PluginRegistry
    from kanal.tenancy.aliases import AliasTopics
    from kanal.tenancy.clusters import VirtualClusters


class GatewayHost(Protocol):
    """The gateway, as the admin API, the resource store and the interceptor kind use it."""

    settings: Settings
    registry: PluginRegistry
    pipeline: Pipeline
    metrics: GatewayMetrics
    services: list[Service]
    stopping: trio.Event
    virtual_clusters: VirtualClusters
    service_accounts: ServiceAccounts
    scram_credentials: ScramCredentials
    groups: Groups
    directory: Directory
    aliases: AliasTopics
    fleet: FleetMembership | None  # the membership group (None before the node serves, or without one)

    def services_for(self, plugin: str) -> GatewayServices:
        """What plugin ``plugin`` gets of the gateway."""
