"""``kanal registry-proxy`` refusing to start, ``kanal license ...``, and ``kanal run`` hosting the proxy."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from kanal_registry_proxy import plugin
from kanal_registry_proxy.license import issue, verify
from kanal_registry_proxy.reactive import application_instance
from kanal_registry_proxy.testing import TestRegistry

from kanal.api import ConfigError
from kanal.cli import main
from kanal.embedded import GatewayProcess, free_port
from kanal.pipeline.registry import PluginRegistry
from kanal.testing import FakeServices
from registry_proxy.srp_helpers import basic, register


def run_cli(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], *args: str) -> int:
    for key in list(env):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SRP_LOG_FORMAT", "text")
    return main(list(args))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"VENDOR_LICENSE": ""}, "VENDOR_LICENSE: required"),
        ({"VENDOR_LICENSE": "kanal1.e30.AAAA"}, "VENDOR_LICENSE: the license signature is invalid"),
        ({"AUTH_PROVIDER": ""}, "AUTH_PROVIDER: required"),
        ({"BASIC_AUTH_LOCATION": "/nonexistent/basic-auth.json"}, "BASIC_AUTH_LOCATION: cannot read"),
    ],
    ids=["missing-license", "invalid-license", "unset-auth-provider", "missing-credentials"],
)
def test_registry_proxy_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    base_env: dict[str, str],
    change: dict[str, str],
    message: str,
) -> None:
    assert run_cli(monkeypatch, {**base_env, **change}, "registry-proxy") == 2
    assert message in capsys.readouterr().err


def test_registry_proxy_refuses_an_expired_license(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    base_env: dict[str, str],
    license_keys: tuple[str, str, str],
) -> None:
    expired = issue(license_keys[2].encode(), "acme", int(time.time()) - 1)
    assert run_cli(monkeypatch, {**base_env, "VENDOR_LICENSE": expired}, "registry-proxy") == 2
    assert "the license expired" in capsys.readouterr().err


def test_license_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    private, public = tmp_path / "private.pem", tmp_path / "public.pem"
    assert main(["license", "keygen", "--private-key", str(private), "--public-key", str(public)]) == 0
    assert private.stat().st_mode & 0o077 == 0  # the private key is readable by its owner only
    assert main(["license", "keygen", "--private-key", str(private), "--public-key", str(public)]) == 2  # no overwrite
    capsys.readouterr()
    assert (
        main(["license", "issue", "--private-key", str(private), "--licensee", "ACME", "--expires", "2099-12-31"]) == 0
    )
    token = capsys.readouterr().out.strip()
    found = verify(token, public.read_bytes())
    assert found.licensee == "ACME" and found.expires_at is not None and found.plan == "gateway"
    assert main(["license", "verify", token, "--public-key", str(public)]) == 0
    assert "valid: gateway license for 'ACME'" in capsys.readouterr().out
    assert main(["license", "issue", "--private-key", str(private), "--expires", "2000-01-01"]) == 0
    old = capsys.readouterr().out.strip()
    assert main(["license", "verify", old, "--public-key", str(public)]) == 1
    assert main(["license", "issue", "--private-key", str(private), "--expires", "someday"]) == 2


def test_hash_password(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import io

    import bcrypt

    monkeypatch.setattr("sys.stdin", io.StringIO("s3cret\n"))
    assert main(["registry-proxy", "hash-password", "--rounds", "4", "--password-stdin"]) == 0
    assert bcrypt.checkpw(b"s3cret", capsys.readouterr().out.strip().encode())


# -- kanal run hosting the proxy -------------------------------------------------------------------------


def test_the_plugin_adds_a_gateway_service_only_when_enabled(
    monkeypatch: pytest.MonkeyPatch, base_env: dict[str, str]
) -> None:
    registry = PluginRegistry()
    registry.register(plugin, "registry-proxy")
    port = free_port()
    env = {**base_env, "SRP_HTTP_PORT": str(port), "SRP_BIND_HOST": "127.0.0.1"}
    for key in env:  # the plugin reads the gateway's settings, not the process environment
        monkeypatch.delenv(key, raising=False)
    assert registry.manager.hook.kanal_gateway_services(services=FakeServices(settings=env)) == [[]]
    services = FakeServices(settings={**env, "SRP_ENABLED": "true"})
    [found] = registry.manager.hook.kanal_gateway_services(services=services)
    assert len(found) == 1

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(found[0])
            async with httpx.AsyncClient() as client:  # type: ignore[attr-defined]
                response = await client.get(f"http://127.0.0.1:{port}/subjects", headers=basic("alice"))
            assert response.status_code == 200
            nursery.cancel_scope.cancel()

    trio.run(run)
    # the proxy's metrics live in the gateway's registry
    assert (
        services.metrics.get_sample_value(
            "srp_http_requests_total", {"route": "/subjects", "method": "GET", "status": "200"}
        )
        == 1.0
    )
    with pytest.raises(ConfigError, match="AUTH_PROVIDER"):  # kanal run then stops with a configuration error
        registry.manager.hook.kanal_gateway_services(
            services=FakeServices(settings={**env, "SRP_ENABLED": "true", "AUTH_PROVIDER": ""})
        )


def test_the_hosted_proxy_keeps_its_permissions_in_the_gateways_state_logs(base_env: dict[str, str]) -> None:
    registry = PluginRegistry()
    registry.register(plugin, "registry-proxy")
    port = free_port()
    env = {
        **base_env,
        "SRP_ENABLED": "true",
        "SRP_HTTP_PORT": str(port),
        "SRP_BIND_HOST": "127.0.0.1",
        "AUTHORIZATION_MODE": "reactive",
        "SRP_COMMANDS_TOPIC": "_cmds",
        "SRP_INSTANCE_ID": "proxy-1",
    }
    services = FakeServices(settings=env)  # no KAFKA_BOOTSTRAP_SERVERS: the gateway's own cluster
    [found] = registry.manager.hook.kanal_gateway_services(services=services)
    assert sorted(services.logs) == ["_cmds", "_vendor_srp_events"]
    url = f"http://127.0.0.1:{port}/subjects/orders-value/versions"

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(found[0])
            async with httpx.AsyncClient() as client:  # type: ignore[attr-defined]
                assert (await client.get(url, headers=basic("alice"))).status_code == 403
                commands = services.logs["_cmds"]
                await commands.append(*application_instance("orders", "alice", [("LITERAL", "orders-value", ["Read"])]))
                with trio.fail_after(10):  # applied without a restart
                    while (await client.get(url, headers=basic("alice"))).status_code != 404:
                        await trio.sleep(0.05)
            nursery.cancel_scope.cancel()

    trio.run(run)
    events = {record.key: record.value for record in services.logs["_vendor_srp_events"].records}
    assert b"command/schema-registry-proxy/proxy-1/ApplicationInstance/orders" in events
    assert b'"type":"Stopped"' in (events[b"heartbeat/schema-registry-proxy/proxy-1"] or b"")


def test_permission_commands_need_a_cluster(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    assert main(["registry-proxy", "permissions", "delete", "orders"]) == 2
    assert "KAFKA_BOOTSTRAP_SERVERS" in capsys.readouterr().err


@pytest.mark.integration
def test_kanal_run_hosts_the_proxy(
    tansu: Any, base_env: dict[str, str], upstream: TestRegistry, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **tansu.gateway_settings(),
        **base_env,
        "SRP_ENABLED": "true",
        "SRP_HTTP_PORT": str(port),
        "SRP_BIND_HOST": "127.0.0.1",
    }
    env["AUTHORIZATION_MODE"] = "reactive"  # reaches Kafka through the gateway's own KAFKA_* settings
    env["SRP_COMMANDS_TOPIC"] = f"_srp_cmd_{port}"
    env["SRP_EVENTS_TOPIC"] = f"_srp_evt_{port}"
    with GatewayProcess(env, log_path=tmp_path / "gateway.log"):
        url = f"http://127.0.0.1:{port}"
        assert register(url, "orders-value", user="root").status_code == 200  # super user
        assert register(url, "orders-value", user="alice").status_code == 403  # no permissions yet
        assert httpx.get(f"{url}/subjects", headers=basic("alice")).json() == []
        admin_metrics = httpx.get(f"http://127.0.0.1:{env['GATEWAY_HTTP_PORT']}/metrics").text
        assert 'srp_http_requests_total{method="GET",route="/subjects",status="200"}' in admin_metrics
        assert json.loads(httpx.get(f"{url}/schemas/ids/1", headers=basic("root")).text)["schema"]


def test_kanal_registry_proxy_serves_then_stops_on_sigterm(base_env: dict[str, str], upstream: TestRegistry) -> None:
    import os
    import signal
    import subprocess
    import sys

    port = free_port()
    env = {
        **os.environ,
        **base_env,
        "SRP_HTTP_PORT": str(port),
        "SRP_BIND_HOST": "127.0.0.1",
        "SRP_ACCESS_LOG": "true",
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "kanal", "registry-proxy"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        ready = process.stdout.readline()
        assert "schema registry proxy ready on http://127.0.0.1:" in ready, (
            process.stderr.read() if process.stderr else ""
        )
        assert httpx.get(f"http://127.0.0.1:{port}/subjects", headers=basic("alice")).json() == []
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
        assert process.stderr is not None
        lines = [json.loads(line) for line in process.stderr.read().splitlines() if line.startswith("{")]
        assert any(line.get("logger") == "kanal_registry_proxy.access" and line.get("status") == 200 for line in lines)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
