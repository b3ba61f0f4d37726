"""(being written)"""

from __future__ import annotations

from kanal.api import Interceptor

INTERCEPTORS: list[type[Interceptor]] = []
