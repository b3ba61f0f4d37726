"""Real KMS servers for the encryption tests: OpenBao (Vault's API, transit engine) and moto (AWS KMS).

- ``openbao``: one ``bao server -dev`` for the session, with transit enabled, a policy allowing
  transit encrypt/decrypt, AppRole, userpass and JWT auth set up with that policy; an
  :class:`OpenBao` (address, root token, credentials, helpers to make and delete keys).
- ``moto_kms``: one ``moto_server`` for the session; a :class:`MotoKms` (endpoint, region, dummy
  credentials, ``create_key``).
- ``start_openbao``: starts another OpenBao (stopped at the end of the test), for tests that stop it.

Both are polled until they answer; nothing waits a fixed time.
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

BIN = Path(sys.executable).parent
TRANSIT_POLICY = """
path "transit/encrypt/*" { capabilities = ["update"] }
path "transit/decrypt/*" { capabilities = ["update"] }
"""
JWT_ISSUER = "kanal-tests"
JWT_AUDIENCE = "kanal"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _binary(name: str) -> str:
    path = BIN / name
    found = str(path) if path.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed")
    return found


def wait_until_up(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> None:
    """Polls ``url`` until it answers (any status); fails with the log if the process exits."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            pytest.fail(f"{log.name} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            httpx.get(url, timeout=1.0)
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                pytest.fail(f"{url} did not answer within {timeout} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.05)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class OpenBao:
    """A running OpenBao dev server and the credentials set up in it."""

    address: str
    root_token: str
    process: subprocess.Popen[bytes]
    approle_role_id: str = ""
    approle_secret_id: str = field(default="", repr=False)
    username: str = "kanal"
    password: str = field(default="", repr=False)
    jwt_key: rsa.RSAPrivateKey | None = field(default=None, repr=False)

    def stop(self) -> None:
        """Stops the server (tests of an unreachable KMS)."""
        stop(self.process)

    def api(self, method: str, path: str, body: Any = None, token: str | None = None) -> dict[str, Any]:
        """A call to ``/v1/<path>`` (root token by default); fails the test on an error status."""
        headers = {"X-Vault-Token": token or self.root_token}
        response = httpx.request(method, f"{self.address}/v1/{path}", json=body, headers=headers, timeout=10)
        if response.status_code >= 400:
            pytest.fail(f"{method} {path}: {response.status_code} {response.text}")
        return response.json() if response.content else {}

    def create_transit_key(self, name: str | None = None, mount: str = "transit") -> str:
        """A new transit key (a unique name when none is given)."""
        name = name or f"key-{uuid.uuid4().hex[:12]}"
        self.api("POST", f"{mount}/keys/{name}")
        return name

    def delete_transit_key(self, name: str, mount: str = "transit") -> None:
        """Deletes a transit key (allowing its deletion first, as transit requires)."""
        self.api("POST", f"{mount}/keys/{name}/config", {"deletion_allowed": True})
        self.api("DELETE", f"{mount}/keys/{name}")

    def make_jwt(self, subject: str = "gateway", role_audience: str = JWT_AUDIENCE, ttl: int = 300) -> str:
        """A JWT the ``jwt`` auth mount accepts (signed with the key it was configured with)."""
        assert self.jwt_key is not None
        now = int(time.time())
        claims = {"iss": JWT_ISSUER, "sub": subject, "aud": role_audience, "iat": now, "exp": now + ttl}
        return jwt.encode(claims, self.jwt_key, algorithm="RS256")

    def setup(self) -> None:
        """Transit, a policy for it, and AppRole, userpass and JWT auth granting that policy."""
        self.api("POST", "sys/mounts/transit", {"type": "transit"})
        self.api("POST", "sys/policies/acl/kanal-transit", {"policy": TRANSIT_POLICY})
        self.api("POST", "sys/auth/approle", {"type": "approle"})
        self.api("POST", "auth/approle/role/kanal", {"token_policies": ["kanal-transit"], "token_ttl": "1h"})
        self.approle_role_id = self.api("GET", "auth/approle/role/kanal/role-id")["data"]["role_id"]
        self.approle_secret_id = self.api("POST", "auth/approle/role/kanal/secret-id")["data"]["secret_id"]
        self.api("POST", "sys/auth/userpass", {"type": "userpass"})
        self.password = secrets.token_urlsafe(16)
        self.api(
            "POST",
            f"auth/userpass/users/{self.username}",
            {"password": self.password, "token_policies": ["kanal-transit"]},
        )
        self.jwt_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = self.jwt_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.api("POST", "sys/auth/jwt", {"type": "jwt"})
        self.api("POST", "auth/jwt/config", {"jwt_validation_pubkeys": [public.decode()], "bound_issuer": JWT_ISSUER})
        self.api(
            "POST",
            "auth/jwt/role/kanal",
            {
                "role_type": "jwt",
                "user_claim": "sub",
                "bound_audiences": [JWT_AUDIENCE],
                "token_policies": ["kanal-transit"],
                "token_ttl": "1h",
            },
        )


def _start_openbao(log: Path, port: int | None = None, token: str | None = None) -> OpenBao:
    port = port or free_port()
    token = token or secrets.token_hex(16)
    process = subprocess.Popen(
        [
            _binary("bao"),
            "server",
            "-dev",
            f"-dev-root-token-id={token}",
            f"-dev-listen-address=127.0.0.1:{port}",
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    address = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{address}/v1/sys/health", process, log)
        bao = OpenBao(address=address, root_token=token, process=process)
        bao.setup()
    except BaseException:
        stop(process)
        raise
    return bao


@pytest.fixture(scope="session")
def openbao(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenBao]:
    """An OpenBao dev server for the session (see :class:`OpenBao`)."""
    bao = _start_openbao(tmp_path_factory.mktemp("openbao") / "bao.log")
    try:
        yield bao
    finally:
        stop(bao.process)


@pytest.fixture
def start_openbao(tmp_path: Path) -> Iterator[Callable[..., OpenBao]]:
    """Starts OpenBao dev servers of the test's own (stopped at its end, if the test did not);
    ``start(port=..., token=...)`` brings one back where a stopped one was (its keys are gone:
    a dev server keeps nothing)."""
    started: list[OpenBao] = []

    def start(port: int | None = None, token: str | None = None) -> OpenBao:
        bao = _start_openbao(tmp_path / f"bao-{len(started)}.log", port, token)
        started.append(bao)
        return bao

    yield start
    for bao in started:
        stop(bao.process)


@dataclass
class MotoKms:
    """A running moto server: AWS KMS at ``endpoint`` with dummy credentials."""

    endpoint: str
    process: subprocess.Popen[bytes]
    region: str = "us-east-1"
    access_key: str = "testing"
    secret_key: str = field(default="testing-secret", repr=False)

    def client(self) -> Any:
        """botocore's own KMS client, to set up keys."""
        import botocore.session

        return botocore.session.Session().create_client(
            "kms",
            region_name=self.region,
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def create_key(self, alias: str | None = None) -> tuple[str, str]:
        """A new symmetric key: (key id, key ARN); ``alias`` (``alias/...``) is given to it."""
        client = self.client()
        meta = client.create_key(Description="kanal tests")["KeyMetadata"]
        if alias:
            client.create_alias(AliasName=alias, TargetKeyId=meta["KeyId"])
        return meta["KeyId"], meta["Arn"]


@pytest.fixture(scope="session")
def moto_kms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoKms]:
    """A moto server for the session (see :class:`MotoKms`)."""
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    port = free_port()
    process = subprocess.Popen(
        [_binary("moto_server"), "-H", "127.0.0.1", "-p", str(port)], stdout=log.open("wb"), stderr=subprocess.STDOUT
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{endpoint}/moto-api/", process, log)
        yield MotoKms(endpoint=endpoint, process=process)
    finally:
        stop(process)
