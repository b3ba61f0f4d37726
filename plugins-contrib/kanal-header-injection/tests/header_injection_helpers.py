"""Helpers of the tests: interceptors made as the gateway makes them; gateway config and process.

Kanal's embedded helpers (``kanal.embedded``) start the gateway as a child process. The gateway
finds this plugin the way a production gateway would: through the ``kanal.plugins`` entry point of
the installed ``kanal-header-injection`` distribution.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import yaml
from kanal.embedded import GatewayProcess, TansuBroker
from kanal.testing import Harness

from kanal_header_injection import HeaderInjection


def header_injection(config: Mapping[str, Any]) -> HeaderInjection:
    """An interceptor as the gateway creates one: ``config`` validated against the plugin's schema by
    Kanal (raising :class:`~kanal.api.InterceptorConfigError` naming the key), then the constructor."""
    return cast(HeaderInjection, Harness().add(HeaderInjection, config))


def write_config(directory: Path, interceptors: Sequence[Mapping[str, Any]]) -> Path:
    """Writes a gateway config file holding ``interceptors``; returns its path."""
    path = directory / "kanal.yaml"
    path.write_text(yaml.safe_dump({"interceptors": interceptors}, sort_keys=False))
    return path


@contextmanager
def running_gateway(broker: TansuBroker, config: Path, log_dir: Path) -> Iterator[GatewayProcess]:
    """``python -m kanal run --config <config>`` in front of ``broker``; must stop cleanly."""
    process = GatewayProcess(
        broker.gateway_settings(), args=("run", "--config", str(config)), log_path=log_dir / "gateway.log"
    )
    process.start(timeout=30)
    try:
        yield process
    finally:
        code = process.stop(timeout=15)
    assert code == 0, f"gateway exited with {code} on SIGTERM:\n{process.tail()}"
