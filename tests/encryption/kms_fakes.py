"""Local HTTP fakes of the KMS APIs no real server can stand in for here.

Each follows the provider's documented requests and answers, no more:

- :class:`FakeAzure`: Entra ID's token endpoint (``POST /{tenant}/oauth2/v2.0/token``, client
  credentials or password grant, form-encoded, answering ``access_token``/``expires_in``) and Key
  Vault's ``POST /keys/{name}[/{version}]/wrapkey|unwrapkey?api-version=7.4`` (``{"alg":
  "RSA-OAEP-256", "value": base64url}`` -> ``{"kid", "value"}``; errors ``{"error": {"code",
  "message"}}``, 404 ``KeyNotFound``, 401 for a missing or unknown bearer token). Keys are real RSA
  keys and wrapping is real RSA-OAEP-256.
- :class:`FakeGcp`: a service account token endpoint (OAuth2 JWT bearer grant: the RS256 assertion
  is verified with the account's public key) and Cloud KMS ``POST /v1/{name}:encrypt|decrypt``
  (``{"plaintext"}`` -> ``{"name", "ciphertext"}``, ``{"ciphertext"}`` -> ``{"plaintext"}``; errors
  ``{"error": {"code", "message", "status"}}``).
- :class:`FakeVaultTransform`: Vault's Transform engine API (``POST /v1/<mount>/encode/<role>`` and
  ``/decode/<role>`` with ``value`` or ``batch_input``, answering ``encoded_value`` /
  ``decoded_value`` or ``batch_results``), tokenizing with random tokens. OpenBao has no Transform
  engine, so this fake is the only server these tests can use.

The fakes run a real HTTP server on 127.0.0.1 in a thread, so the clients' whole HTTP path is used.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jwt
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

Answer = tuple[int, Any]


class FakeServer:
    """A threaded HTTP server calling ``handle``; ``url`` is its base URL."""

    def __init__(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fake.requests.append((self.command, self.path, dict(self.headers)))
                status, answer = fake.handle(self.command, self.path, dict(self.headers), body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _serve

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        raise NotImplementedError

    @contextmanager
    def running(self) -> Iterator[Any]:
        self._thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _from_b64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _bearer(headers: dict[str, str]) -> str | None:
    value = headers.get("Authorization") or headers.get("authorization") or ""
    return value[len("Bearer ") :] if value.startswith("Bearer ") else None


class FakeAzure(FakeServer):
    """Entra ID (token endpoint) and one Key Vault, at the same address."""

    def __init__(self, tenant: str = "tenant-1", client_id: str = "client-1") -> None:
        super().__init__()
        self.tenant, self.client_id = tenant, client_id
        self.client_secret = secrets.token_urlsafe(16)
        self.username, self.password = "operator@example.com", secrets.token_urlsafe(12)
        self.tokens: set[str] = set()
        self.keys: dict[str, dict[str, rsa.RSAPrivateKey]] = {}  # name -> version -> key
        self.current: dict[str, str] = {}

    def create_key(self, name: str) -> str:
        """A new version of key ``name`` (the current one from now on); returns the version."""
        version = secrets.token_hex(16)
        self.keys.setdefault(name, {})[version] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.current[name] = version
        return version

    def delete_key(self, name: str) -> None:
        self.keys.pop(name, None)
        self.current.pop(name, None)

    def revoke_tokens(self) -> None:
        self.tokens.clear()

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        url = urlsplit(path)
        if url.path == f"/{self.tenant}/oauth2/v2.0/token" and method == "POST":
            return self._token(parse_qs(body.decode()))
        if not url.path.startswith("/keys/"):
            return 404, {"error": {"code": "NotFound", "message": "no such path"}}
        if parse_qs(url.query).get("api-version") != ["7.4"]:
            return 400, {"error": {"code": "BadParameter", "message": "api-version missing"}}
        if _bearer(headers) not in self.tokens:
            return 401, {"error": {"code": "Unauthorized", "message": "AKV10000: Request is missing a Bearer token."}}
        parts = url.path.split("/")[2:]  # name, [version], op
        name, op = parts[0], parts[-1]
        version = parts[1] if len(parts) == 3 else self.current.get(name)
        key = self.keys.get(name, {}).get(version or "")
        if key is None:
            return 404, {"error": {"code": "KeyNotFound", "message": f"A key with (name/id) {name} was not found."}}
        request = json.loads(body)
        if request.get("alg") != "RSA-OAEP-256":
            return 400, {"error": {"code": "BadParameter", "message": "unsupported alg"}}
        oaep = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
        value = _from_b64url(request["value"])
        if op == "wrapkey":
            out = key.public_key().encrypt(value, oaep)
        elif op == "unwrapkey":
            try:
                out = key.decrypt(value, oaep)
            except ValueError:
                return 400, {"error": {"code": "BadParameter", "message": "Unwrap failed"}}
        else:
            return 404, {"error": {"code": "NotFound", "message": "no such operation"}}
        return 200, {"kid": f"{self.url}/keys/{name}/{version}", "value": _b64url(out)}

    def _token(self, form: dict[str, list[str]]) -> Answer:
        def one(key: str) -> str:
            return (form.get(key) or [""])[0]

        if one("scope") != "https://vault.azure.net/.default" or one("client_id") != self.client_id:
            return 400, {"error": "invalid_request", "error_description": "AADSTS900144: bad scope or client"}
        grant = one("grant_type")
        ok = (grant == "client_credentials" and one("client_secret") == self.client_secret) or (
            grant == "password" and one("username") == self.username and one("password") == self.password
        )
        if not ok:
            return 401, {
                "error": "invalid_client",
                "error_description": "AADSTS7000215: Invalid client secret provided.",
            }
        token = secrets.token_urlsafe(24)
        self.tokens.add(token)
        return 200, {"token_type": "Bearer", "expires_in": 3599, "access_token": token}


class FakeGcp(FakeServer):
    """A service account token endpoint and Cloud KMS, at the same address."""

    def __init__(self) -> None:
        super().__init__()
        self.account_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.email = "gateway@project.iam.gserviceaccount.com"
        self.tokens: set[str] = set()
        self.keys: dict[str, bytes] = {}  # resource name -> AES key
        self.destroyed: set[str] = set()

    def write_key_file(self, path: Path) -> Path:
        """A service account key file whose token_uri is this fake's."""
        pem = self.account_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        path.write_text(
            json.dumps(
                {
                    "type": "service_account",
                    "project_id": "project",
                    "private_key_id": "kid-1",
                    "private_key": pem.decode(),
                    "client_email": self.email,
                    "token_uri": f"{self.url}/token",
                }
            )
        )
        return path

    def create_key(self, name: str) -> str:
        self.keys[name] = AESGCM.generate_key(bit_length=256)
        return name

    def destroy_key(self, name: str) -> None:
        self.destroyed.add(name)

    def issue_token(self) -> str:
        token = secrets.token_urlsafe(24)
        self.tokens.add(token)
        return token

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        if path == "/token" and method == "POST":
            form = parse_qs(body.decode())
            if form.get("grant_type") != ["urn:ietf:params:oauth:grant-type:jwt-bearer"]:
                return 400, {"error": "unsupported_grant_type", "error_description": "bad grant"}
            try:
                claims = jwt.decode(
                    form["assertion"][0],
                    self.account_key.public_key(),
                    algorithms=["RS256"],
                    audience=f"{self.url}/token",
                )
            except (jwt.PyJWTError, KeyError):
                return 400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
            if claims.get("iss") != self.email or claims.get("scope") != "https://www.googleapis.com/auth/cloudkms":
                return 400, {"error": "invalid_grant", "error_description": "bad claims"}
            return 200, {"access_token": self.issue_token(), "expires_in": 3599, "token_type": "Bearer"}
        if _bearer(headers) not in self.tokens:
            return 401, {
                "error": {
                    "code": 401,
                    "message": "Request had invalid authentication credentials.",
                    "status": "UNAUTHENTICATED",
                }
            }
        if not path.startswith("/v1/") or ":" not in path:
            return 404, {"error": {"code": 404, "message": "not found", "status": "NOT_FOUND"}}
        name, op = path[len("/v1/") :].rsplit(":", 1)
        key = self.keys.get(name)
        if key is None:
            return 404, {"error": {"code": 404, "message": f"{name} not found.", "status": "NOT_FOUND"}}
        if name in self.destroyed:
            message = f"{name}/cryptoKeyVersions/1 is not enabled, current state is: DESTROYED."
            return 400, {"error": {"code": 400, "message": message, "status": "FAILED_PRECONDITION"}}
        request = json.loads(body)
        if op == "encrypt":
            nonce = os.urandom(12)
            ciphertext = nonce + AESGCM(key).encrypt(nonce, base64.b64decode(request["plaintext"]), name.encode())
            return 200, {"name": f"{name}/cryptoKeyVersions/1", "ciphertext": base64.b64encode(ciphertext).decode()}
        if op == "decrypt":
            data = base64.b64decode(request["ciphertext"])
            plaintext = AESGCM(key).decrypt(data[:12], data[12:], name.encode())
            return 200, {"plaintext": base64.b64encode(plaintext).decode()}
        return 404, {"error": {"code": 404, "message": "no such method", "status": "NOT_FOUND"}}


class FakeVaultTransform(FakeServer):
    """A Vault with a Transform engine at ``transform`` whose roles tokenize values."""

    def __init__(self, mount: str = "transform") -> None:
        super().__init__()
        self.mount = mount
        self.token = secrets.token_hex(16)
        self.roles: set[str] = set()
        self.vault: dict[str, str] = {}  # token -> value

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        if headers.get("X-Vault-Token") != self.token:
            return 403, {"errors": ["permission denied"]}
        if path == "/v1/auth/token/lookup-self":
            return 200, {"data": {"policies": ["root"], "ttl": 0}}
        prefix = f"/v1/{self.mount}/"
        if not path.startswith(prefix) or path.count("/") != 4:
            return 404, {"errors": []}
        op, role = path[len(prefix) :].split("/")
        if role not in self.roles:
            return 400, {"errors": [f"role {role!r} does not exist"]}
        request = json.loads(body)
        items = request.get("batch_input")
        if items is None:
            result = self._one(op, request["value"])
            return (200, {"data": result}) if result else (400, {"errors": ["unable to decode"]})
        results = [self._one(op, item["value"]) or {"error": "unable to decode"} for item in items]
        return 200, {"data": {"batch_results": results}}

    def _one(self, op: str, value: str) -> dict[str, str] | None:
        if op == "encode":
            token = base64.b64encode(secrets.token_bytes(18)).decode()
            self.vault[token] = value
            return {"encoded_value": token}
        if value in self.vault:
            return {"decoded_value": self.vault[value]}
        return None
