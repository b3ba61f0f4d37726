"""Assembling a proxy from its settings (every startup check happens here) and serving it.

:class:`ProxyService` refuses to be built, with a :class:`~kanal.api.ConfigError` naming the
variable at fault, for a missing, invalid or expired license, an invalid credentials file, an
unusable JWT setup, or a mode whose Kafka access is missing. It reaches the backing cluster through
what its host gives it: a :class:`~kanal.api.KafkaClient` (topic-acl mode) and a factory of
:class:`~kanal.api.StateLog` (reactive mode), the gateway's when ``kanal run`` hosts it, the command
line's when ``kanal registry-proxy`` runs it alone.

:meth:`ProxyService.serve` runs the background tasks (credential reloads, JWKS refresh, reactive
permissions and heartbeats) and the HTTP listener (:mod:`kanal_registry_proxy.httpserver`).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, cast

import trio
from prometheus_client import CollectorRegistry

from kanal.api import CliContext, ConfigError, GatewayAcls, Identities, KafkaClient, StateLog
from kanal_registry_proxy.acl import AclLookup
from kanal_registry_proxy.app import create_app
from kanal_registry_proxy.auth_basic import BasicAuthenticator, CredentialsError
from kanal_registry_proxy.auth_gateway import GatewayTokenAuthenticator
from kanal_registry_proxy.auth_jwt import JwtAuthenticator
from kanal_registry_proxy.authorization import (
    Authorization,
    GatewayAclMode,
    Mode,
    ReactiveMode,
    ReadOnlyMode,
    TopicAclMode,
)
from kanal_registry_proxy.httpserver import HttpServer
from kanal_registry_proxy.license import License, LicenseError, check_license
from kanal_registry_proxy.metrics import ProxyMetrics
from kanal_registry_proxy.proxy import RegistryProxy
from kanal_registry_proxy.reactive import PermissionStore, ReactiveSync
from kanal_registry_proxy.settings import ProxySettings
from kanal_registry_proxy.upstream import client_for

log = logging.getLogger(__name__)


class ProxyService:
    """One proxy: built (and checked) from settings, then served."""

    def __init__(
        self,
        settings: ProxySettings,
        *,
        registry: CollectorRegistry | None = None,
        access_writer: Callable[[str, dict[str, Any]], None] | None = None,
        kafka: KafkaClient | None = None,
        state_log: Callable[[str], StateLog] | None = None,
        owns_kafka: bool = False,
        identities: Identities | None = None,
        acls: GatewayAcls | None = None,
    ) -> None:
        """``kafka`` and ``state_log`` reach the backing cluster (needed by the topic-acl and the
        reactive mode); with ``owns_kafka``, :meth:`serve` closes ``kafka`` when it ends.
        ``identities`` are the hosting gateway's (needed by ``AUTH_PROVIDER=gateway``), ``acls`` the
        ACLs it enforces (topic-acl then decides by them instead of the cluster's)."""
        self.acls = acls
        self.settings = settings
        self.kafka = kafka
        self.state_log = state_log
        self.owns_kafka = owns_kafka
        for warning in settings.warnings:
            log.warning("%s", warning)
        self.metrics = ProxyMetrics(registry)
        try:
            self.license: License = check_license(settings.license_token, settings.license_public_key)
        except LicenseError as exc:
            raise ConfigError("VENDOR_LICENSE", str(exc)) from None
        self.metrics.license_expiry(self.license.expires_at)
        self.authenticator: BasicAuthenticator | JwtAuthenticator | GatewayTokenAuthenticator
        if settings.auth_provider == "gateway":
            if identities is None:
                raise ConfigError("AUTH_PROVIDER", "gateway needs the gateway to host the proxy (SRP_ENABLED=true)")
            self.authenticator = GatewayTokenAuthenticator(identities, self.metrics)
        elif settings.auth_provider == "basic":
            basic = BasicAuthenticator(
                settings.basic_auth_location,
                settings.basic_auth_reload_interval,
                settings.basic_auth_allow_plaintext,
                self.metrics,
            )
            try:
                basic.load()
            except CredentialsError as exc:
                raise ConfigError("BASIC_AUTH_LOCATION", str(exc)) from None
            self.authenticator = basic
        else:
            assert settings.jwt is not None
            self.authenticator = JwtAuthenticator(settings.jwt, self.metrics)
        self.mode = self._mode()
        self.authorization = Authorization(self.mode, settings.super_users, self.metrics)
        self.client = client_for(settings.upstream)
        self.proxy = RegistryProxy(
            self.client,
            self.authenticator,
            self.authorization,
            self.metrics,
            subject_cache_ttl=settings.guid_subject_cache_ttl,
            access_log_enabled=settings.access_log,
            access_writer=access_writer,
        )
        self.ready = False
        self.app = create_app(self.proxy, self.metrics, lambda: self.ready)
        self.binds: list[str] = []

    def _mode(self) -> Mode:
        settings = self.settings
        if settings.authorization_mode == "read-only":
            return ReadOnlyMode()
        if settings.authorization_mode == "topic-acl":
            if self.acls is not None:
                return GatewayAclMode(self.acls)
            if self.kafka is None:
                raise ConfigError("AUTHORIZATION_MODE", "topic-acl needs a Kafka client for the cluster's ACLs")
            lookup = AclLookup(
                self.kafka, settings.topic_acl_cache_ttl, settings.topic_acl_lookup_timeout, self.metrics
            )
            return TopicAclMode(lookup)
        if self.state_log is None:
            raise ConfigError("AUTHORIZATION_MODE", "reactive needs the Kafka cluster of the permission topics")
        store = PermissionStore()
        sync = ReactiveSync(
            store,
            self.state_log(settings.commands_topic),
            self.state_log(settings.events_topic),
            app_id=settings.app_id,
            instance_id=settings.instance_id,
            heartbeat_interval=settings.heartbeat_interval,
            auth_provider=settings.auth_provider,
            metrics=self.metrics,
        )
        return ReactiveMode(store, sync)

    def describe(self) -> str:
        s = self.settings
        return (
            f"upstream {s.upstream.url}, AUTH_PROVIDER={s.auth_provider}, AUTHORIZATION_MODE={s.authorization_mode}, "
            f"{self.license.describe()}"
        )

    async def serve(
        self,
        *,
        task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
        shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Runs until cancelled, or until ``shutdown_trigger`` returns and the requests in flight
        are answered (at most 5 s); reports the bound addresses."""
        settings = self.settings
        server = HttpServer(self.proxy, cast(Any, self.app), self._tls())
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.authenticator.run)
                await nursery.start(self.mode.run)
                await nursery.start(self.client.watch)
                self.ready = True
                try:
                    self.binds = await nursery.start(server.serve, settings.bind_host, settings.http_port)
                except OSError as exc:
                    raise OSError(
                        exc.errno,
                        f"cannot serve the registry proxy on {settings.bind_host}:{settings.http_port}: "
                        f"{exc.strerror} (set SRP_HTTP_PORT / SRP_BIND_HOST)",
                    ) from exc
                log.info("schema registry proxy on %s: %s", ", ".join(self.binds), self.describe())
                task_status.started(self.binds)
                if shutdown_trigger is not None:
                    await shutdown_trigger()
                    self.ready = False
                    server.drain()
                    with trio.move_on_after(5):
                        while server.connections:
                            await trio.sleep(0.02)
                    nursery.cancel_scope.cancel()
        finally:
            self.ready = False
            with trio.CancelScope(shield=True):
                await self.client.aclose()
                if self.owns_kafka and self.kafka is not None:
                    await self.kafka.aclose()

    def _tls(self) -> ssl.SSLContext | None:
        settings = self.settings
        if settings.tls_certificate_location is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(settings.tls_certificate_location, settings.tls_key_location)
        return context

    @property
    def url(self) -> str:
        """The first bound address as a URL (after :meth:`serve` started)."""
        bind = self.binds[0]
        return bind if bind.startswith("http") else f"http://{bind}"


def standalone(
    settings: ProxySettings,
    cli: CliContext,
    *,
    access_writer: Callable[[str, dict[str, Any]], None] | None = None,
) -> ProxyService:
    """A proxy as ``kanal registry-proxy`` runs it: Kafka as the ``KAFKA_*`` variables name it, through
    the command line (a bad ``KAFKA_*`` variable raises ``ConfigError`` naming it)."""
    kafka = cli.kafka() if settings.authorization_mode == "topic-acl" else None
    return ProxyService(settings, access_writer=access_writer, kafka=kafka, state_log=cli.state_log, owns_kafka=True)
