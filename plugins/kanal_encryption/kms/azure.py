"""Azure Key Vault: RSA-OAEP-256 wrap and unwrap with a vault key, OAuth2 tokens from Entra ID.

wrap = ``POST {vault}/keys/{name}/{version}/wrapkey?api-version=7.4`` with ``{"alg":
"RSA-OAEP-256", "value": <base64url DEK>}``; unwrap = ``.../unwrapkey``. A key id is ``name`` or
``name/version``; without a version the vault wraps with the current one, and the version it used
(from the answer's ``kid``) is kept in the EDEK, so EDEKs stay readable after the key is rotated.
EDEK: one byte (length of the version), the version (ASCII), the wrapped key.

Tokens: client credentials (or username and password) against
``{authority}/{tenant}/oauth2/v2.0/token`` with scope ``https://vault.azure.net/.default``; kept
until a minute before they expire, and requested again once if the vault answers 401.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote

import trio

from kanal_encryption.kms.base import KmsError
from kanal_encryption.kms.codec import b64url, from_b64url
from kanal_encryption.kms.http import DEFAULT_TIMEOUT_MS, KmsHttp, json_body, oauth_token, redact, status_error

__all__ = ["API_VERSION", "AzureKeyVaultKms", "AzureSettings"]

API_VERSION: Final = "7.4"
DEFAULT_AUTHORITY: Final = "https://login.microsoftonline.com"
SCOPE: Final = "https://vault.azure.net/.default"
ALGORITHM: Final = "RSA-OAEP-256"


@dataclass(frozen=True)
class AzureSettings:
    """A vault, and an app registration's credentials (a client secret, or a username and password)."""

    vault_url: str
    tenant_id: str
    client_id: str
    client_secret: str | None = field(default=None, repr=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    authority_host: str = DEFAULT_AUTHORITY
    timeout_ms: int = DEFAULT_TIMEOUT_MS


class AzureKeyVaultKms:
    """The :class:`~kanal_encryption.kms.base.Kms` of Azure Key Vault keys."""

    kind = "azure-kms"

    def __init__(self, settings: AzureSettings) -> None:
        self.settings = settings
        self._http = KmsHttp("Azure Key Vault", timeout_ms=settings.timeout_ms)
        self._token: str | None = None
        self._expires = 0.0
        self._lock = trio.Lock()

    def _secrets(self) -> tuple[str | None, ...]:
        return (self.settings.client_secret, self.settings.password, self._token)

    async def token(self, stale: str | None = None) -> str:
        async with self._lock:
            if self._token is not None and self._token != stale and time.monotonic() < self._expires:
                return self._token
            s = self.settings
            form = {"client_id": s.client_id, "scope": SCOPE}
            if s.client_secret:
                form |= {"grant_type": "client_credentials", "client_secret": s.client_secret}
            else:
                form |= {"grant_type": "password", "username": s.username or "", "password": s.password or ""}
            url = f"{s.authority_host.rstrip('/')}/{quote(s.tenant_id, safe='')}/oauth2/v2.0/token"
            what = "Azure token request"
            response = await self._http.send("POST", url, what, data=form)
            if response.status_code != 200:
                raise self._error(response.status_code, response, what)
            token, self._expires = oauth_token(response, what, 300)
            self._token = token
            return token

    def _error(self, status: int, response: Any, what: str) -> KmsError:
        try:
            body = response.json()
        except ValueError:
            body = {}
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):  # Key Vault: {"error": {"code", "message"}}
            code, detail = str(error.get("code") or ""), f"{error.get('code')}: {error.get('message')}"
        else:  # Entra ID: {"error": "invalid_client", "error_description": ...}
            code = str(error or "")
            description = str(body.get("error_description") or "") if isinstance(body, dict) else ""
            detail = f"{code}: {description}" if code and description else code or description
        detail = redact(detail, self._secrets())
        return status_error(status, what, detail, key_not_found=code in ("KeyNotFound", "NotFound"))

    def _key_url(self, name: str, version: str | None, op: str) -> str:
        path = quote(name, safe="") + (f"/{quote(version, safe='')}" if version else "")
        return f"{self.settings.vault_url.rstrip('/')}/keys/{path}/{op}?api-version={API_VERSION}"

    async def _call(self, url: str, body: dict[str, str], what: str) -> dict[str, Any]:
        token = await self.token()
        response = await self._http.send("POST", url, what, json=body, headers={"Authorization": f"Bearer {token}"})
        if response.status_code == 401:
            token = await self.token(stale=token)
            response = await self._http.send("POST", url, what, json=body, headers={"Authorization": f"Bearer {token}"})
        if response.status_code != 200:
            raise self._error(response.status_code, response, what)
        return json_body(response, what)

    @staticmethod
    def _split(key_id: str) -> tuple[str, str | None]:
        name, _, version = key_id.strip("/").partition("/")
        return name, version or None

    async def wrap(self, key_id: str, dek: bytes) -> bytes:
        what = f"Azure Key Vault wrapkey with key {key_id!r}"
        name, version = self._split(key_id)
        answer = await self._call(
            self._key_url(name, version, "wrapkey"), {"alg": ALGORITHM, "value": b64url(dek)}, what
        )
        value, kid = answer.get("value"), answer.get("kid")
        if not isinstance(value, str):
            raise KmsError(f"{what}: the vault answered without a value", retriable=False)
        used = version or (kid.rstrip("/").rsplit("/", 1)[-1] if isinstance(kid, str) and "/keys/" in kid else "")
        tag = used.encode("ascii")
        if len(tag) > 255:
            raise KmsError(f"{what}: key version too long", retriable=False)
        return bytes([len(tag)]) + tag + from_b64url(value, what)

    async def unwrap(self, key_id: str, edek: bytes) -> bytes:
        what = f"Azure Key Vault unwrapkey with key {key_id!r}"
        name, version = self._split(key_id)
        if not edek or len(edek) < 1 + edek[0]:
            raise KmsError(f"{what}: the EDEK is not an Azure Key Vault one", retriable=False)
        used = edek[1 : 1 + edek[0]].decode("ascii", "replace") or version
        wrapped = edek[1 + edek[0] :]
        answer = await self._call(
            self._key_url(name, used, "unwrapkey"), {"alg": ALGORITHM, "value": b64url(wrapped)}, what
        )
        value = answer.get("value")
        if not isinstance(value, str):
            raise KmsError(f"{what}: the vault answered without a value", retriable=False)
        return from_b64url(value, what)

    async def check(self) -> None:
        """Gets a token: the authority is reachable and accepts the credentials."""
        await self.token()

    async def aclose(self) -> None:
        await self._http.aclose()
