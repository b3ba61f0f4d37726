"""What the plugin shares on one gateway: its metrics and the KMS connections declared there.

Kept in ``services.shared`` (one per plugin per gateway): the metrics must be registered once in
the gateway's registry, and the connections are parsed once from its settings (the startup check
has already refused the ones that cannot work).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from kanal.api import GatewayServices

from .kms.connections import PREFIX, KmsConnection, parse_kms_connections
from .kms.factory import KmsPool
from .metrics import EncryptionMetrics

__all__ = ["Runtime", "runtime_of"]

log = logging.getLogger("kanal_encryption")
_KEY = "kanal_encryption"


class Runtime:
    def __init__(self, connections: Mapping[str, KmsConnection], metrics: EncryptionMetrics) -> None:
        self.connections = connections
        self.metrics = metrics


def runtime_of(services: GatewayServices) -> Runtime:
    runtime = services.shared.get(_KEY)
    if isinstance(runtime, Runtime):
        return runtime
    runtime = Runtime(parse_kms_connections(services.settings(PREFIX)), EncryptionMetrics(services.metrics))
    services.shared[_KEY] = runtime
    return runtime


async def check_connections(services: GatewayServices) -> None:
    """Reaches every KMS connection once at startup and reports the ones that do not answer: not
    fatal (the KMS may come up later; until then produce to encrypted topics fails, retriably)."""
    pool = KmsPool()
    try:
        for connection in runtime_of(services).connections.values():
            client = pool.get(connection.kind, connection.settings)
            try:
                await client.check()
            except Exception as exc:  # (any failure: reported, never fatal)
                log.warning("KMS connection %s (%s) cannot be reached now: %s", connection.name, connection.kind, exc)
            else:
                log.info("KMS connection %s (%s) answers", connection.name, connection.kind)
    finally:
        await pool.aclose()
