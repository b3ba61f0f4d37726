"""The audit log: who logged in, who changed what, which policy decided what, in a Kafka topic.

- :mod:`kanal.audit.events`: the events' JSON form, the filters of ``GET /gateway/v2/audit`` and the
  index that answers it (no I/O);
- :mod:`kanal.audit.log`: :class:`AuditLog`, the buffer and the companion task that writes the topic
  and reads it back.

Emitters: the gateway (every Kafka login, ``Gateway.authentication_outcome``), the admin API (changes,
token minting, refused admin logins) and plugins (``GatewayServices.audit``).
"""

from kanal.audit.events import (
    ADMIN_API_CALL,
    AUTHENTICATION,
    AUTHORIZATION,
    AuditIndex,
    AuditQuery,
    BadFilter,
    parse_query,
)
from kanal.audit.log import AuditLog, audit_log_topic, node_source

__all__ = [
    "ADMIN_API_CALL",
    "AUTHENTICATION",
    "AUTHORIZATION",
    "AuditIndex",
    "AuditLog",
    "AuditQuery",
    "BadFilter",
    "audit_log_topic",
    "node_source",
    "parse_query",
]
