"""Talking to Vault or OpenBao: settings, auth methods, login tokens and error mapping.

Shared by the transit KMS (:mod:`.vault`) and tokenization (:mod:`.vault_transform`). Auth methods:
a static token, or a login (AppRole, userpass, Kubernetes, JWT) whose client token is renewed near
the end of its lease, and obtained again when renewal fails or a call is refused (403) once: the
token may have been revoked or expired early, and a fresh login is what an operator would do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote

import trio

from kanal_encryption.kms.base import KmsError
from kanal_encryption.kms.http import DEFAULT_TIMEOUT_MS, KmsHttp, json_body, redact, status_error

__all__ = [
    "AUTH_TYPES",
    "KUBERNETES_JWT_PATH",
    "VaultAuth",
    "VaultClient",
    "VaultSettings",
]

AUTH_TYPES: Final = ("TOKEN", "APP_ROLE", "USERNAME_PASSWORD", "KUBERNETES", "JWT")
#: Where Kubernetes mounts a pod's service account token (read at each login: it is rotated).
KUBERNETES_JWT_PATH: Final = "/var/run/secrets/kubernetes.io/serviceaccount/token"
#: Auth mounts when none is given, by auth type.
DEFAULT_AUTH_MOUNTS: Final = {
    "APP_ROLE": "approle",
    "USERNAME_PASSWORD": "userpass",
    "KUBERNETES": "kubernetes",
    "JWT": "jwt",
}
#: Vault's answer (400) when a transit key does not exist.
_KEY_NOT_FOUND: Final = ("encryption key not found", "key not found", "no such key")


@dataclass(frozen=True)
class VaultAuth:
    """How to authenticate; secrets are left out of ``repr`` so they never reach a log line."""

    type: str = "TOKEN"
    token: str | None = field(default=None, repr=False)
    role_id: str | None = None
    secret_id: str | None = field(default=None, repr=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    role: str | None = None
    jwt: str | None = field(default=None, repr=False)
    jwt_path: str | None = None
    #: The auth method's mount (``approle``, ``userpass``, ``kubernetes``, ``jwt`` by default).
    mount: str | None = None

    def auth_mount(self) -> str:
        return (self.mount or DEFAULT_AUTH_MOUNTS.get(self.type, "")).strip("/")

    def secrets(self) -> tuple[str | None, ...]:
        return (self.token, self.secret_id, self.password, self.jwt)


@dataclass(frozen=True)
class VaultSettings:
    """One Vault (or OpenBao) and the engine used there."""

    uri: str
    auth: VaultAuth = VaultAuth()
    #: Mount of the secrets engine: ``transit`` (wrap keys) or ``transform`` (tokenization).
    mount: str = "transit"
    namespace: str | None = None
    timeout_ms: int = DEFAULT_TIMEOUT_MS

    def endpoint(self) -> str:
        return self.uri.rstrip("/")


class VaultClient:
    """Authenticated JSON calls to one Vault: ``await call("POST", "transit/encrypt/k", body, what)``."""

    def __init__(self, settings: VaultSettings) -> None:
        self.settings = settings
        self._http = KmsHttp("Vault", timeout_ms=settings.timeout_ms)
        self._token: str | None = settings.auth.token if settings.auth.type == "TOKEN" else None
        self._renew_at: float | None = None  # monotonic time to renew a login token (None: never)
        self._renewable = False
        self._lock = trio.Lock()

    def _secrets(self) -> tuple[str | None, ...]:
        return (*self.settings.auth.secrets(), self._token)

    def _headers(self, token: str | None) -> dict[str, str]:
        headers = {}
        if token:
            headers["X-Vault-Token"] = token
        if self.settings.namespace:
            headers["X-Vault-Namespace"] = self.settings.namespace
        return headers

    async def _raw(self, method: str, path: str, body: Any, what: str, token: str | None) -> tuple[int, dict[str, Any]]:
        """Status and JSON body (an empty one for 204 or a body-less error)."""
        url = f"{self.settings.endpoint()}/v1/{path}"
        response = await self._http.send(method, url, what, json=body, headers=self._headers(token))
        if response.status_code == 204:
            return 204, {}
        try:
            parsed = response.json()
        except ValueError:
            parsed = {}
        if 200 <= response.status_code < 300:
            return response.status_code, json_body(response, what)
        return response.status_code, parsed if isinstance(parsed, dict) else {}

    def _error(self, status: int, body: dict[str, Any], what: str) -> KmsError:
        errors = body.get("errors")
        detail = "; ".join(str(e) for e in errors) if isinstance(errors, list) else ""
        detail = redact(detail, self._secrets())
        missing = status == 400 and any(m in detail.lower() for m in _KEY_NOT_FOUND)
        return status_error(status, what, detail, key_not_found=missing)

    async def call(self, method: str, path: str, body: Any, what: str) -> dict[str, Any]:
        """The JSON answer of an authenticated call; KmsError otherwise (one fresh login on 403)."""
        token = await self.token()
        status, answer = await self._raw(method, path, body, what, token)
        if status == 403 and self.settings.auth.type != "TOKEN":
            token = await self.token(stale=token)
            status, answer = await self._raw(method, path, body, what, token)
        if 200 <= status < 300:
            return answer
        raise self._error(status, answer, what)

    async def token(self, stale: str | None = None) -> str | None:
        """The client token to send: logs in (again) when there is none, it is ``stale``, or its
        lease nears its end (renewed first when Vault allows)."""
        if self.settings.auth.type == "TOKEN":
            return self._token
        async with self._lock:
            if self._token is not None and self._token != stale:
                if self._renew_at is None or time.monotonic() < self._renew_at:
                    return self._token
                if self._renewable and await self._renew():
                    return self._token
            await self._login()
            return self._token

    async def _renew(self) -> bool:
        status, answer = await self._raw("POST", "auth/token/renew-self", {}, "Vault token renewal", self._token)
        if status != 200 or not isinstance(answer.get("auth"), dict):
            return False
        self._remember(answer["auth"])
        return True

    async def _login(self) -> None:
        auth = self.settings.auth
        mount = quote(auth.auth_mount(), safe="/")
        what = f"Vault login ({auth.type})"
        if auth.type == "APP_ROLE":
            path, body = f"auth/{mount}/login", {"role_id": auth.role_id, "secret_id": auth.secret_id}
        elif auth.type == "USERNAME_PASSWORD":
            path, body = f"auth/{mount}/login/{quote(auth.username or '', safe='')}", {"password": auth.password}
        elif auth.type in ("KUBERNETES", "JWT"):
            path, body = f"auth/{mount}/login", {"role": auth.role, "jwt": await self._jwt(what)}
        else:
            raise KmsError(f"{what}: unknown auth type", retriable=False)
        status, answer = await self._raw("POST", path, body, what, None)
        if status != 200:
            raise self._error(status, answer, what)
        login = answer.get("auth")
        if not isinstance(login, dict) or not isinstance(login.get("client_token"), str):
            raise KmsError(f"{what}: Vault answered without a client token", retriable=False)
        self._remember(login)

    def _remember(self, login: dict[str, Any]) -> None:
        self._token = str(login.get("client_token") or self._token)
        lease = login.get("lease_duration")
        # Renew when two thirds of the lease have passed; a lease of 0 never expires.
        self._renew_at = time.monotonic() + lease * 2 / 3 if isinstance(lease, int) and lease > 0 else None
        self._renewable = bool(login.get("renewable"))

    async def _jwt(self, what: str) -> str:
        auth = self.settings.auth
        if auth.jwt:
            return auth.jwt
        path = auth.jwt_path or KUBERNETES_JWT_PATH
        try:
            return (await trio.Path(path).read_text()).strip()
        except OSError as exc:
            raise KmsError(f"{what}: cannot read the JWT file {path} ({exc.strerror})", retriable=True) from None

    async def check(self) -> None:
        """Logs in (if the auth method does) and looks the token up: reachability and credentials."""
        await self.call("GET", "auth/token/lookup-self", None, "Vault token lookup")

    async def aclose(self) -> None:
        await self._http.aclose()
