"""Audit events of the admin API: who changed what, from where.

Each event goes to the gateway's audit log (the topic, as an ``ADMIN_API_CALL`` event, or an
``AUTHENTICATION`` one for a refused admin login; see :mod:`kanal.audit`) and to the ``kanal.audit``
logger as one line; with ``GATEWAY_LOG_FORMAT=json`` every field of the line is a JSON key (``event``,
``action``, ``kind``, ``name``, ``scope``, ``result``, ``user``, ``clientAddress``,
``listenerAddress``). Addresses are written ``host:port`` (``[v6]:port`` for IPv6), never with
resolution markers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kanal.audit import AuditLog

if TYPE_CHECKING:
    from kanal.admin.host import GatewayHost

audit_log = logging.getLogger("kanal.audit")


def host_port(address: Any) -> str | None:
    """``host:port`` of an ASGI ``client``/``server`` pair, or None."""
    if not address:
        return None
    try:
        host, port = address[0], address[1]
    except (TypeError, IndexError):
        return None
    host = str(host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}" if port is not None else host


def audit(event: str, action: str, fields: Mapping[str, Any]) -> None:
    """Writes one audit line; ``fields`` become the structured ``extra`` of the log record."""
    extra = {"event": event, "action": action, **{k: v for k, v in fields.items() if v is not None}}
    summary = " ".join(f"{k}={v}" for k, v in extra.items() if k not in ("event", "action"))
    audit_log.info("%s %s %s", event, action, summary, extra=extra)


def audit_log_of(gateway: GatewayHost) -> AuditLog | None:
    """The gateway's audit log (``gateway.audit_log``), or None for a host without one."""
    found = getattr(gateway, "audit_log", None)
    return found if isinstance(found, AuditLog) else None
