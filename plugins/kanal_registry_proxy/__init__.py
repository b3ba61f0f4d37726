"""Kanal's schema registry proxy: authentication, per-subject authorization and observability in
front of a registry that speaks the Confluent schema registry REST API.

``kanal registry-proxy`` runs it alone; ``kanal run`` hosts it when ``SRP_ENABLED=true``. Operator
documentation: ``docs/registry-proxy.md``.
"""

from __future__ import annotations

__version__ = "1.0.0"
