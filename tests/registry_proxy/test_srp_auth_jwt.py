"""The jwt provider: static key and JWKS (with rotation), issuer, audience, expiry, principal claim."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from kanal_registry_proxy.settings import load_settings
from kanal_registry_proxy.testing.proxy import ProxyThread

from kanal.api.errors import ConfigError
from registry_proxy.srp_helpers import register

ISSUER = "https://idp.example/realms/kafka"
AUDIENCE = "schema-registry"


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def pem(key: Any) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def token(key: Any, algorithm: str = "RS256", kid: str | None = None, **claims: Any) -> str:
    body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "orders-app", "exp": int(time.time()) + 300, **claims}
    return jwt.encode(
        {k: v for k, v in body.items() if v is not None},
        key,
        algorithm=algorithm,
        headers={"kid": kid} if kid else None,
    )


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


class Jwks:
    """A JWKS document served over HTTP; ``keys`` can change (key rotation)."""

    def __init__(self) -> None:
        self.keys: dict[str, Any] = {}
        self.fetches = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.fetches += 1
                document = {
                    "keys": [
                        {
                            **json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(k.public_key())),
                            "kid": kid,
                            "use": "sig",
                            "alg": "RS256",
                        }
                        for kid, k in outer.keys.items()
                    ]
                }
                payload = json.dumps(document).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/realms/kafka/certs"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def jwks() -> Iterator[Jwks]:
    server = Jwks()
    yield server
    server.close()


def jwt_env(**extra: str) -> dict[str, str]:
    return {"AUTH_PROVIDER": "jwt", "AUTH_JWT_ISSUER": ISSUER, "AUTH_JWT_AUDIENCE": AUDIENCE, **extra}


def test_static_key(make_proxy: Callable[..., ProxyThread]) -> None:
    key = rsa_key()
    proxy = make_proxy(**jwt_env(AUTH_JWT_PUBLIC_KEY=pem(key), AUTHORIZATION_SUPER_USERS="orders-app"))
    assert register(proxy.url, "orders-value").status_code == 401  # basic credentials are not accepted
    ok = httpx.get(f"{proxy.url}/subjects", headers=bearer(token(key)))
    assert ok.status_code == 200
    refused = {
        "expired": token(key, exp=int(time.time()) - 120),
        "issuer": token(key, iss="https://evil.example"),
        "audience": token(key, aud="another-service"),
        "signature": token(rsa_key()),
        "no-exp": token(key, exp=None),
        "no-sub": token(key, sub=None),
        "garbage": "not.a.token",
    }
    for name, value in refused.items():
        response = httpx.get(f"{proxy.url}/subjects", headers=bearer(value))
        assert response.status_code == 401, name
        assert response.headers["www-authenticate"].startswith("Bearer"), name
    hs = jwt.encode(
        {"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "exp": int(time.time()) + 60}, "secret" * 8, algorithm="HS256"
    )
    assert httpx.get(f"{proxy.url}/subjects", headers=bearer(hs)).status_code == 401  # no symmetric algorithms


def test_principal_claim_and_eddsa(make_proxy: Callable[..., ProxyThread]) -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    proxy = make_proxy(
        **jwt_env(
            AUTH_JWT_PUBLIC_KEY=pem(key), AUTH_JWT_PRINCIPAL_CLAIM="client.name", AUTHORIZATION_SUPER_USERS="billing"
        )
    )
    good = token(key, "EdDSA", client={"name": "billing"})
    assert register(proxy.url, "x-value", user="nobody").status_code == 401
    response = httpx.post(
        f"{proxy.url}/subjects/x-value/versions",
        content=json.dumps({"schema": '"int"'}),
        headers={**bearer(good), "Content-Type": "application/vnd.schemaregistry.v1+json"},
    )
    assert response.status_code == 200  # the super user named by the nested claim
    other = token(key, "EdDSA", client={"name": "someone"})
    assert (
        httpx.post(
            f"{proxy.url}/subjects/x-value/versions",
            content=json.dumps({"schema": '"int"'}),
            headers={**bearer(other), "Content-Type": "application/vnd.schemaregistry.v1+json"},
        ).status_code
        == 403
    )  # authenticated, not authorized (read-only mode)


def test_jwks_with_key_rotation(make_proxy: Callable[..., ProxyThread], jwks: Jwks) -> None:
    first, second = rsa_key(), rsa_key()
    jwks.keys = {"k1": first}
    proxy = make_proxy(**jwt_env(AUTH_JWT_JWKS_URL=jwks.url))
    assert httpx.get(f"{proxy.url}/subjects", headers=bearer(token(first, kid="k1"))).status_code == 200
    authenticator: Any = proxy.service.authenticator
    authenticator.min_refresh_gap = 0.0  # the fetch at startup is not 30 s old: allow the refresh now
    jwks.keys = {"k2": second}  # rotated at the identity provider
    assert httpx.get(f"{proxy.url}/subjects", headers=bearer(token(second, kid="k2"))).status_code == 200
    assert jwks.fetches == 2
    # an unknown kid does not refetch again within 30 s
    authenticator.min_refresh_gap = 30.0
    assert httpx.get(f"{proxy.url}/subjects", headers=bearer(token(rsa_key(), kid="k3"))).status_code == 401
    assert jwks.fetches == 2


def test_jwt_settings_are_checked(base_env: dict[str, str]) -> None:
    env = {**base_env, "AUTH_PROVIDER": "jwt"}
    with pytest.raises(ConfigError, match="AUTH_JWT_JWKS_URL"):
        load_settings({**env, "AUTH_JWT_ISSUER": ISSUER, "AUTH_JWT_AUDIENCE": AUDIENCE})
    with pytest.raises(ConfigError, match="AUTH_JWT_ISSUER"):
        load_settings({**env, "AUTH_JWT_JWKS_URL": "http://idp/certs", "AUTH_JWT_AUDIENCE": AUDIENCE})
    with pytest.raises(ConfigError, match="AUTH_JWT_AUDIENCE"):
        load_settings({**env, "AUTH_JWT_JWKS_URL": "http://idp/certs", "AUTH_JWT_ISSUER": ISSUER})
    with pytest.raises(ConfigError, match="AUTH_JWT_ALGORITHMS"):
        load_settings({**env, **jwt_env(AUTH_JWT_JWKS_URL="http://idp/certs", AUTH_JWT_ALGORITHMS="HS256")})
