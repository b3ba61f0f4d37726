"""The fetch cache: produced and fetched batches kept per partition (``cache_store``) and Fetch
requests answered from them (``cache``)."""

from __future__ import annotations

from kanal.api import Interceptor
from kanal_safeguards.caching.cache import Cache

__all__ = ["INTERCEPTORS"]

INTERCEPTORS: list[type[Interceptor]] = [Cache]
