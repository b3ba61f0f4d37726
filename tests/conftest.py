"""Shared fixtures: a real Tansu broker, the Kanal gateway in front of it, and helpers.

- ``tansu``: one Tansu broker (in-memory storage) for the whole session.
- ``gateway``: ``python -m kanal run`` in front of ``tansu`` (module scope); its exit code on SIGTERM
  is checked at teardown.
- ``bootstrap``: parametrized ``direct`` / ``gateway``; the address a client should bootstrap from.
- ``unique_topic``: a factory of topic names unique to the test and the run.

When a test fails, the last lines the broker and the gateway printed are attached to its report.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator

import pytest

from kanal.embedded import GatewayProcess, TansuBroker

# Processes whose output is attached to the report of a failing test: (label, process).
_watched: list[tuple[str, TansuBroker | GatewayProcess]] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: needs a real Tansu broker and client libraries")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None] | pytest.TestReport:
    report: pytest.TestReport = yield
    if report.failed:
        for label, process in _watched:
            tail = process.output.splitlines()[-40:]
            if tail:
                report.sections.append((f"{label} output (last lines)", "\n".join(tail)))
    return report


@pytest.fixture(scope="session")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    """A running Tansu broker; ``.bootstrap`` is its address, ``.node_id`` is 111."""
    broker = TansuBroker(log_path=tmp_path_factory.mktemp("tansu") / "tansu.log")
    broker.start(timeout=30)
    entry = ("tansu", broker)
    _watched.append(entry)
    try:
        yield broker
    finally:
        _watched.remove(entry)
        broker.stop()


@pytest.fixture(scope="module")
def gateway(tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """The Kanal gateway in front of ``tansu``; stopped with SIGTERM at the end of the module, and the
    stop must be clean (exit code 0)."""
    process = GatewayProcess(tansu.gateway_settings(), log_path=tmp_path_factory.mktemp("kanal") / "gateway.log")
    process.start(timeout=30)
    entry = ("gateway", process)
    _watched.append(entry)
    try:
        yield process
    finally:
        _watched.remove(entry)
        code = process.stop(timeout=15)
    assert code == 0, f"gateway exited with {code} on SIGTERM:\n{process.tail()}"


@pytest.fixture(params=["direct", "gateway"])
def bootstrap(request: pytest.FixtureRequest, tansu: TansuBroker) -> str:
    """host:port for clients: the broker itself, or the gateway in front of it."""
    if request.param == "direct":
        return tansu.bootstrap
    process: GatewayProcess = request.getfixturevalue("gateway")
    if not process.running:
        pytest.fail(f"gateway is not running (exit code {process.returncode}):\n{process.tail()}")
    return process.bootstrap


@pytest.fixture
def unique_topic(request: pytest.FixtureRequest) -> Callable[..., str]:
    """``unique_topic(suffix="")`` returns a new topic name, unique per call, naming the test."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-")[:60]

    def make(suffix: str = "") -> str:
        parts = [base, suffix, uuid.uuid4().hex[:10]]
        return "-".join(p for p in parts if p)

    return make
