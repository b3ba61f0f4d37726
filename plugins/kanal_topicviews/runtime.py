"""What an interceptor instance needs from the gateway it serves, beyond its (JSON) config.

Interceptor configs must stay plain JSON (the admin API shows them), so the resource kind registers the
gateway and its external connections here under a token and passes the token in the config.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kanal.gateway import Gateway

    from .connections import ValueDecoders
    from .pool import HelperPool

__all__ = ["Runtime", "register_runtime", "runtime_of"]


@dataclass(frozen=True)
class Runtime:
    gateway: Gateway | None
    decoders: ValueDecoders | None
    read_ahead: bool = True
    pool: HelperPool | None = None


_RUNTIMES: dict[str, Runtime] = {}
_COUNTER = itertools.count(1)


def register_runtime(runtime: Runtime) -> str:
    """Registers ``runtime`` (one per gateway, for the process's life); returns its token."""
    token = f"gateway-{next(_COUNTER)}"
    _RUNTIMES[token] = runtime
    return token


def runtime_of(token: str) -> Runtime | None:
    return _RUNTIMES.get(token)
