"""``kanal run`` as an operator meets a KMS connection that cannot work: the gateway does not start,
and says which variable and why (spec 03's startup errors)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kanal.embedded import free_port
from kanal.embedded.gateway_process import gateway_env

EC = "GATEWAY_EXTERNAL_CONNECTION_"
VAULT = {f"{EC}V_TYPE": "VAULT", f"{EC}V_CONFIG_URI": "http://127.0.0.1:1", f"{EC}V_CONFIG_TOKEN": "t"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({**VAULT, f"{EC}V_CONFIG_ENGINE": "TRANSIT"}, f"{EC}V_CONFIG_ENGINE"),
        ({**VAULT, f"{EC}V_CONFIG_MOUNT": "transit"}, f"{EC}V_CONFIG_MOUNT"),
        ({**VAULT, f"{EC}V_CONFIG_TOKN": "t"}, f"{EC}V_CONFIG_TOKN"),
        ({f"{EC}V_TYPE": "VAULT", f"{EC}V_CONFIG_TOKEN": "t"}, f"{EC}V_CONFIG_URI"),
        ({**VAULT, f"{EC}V_CONFIG_AUTH_TYPE": "LDAPS"}, f"{EC}V_CONFIG_AUTH_TYPE"),
        ({**VAULT, f"{EC}V_CONFIG_TOKEN": "${KANAL_TEST_NO_SUCH_VARIABLE}"}, "KANAL_TEST_NO_SUCH_VARIABLE"),
    ],
    ids=["old ENGINE", "old MOUNT", "unknown property", "no URI", "bad AUTH_TYPE", "unset placeholder"],
)
def test_a_kms_connection_that_cannot_work_stops_the_gateway_naming_the_variable(
    env: dict[str, str], message: str
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kanal", "run"],
        env=gateway_env({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "GATEWAY_HTTP_PORT": str(free_port()), **env}),
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stdout + proc.stderr


def test_a_renamed_variable_names_its_replacement() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kanal", "run"],
        env=gateway_env({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", **VAULT, f"{EC}V_CONFIG_ENGINE": "TRANSIT"}),
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "ENGINE_TYPE" in proc.stdout + proc.stderr
