"""The kanal command as an operator meets it: startup errors, stopping while still starting."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kanal.embedded import free_port
from kanal.embedded.gateway_process import gateway_env

pytestmark = pytest.mark.integration


def _kanal(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kanal", *args],
        env=gateway_env(env),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def test_bad_setting_fails_at_startup_naming_the_key() -> None:
    proc = _kanal("run", env={"GATEWAY_PORT_START": "not-a-port"})
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "GATEWAY_PORT_START: expected an integer, got 'not-a-port'" in out


def test_run_without_a_cluster_fails_naming_kafka_bootstrap_servers() -> None:
    proc = _kanal("run", env={"GATEWAY_HTTP_PORT": str(free_port())})
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "KAFKA_BOOTSTRAP_SERVERS: required: the Kafka cluster the gateway fronts" in out


def test_missing_placeholder_variable_fails_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "kanal.yaml"
    config.write_text("kafka:\n  bootstrap.servers: ${NO_SUCH_VARIABLE}\n")
    proc = _kanal("run", "--config", str(config), env={})
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "environment variable NO_SUCH_VARIABLE is not set" in out


def test_sigterm_stops_a_gateway_still_waiting_for_its_cluster() -> None:
    proc = _kanal(
        "run",
        env={
            "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
            "GATEWAY_HTTP_PORT": str(free_port()),
            "GATEWAY_BIND_HOST": "127.0.0.1",
        },
    )
    try:
        deadline = time.monotonic() + 20
        seen = ""
        assert proc.stdout is not None
        while "waiting for the upstream cluster" not in seen and time.monotonic() < deadline:
            seen += proc.stdout.readline()
        assert "waiting for the upstream cluster" in seen
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
        assert proc.returncode == 0
        assert "stopping now" in seen + out
    finally:
        if proc.poll() is None:
            proc.kill()
