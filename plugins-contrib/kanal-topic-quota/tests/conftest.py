"""Fixtures for the plugin's tests: a real Tansu broker (in-memory storage) for the session.

The integration tests need the distribution installed (``pip install -e
plugins-contrib/kanal-topic-quota``): the gateway child process finds the plugin through its
``kanal.plugins`` entry point, exactly as in production.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kanal.embedded import TansuBroker


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: needs a real Tansu broker, the gateway and client libraries")


@pytest.fixture(scope="session")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    """A Tansu broker with in-memory storage; ``.bootstrap`` is its address, ``.node_id`` 111."""
    broker = TansuBroker(log_path=tmp_path_factory.mktemp("tansu") / "tansu.log")
    broker.start(timeout=30)
    try:
        yield broker
    finally:
        broker.stop()
