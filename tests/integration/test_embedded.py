"""The launchers in kanal.embedded: a real Tansu broker, and GatewayProcess driven by stand-in scripts."""

from __future__ import annotations

import os
import site
import socket
import stat
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from kanal.embedded import (
    EmbeddedProcessError,
    GatewayProcess,
    TansuBroker,
    free_port,
    free_port_block,
    gateway_env,
    probe_kafka,
)
from kanal.embedded import tansu as tansu_module

pytestmark = pytest.mark.integration


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def listening_socket() -> Iterator[socket.socket]:
    """A socket that holds a port, as another program would."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    try:
        yield sock
    finally:
        sock.close()


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# ---------------------------------------------------------------------------------------- ports


def test_free_port_is_bindable() -> None:
    port = free_port()
    assert 0 < port < 65536
    assert bindable(port)


@pytest.mark.parametrize("count", [1, 3, 8])
def test_free_port_block_is_consecutive_and_free(count: int) -> None:
    start = free_port_block(count)
    assert all(bindable(start + i) for i in range(count))
    assert start + count - 1 < 65536


def test_free_port_block_rejects_zero() -> None:
    with pytest.raises(ValueError):
        free_port_block(0)


# ---------------------------------------------------------------------------------------- tansu


def test_tansu_start_and_stop(tmp_path: Path) -> None:
    broker = TansuBroker(log_path=tmp_path / "tansu.log")
    with pytest.raises(RuntimeError):
        _ = broker.bootstrap  # no port yet
    broker.start(timeout=30)
    try:
        assert broker.running
        assert broker.node_id == 111
        assert broker.bootstrap == f"127.0.0.1:{broker.port}"
        assert probe_kafka("127.0.0.1", broker.port)
        assert not bindable(broker.port)
        assert "ready in" in broker.output
        with pytest.raises(RuntimeError):
            broker.start()  # once only
    finally:
        code = broker.stop()
    assert code == 0, broker.output  # Tansu exits cleanly on SIGTERM
    assert not broker.running
    assert broker.pid is not None and not pid_alive(broker.pid)
    assert not probe_kafka("127.0.0.1", broker.port, timeout=0.5)
    assert bindable(broker.port)
    assert broker.stop() == 0  # idempotent
    assert "ready in" in (tmp_path / "tansu.log").read_text()


def test_tansu_answers_kafka_clients_as_node_111() -> None:
    from confluent_kafka.admin import AdminClient

    with TansuBroker() as broker:
        metadata = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
        assert {b.id: (b.host, b.port) for b in metadata.brokers.values()} == {111: ("127.0.0.1", broker.port)}
        assert metadata.controller_id == 111
    assert not broker.running


def test_tansu_context_manager_stops_on_error() -> None:
    with pytest.raises(ZeroDivisionError), TansuBroker() as broker:
        pid = broker.pid
        1 / 0  # noqa: B018
    assert pid is not None and not pid_alive(pid)


def test_tansu_on_a_taken_port_fails_clearly(listening_socket: socket.socket) -> None:
    port = listening_socket.getsockname()[1]
    broker = TansuBroker(port=port)
    with pytest.raises(EmbeddedProcessError, match="address in use") as info:
        broker.start(timeout=15)
    assert "AddrInUse" in info.value.output  # Tansu's own words are in the error
    assert broker.pid is not None and not pid_alive(broker.pid)


def test_tansu_retries_when_its_picked_port_is_taken(
    listening_socket: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = listening_socket.getsockname()[1]
    picks = iter([taken, free_port()])
    monkeypatch.setattr(tansu_module, "free_port", lambda host="127.0.0.1": next(picks))
    with TansuBroker() as broker:
        assert broker.port != taken
        assert probe_kafka("127.0.0.1", broker.port)


def test_tansu_extra_args_reach_the_broker() -> None:
    # With --authentication Tansu still answers ApiVersions (SASL clients need it first) but resets
    # connections that send anything else unauthenticated.
    with TansuBroker(extra_args=["--authentication"]) as broker:
        assert "--authentication" in broker.argv()
        assert probe_kafka("127.0.0.1", broker.port)


def test_tansu_binary_that_dies_reports_its_output(tmp_path: Path) -> None:
    fake = script(tmp_path / "tansu", 'echo "boom: $*"\nexit 3\n')
    broker = TansuBroker(binary=fake)
    with pytest.raises(EmbeddedProcessError, match=r"exited while starting.*exit code 3") as info:
        broker.start(timeout=10)
    assert "boom: broker --listener-url" in info.value.output
    assert info.value.returncode == 3


def test_tansu_binary_that_never_listens_times_out_and_is_killed(tmp_path: Path) -> None:
    fake = script(tmp_path / "tansu", "echo 'ready in 0ms'\nexec sleep 60\n")
    broker = TansuBroker(binary=fake)
    with pytest.raises(EmbeddedProcessError, match="did not become ready"):
        broker.start(timeout=1)
    assert broker.pid is not None and not pid_alive(broker.pid)


# -------------------------------------------------------------------------------- gateway process
# The real gateway is exercised by the client tests; here stand-in scripts pin the launcher contract.


def fake_gateway(tmp_path: Path, body: str) -> GatewayProcess:
    """A GatewayProcess whose 'python' is a shell script (it receives ``-m kanal run``)."""
    return GatewayProcess({"GATEWAY_PORT_START": "1234"}, python=str(script(tmp_path / "fake-python", body)))


def test_gateway_process_ready_line_and_clean_stop(tmp_path: Path) -> None:
    gateway = fake_gateway(
        tmp_path,
        """\
        echo "starting with $* port=$GATEWAY_PORT_START unbuffered=$PYTHONUNBUFFERED"
        trap 'echo stopping; exit 0' TERM
        echo "ready: clients bootstrap at 127.0.0.1:$GATEWAY_PORT_START"
        while true; do sleep 0.1; done
        """,
    )
    with gateway:
        assert gateway.bootstrap == "127.0.0.1:1234"
        assert gateway.running
        assert "starting with -m kanal run port=1234 unbuffered=1" in gateway.output
    assert gateway.returncode == 0
    assert gateway.stop() == 0
    assert "stopping" in gateway.output


def test_gateway_process_is_killed_when_it_ignores_sigterm(tmp_path: Path) -> None:
    gateway = fake_gateway(
        tmp_path,
        """\
        trap '' TERM
        echo "ready: clients bootstrap at 127.0.0.1:1"
        while true; do sleep 0.1; done
        """,
    )
    gateway.start(timeout=10)
    assert gateway.stop(timeout=0.5) == -9
    assert gateway.pid is not None and not pid_alive(gateway.pid)


def test_gateway_process_early_exit_reports_output(tmp_path: Path) -> None:
    gateway = fake_gateway(tmp_path, "echo 'config error: GATEWAY_PORT_COUNT missing' >&2\nexit 2\n")
    with pytest.raises(EmbeddedProcessError, match=r"exited before it was ready.*exit code 2") as info:
        gateway.start(timeout=10)
    assert "config error: GATEWAY_PORT_COUNT missing" in info.value.output


def test_gateway_process_timeout_kills_it(tmp_path: Path) -> None:
    gateway = fake_gateway(tmp_path, "echo 'warming up'\nexec sleep 60\n")
    with pytest.raises(EmbeddedProcessError, match="no ready line within 1s") as info:
        gateway.start(timeout=1)
    assert "warming up" in info.value.output
    assert gateway.pid is not None and not pid_alive(gateway.pid)


def test_gateway_process_output_never_blocks_the_child(tmp_path: Path) -> None:
    # 2 MB before the ready line: far more than a pipe buffer, so only a drained pipe lets it through.
    log = tmp_path / "gateway.log"
    gateway = GatewayProcess(
        {},
        python=str(
            script(
                tmp_path / "fake-python",
                """\
                i=0
                while [ $i -lt 20000 ]; do
                  echo "noise line $i ......................................................................"
                  i=$((i+1))
                done
                echo "ready: clients bootstrap at 127.0.0.1:9"
                exec sleep 60
                """,
            )
        ),
        log_path=log,
    )
    with gateway:
        assert gateway.bootstrap == "127.0.0.1:9"
    assert "noise line 19999" in gateway.output
    assert log.read_text().count("noise line") == 20000


def test_gateway_env_is_hermetic_and_finds_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_PORT_COUNT", "99")
    monkeypatch.setenv("KAFKA_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("KANAL_TEST_MARKER", "kept")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = gateway_env({"GATEWAY_PORT_START": "5000"})
    assert "GATEWAY_PORT_COUNT" not in env and "KAFKA_SASL_MECHANISM" not in env
    assert env["GATEWAY_PORT_START"] == "5000"
    assert env["KANAL_TEST_MARKER"] == "kept"
    core = Path(tansu_module.__file__).resolve().parents[2]
    installed = core in {Path(p).resolve() for p in site.getsitepackages()}
    expected = ["/elsewhere"] if installed else [str(core), "/elsewhere"]
    assert env["PYTHONPATH"].split(os.pathsep) == expected
    kept = gateway_env({}, drop_inherited_config=False)
    assert kept["GATEWAY_PORT_COUNT"] == "99"


def test_gateway_process_runs_the_current_interpreter() -> None:
    assert GatewayProcess({}).argv == [sys.executable, "-m", "kanal", "run"]
