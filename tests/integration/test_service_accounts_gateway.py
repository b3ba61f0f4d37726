"""Service accounts and gateway tokens through a real gateway process in front of a real Tansu broker:
``kanal apply`` of GatewayServiceAccount manifests, then ``POST /gateway/v2/token`` over HTTP, the
token checked with the secret the gateway was given; and a bad GATEWAY_USER_POOL_SECRET_KEY stopping
the gateway at startup.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kanal.cli import main as kanal_main
from kanal.embedded import EmbeddedProcessError, GatewayProcess, TansuBroker
from kanal.embedded.admin_http import AdminHttp as Http
from kanal.identity.tokens import TokenClaims, verify

pytestmark = pytest.mark.integration

USERS = "[{username: admin, password: secret, admin: true}]"
MANIFESTS = """\
apiVersion: gateway/v2
kind: GatewayServiceAccount
metadata: {name: orders-app, vCluster: tenant-a}
spec: {type: LOCAL}
---
apiVersion: gateway/v2
kind: GatewayServiceAccount
metadata: {name: partner}
spec: {type: EXTERNAL, externalNames: [0oa1b2c3d4]}
"""


@pytest.fixture(scope="module")
def secret() -> bytes:
    return os.urandom(32)


@pytest.fixture(scope="module")
def node(
    tansu: TansuBroker, secret: bytes, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, Http]]:
    env = {
        **tansu.gateway_settings(),
        "GATEWAY_ADMIN_API_USERS": USERS,
        "GATEWAY_CLUSTER_ID": f"accounts-{uuid.uuid4().hex[:8]}",
        "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(secret).decode(),
    }
    process = GatewayProcess(env, log_path=tmp_path_factory.mktemp("accounts") / "gateway.log").start(timeout=30)
    try:
        yield process, Http(env["GATEWAY_HTTP_PORT"])
    finally:
        code = process.stop(timeout=15)
        assert code == 0, f"gateway exited with {code}:\n{process.tail()}"


def test_apply_accounts_then_mint_a_token(node: tuple[GatewayProcess, Http], secret: bytes, tmp_path: Path) -> None:
    gateway, http = node
    (tmp_path / "accounts.yaml").write_text(MANIFESTS)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = kanal_main(
            [
                "apply",
                "-f",
                str(tmp_path / "accounts.yaml"),
                "--url",
                http.base,
                "--user",
                "admin",
                "--password",
                "secret",
            ]
        )
    assert code == 0, err.getvalue()
    assert "GatewayServiceAccount/orders-app (vCluster=tenant-a): CREATED [Ready]" in out.getvalue()
    assert "GatewayServiceAccount/partner: CREATED [Ready]" in out.getvalue()

    status, answer = http.call(
        "POST", "/gateway/v2/token", {"username": "orders-app", "vCluster": "tenant-a", "lifeTimeSeconds": 600}
    )
    assert status == 200
    claims = verify(answer["token"], secret)
    assert isinstance(claims, TokenClaims) and (claims.username, claims.vcluster) == ("orders-app", "tenant-a")

    status, error = http.call("POST", "/gateway/v2/token", {"username": "partner", "lifeTimeSeconds": 600})
    assert status == 409 and "EXTERNAL" in error["msg"]
    status, error = http.call("POST", "/gateway/v2/token", {"username": "orders-app", "vCluster": "tenant-a"})
    assert status == 400 and "lifeTimeSeconds" in error["msg"]
    assert http.call("POST", "/gateway/v2/token", {"username": "ghost", "lifeTimeSeconds": 600})[0] == 404

    assert answer["token"] not in gateway.output
    assert base64.b64encode(secret).decode() not in gateway.output
    assert "MINT_TOKEN" in gateway.output  # the audit line


def test_a_bad_secret_key_stops_the_gateway_naming_the_variable(tansu: TansuBroker, tmp_path: Path) -> None:
    short = base64.b64encode(b"sixteen byte key").decode()
    env = {**tansu.gateway_settings(), "GATEWAY_USER_POOL_SECRET_KEY": short}
    with pytest.raises(EmbeddedProcessError) as failure:
        GatewayProcess(env, log_path=tmp_path / "gateway.log").start(timeout=30)
    output = failure.value.output
    assert failure.value.returncode == 2
    assert "GATEWAY_USER_POOL_SECRET_KEY" in output and "32" in output
    assert short not in output
