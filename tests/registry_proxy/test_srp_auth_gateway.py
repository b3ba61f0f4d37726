"""``AUTH_PROVIDER=gateway``: the registry proxy hosted by a gateway whose Kafka listener authenticates
with gateway tokens; one service account and one token work for both, and losing the account stops both."""

from __future__ import annotations

import base64
import os
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from confluent_kafka import KafkaError, Producer
from kanal_registry_proxy.auth_gateway import GatewayTokenAuthenticator
from kanal_registry_proxy.metrics import ProxyMetrics
from kanal_registry_proxy.settings import load_settings
from kanal_registry_proxy.testing import TestRegistry

from kanal.api import ConfigError, Principal
from kanal.embedded import GatewayProcess, free_port
from kanal.embedded.admin_http import AdminHttp
from kanal.testing import FakeIdentities
from registry_proxy.srp_helpers import basic

ACCOUNT = {
    "apiVersion": "gateway/v2",
    "kind": "GatewayServiceAccount",
    "metadata": {"name": "orders-app"},
    "spec": {"type": "LOCAL"},
}


def authenticate(identities: FakeIdentities, header: str | None) -> str | None:
    authenticator = GatewayTokenAuthenticator(identities, ProxyMetrics(None))
    return trio.run(authenticator.authenticate, header)


def test_the_gateway_provider_answers_with_the_account_name() -> None:
    identities = FakeIdentities({("orders-app", "t0ken"): Principal("orders-app", vcluster="tenant-a")})
    assert authenticate(identities, basic("orders-app", "t0ken")["Authorization"]) == "orders-app"
    assert authenticate(identities, basic("orders-app", "other")["Authorization"]) is None
    assert authenticate(identities, basic("orders-app", "tökén")["Authorization"]) is None  # never a token
    assert authenticate(identities, "Bearer t0ken") is None
    assert authenticate(identities, None) is None


def test_the_gateway_provider_needs_the_gateway(base_env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="AUTH_PROVIDER: gateway checks gateway tokens"):
        load_settings({**base_env, "AUTH_PROVIDER": "gateway"})
    assert load_settings({**base_env, "AUTH_PROVIDER": "gateway"}, hosted=True).auth_provider == "gateway"


def produce(port: str, username: str, token: str) -> Any:
    """The delivery outcome of one record produced with SASL PLAIN (None: delivered)."""
    errors: list[Any] = []
    outcome: list[Any] = []
    producer = Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": username,
            "sasl.password": token,
            "message.timeout.ms": 10000,
            "error_cb": errors.append,
        }
    )
    producer.produce("registry-users", b"v", partition=0, on_delivery=lambda err, msg: outcome.append(err))
    refused: list[Any] = []
    while not outcome and not refused:
        producer.poll(0.1)
        refused = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    return outcome[0] if outcome else refused[0]  # (other errors, such as all brokers down, follow it)


@pytest.mark.integration
def test_one_token_for_kafka_and_the_registry(
    tansu: Any, base_env: dict[str, str], upstream: TestRegistry, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **tansu.gateway_settings(),
        **base_env,
        "AUTH_PROVIDER": "gateway",
        "SRP_ENABLED": "true",
        "SRP_HTTP_PORT": str(port),
        "SRP_BIND_HOST": "127.0.0.1",
        "GATEWAY_CLUSTER_ID": f"srp-{uuid.uuid4().hex[:8]}",
        "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(os.urandom(32)).decode(),
        "GATEWAY_ADMIN_API_USERS": "[{username: admin, password: secret, admin: true}]",
    }
    with GatewayProcess(env, log_path=tmp_path / "gateway.log") as gateway:
        admin = AdminHttp(env["GATEWAY_HTTP_PORT"])
        assert admin.put("/gateway/v2/service-account", ACCOUNT)[0] == 200
        status, answer = admin.call("POST", "/gateway/v2/token", {"username": "orders-app", "lifeTimeSeconds": 600})
        assert status == 200
        token = answer["token"]
        url = f"http://127.0.0.1:{port}"

        assert httpx.get(f"{url}/subjects", headers=basic("orders-app", token)).status_code == 200
        assert produce(env["GATEWAY_PORT_START"], "orders-app", token) is None
        refused = httpx.get(f"{url}/subjects", headers=basic("orders-app", token[:-2] + "xx"))
        assert refused.status_code == 401 and refused.headers["WWW-Authenticate"].startswith("Basic")
        assert httpx.get(f"{url}/subjects", headers=basic("someone-else", token)).status_code == 401

        assert admin.call("DELETE", "/gateway/v2/service-account/orders-app")[0] == 204
        assert httpx.get(f"{url}/subjects", headers=basic("orders-app", token)).status_code == 401
        assert produce(env["GATEWAY_PORT_START"], "orders-app", token).code() == KafkaError._AUTHENTICATION
        assert token not in gateway.output
