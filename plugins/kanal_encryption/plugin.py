"""The ``encryption`` plugin object (entry point ``encryption = "kanal_encryption.plugin"``).

Public plugin API only (``kanal.api``):

* ``kanal_interceptor_types``: the ``encryption``, ``decryption`` and ``masking`` interceptor types;
* ``kanal_settings``: the family ``GATEWAY_EXTERNAL_CONNECTION_*`` for its KMS connections (types
  VAULT, AWS_KMS, AZURE_KEY_VAULT, GCP_KMS), checked at startup;
* ``kanal_settings`` also: schema registry connections in the same family (read, so Avro field
  encryption's ``schemaRegistryConnectionName`` works without the topic views plugin), and
  ``GATEWAY_ENCRYPTION_KEYS_TOPIC``, the gateway KMS's keys topic (default
  ``_kanal_<GATEWAY_CLUSTER_ID>_encryption_keys``);
* ``kanal_admin_routes``: ``/gateway/v2/encryption-key`` (the gateway KMS's key ids; DELETE one for
  crypto shredding, see :mod:`kanal_encryption.admin`);
* ``kanal_gateway_services``: reaches each KMS connection once at startup and reports the ones that
  do not answer (not fatal).
"""

from __future__ import annotations

import trio

from kanal.api import AdminRoutes, GatewayServices, Interceptor, Service, SettingsFamily, hookimpl

from .avro_fields import check_registry_connections
from .interceptors import DecryptionInterceptor, EncryptionInterceptor
from .kms.connections import PREFIX, check_kms_connections
from .kms.keystore import TOPIC_SETTING
from .masking import MaskingInterceptor
from .runtime import check_connections, runtime_of

__all__ = ["kanal_admin_routes", "kanal_gateway_services", "kanal_interceptor_types", "kanal_settings"]


@hookimpl
def kanal_interceptor_types() -> list[type[Interceptor]]:
    return [EncryptionInterceptor, DecryptionInterceptor, MaskingInterceptor]


@hookimpl
def kanal_settings() -> list[str | SettingsFamily]:
    return [
        SettingsFamily(PREFIX, check_kms_connections),
        SettingsFamily(PREFIX, check_registry_connections),
        TOPIC_SETTING,
    ]


@hookimpl
def kanal_admin_routes(admin: AdminRoutes, services: GatewayServices) -> None:
    from .admin import add_routes

    add_routes(admin, services)


@hookimpl
def kanal_gateway_services(services: GatewayServices) -> list[Service]:
    if not runtime_of(services).connections:
        return []

    async def report_kms(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await check_connections(services)

    return [report_kms]
