"""Usage interceptor types: ``chargeback`` (who moves how many bytes) and ``header-injection``
(records say who wrote them); see docs/safeguards-usage-headers.md."""

from __future__ import annotations

from kanal.api import Interceptor
from kanal_safeguards.usage import chargeback, header_injection

__all__ = ["INTERCEPTORS"]

INTERCEPTORS: list[type[Interceptor]] = [*chargeback.INTERCEPTORS, *header_injection.INTERCEPTORS]
