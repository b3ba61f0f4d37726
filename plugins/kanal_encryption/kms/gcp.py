"""Google Cloud KMS: symmetric encrypt and decrypt with a crypto key, over its REST API.

wrap = ``POST {endpoint}/v1/{name}:encrypt`` with ``{"plaintext": <base64>}`` (the EDEK is the
answer's ``ciphertext``, which names the key version); unwrap = ``POST {endpoint}/v1/{name}:decrypt``.
``name`` is the key's resource name, ``projects/<p>/locations/<l>/keyRings/<r>/cryptoKeys/<k>``.

Auth: a given access token, or a service account key file: a JWT signed RS256 with its private key
is exchanged at the file's ``token_uri`` (OAuth2 JWT bearer grant) for an access token, kept until a
minute before it expires and requested again once if the KMS answers 401.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote

import jwt
import trio

from kanal_encryption.kms.base import KmsError
from kanal_encryption.kms.codec import b64, from_b64
from kanal_encryption.kms.http import DEFAULT_TIMEOUT_MS, KmsHttp, json_body, oauth_token, redact, status_error

__all__ = ["DEFAULT_ENDPOINT", "GcpKms", "GcpSettings", "ServiceAccount", "read_service_account"]

DEFAULT_ENDPOINT: Final = "https://cloudkms.googleapis.com"
DEFAULT_TOKEN_URI: Final = "https://oauth2.googleapis.com/token"
SCOPE: Final = "https://www.googleapis.com/auth/cloudkms"
_JWT_BEARER: Final = "urn:ietf:params:oauth:grant-type:jwt-bearer"


@dataclass(frozen=True)
class ServiceAccount:
    """What the gateway needs of a service account key file."""

    client_email: str
    private_key: str = field(repr=False)
    private_key_id: str | None = None
    token_uri: str = DEFAULT_TOKEN_URI


def read_service_account(path: str) -> ServiceAccount:
    """The service account of a key file; ValueError saying what is wrong (never the key)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError:
        raise ValueError(f"{path} is not JSON (expected a service account key file)") from None
    if not isinstance(data, dict) or data.get("type", "service_account") != "service_account":
        raise ValueError(f"{path} is not a service account key file")
    email, key = data.get("client_email"), data.get("private_key")
    if not isinstance(email, str) or not isinstance(key, str):
        raise ValueError(f"{path} has no client_email or private_key")
    return ServiceAccount(email, key, data.get("private_key_id"), data.get("token_uri") or DEFAULT_TOKEN_URI)


@dataclass(frozen=True)
class GcpSettings:
    """Credentials (a key file, or an access token) and an endpoint override (tests, private access)."""

    credentials_file: str | None = None
    access_token: str | None = field(default=None, repr=False)
    endpoint: str = DEFAULT_ENDPOINT
    #: ``projects/<p>/locations/<l>/keyRings/<r>``: a key id without ``/`` is a key of this ring.
    key_ring: str | None = None
    timeout_ms: int = DEFAULT_TIMEOUT_MS


class GcpKms:
    """The :class:`~kanal_encryption.kms.base.Kms` of Google Cloud KMS crypto keys."""

    kind = "gcp-kms"

    def __init__(self, settings: GcpSettings) -> None:
        self.settings = settings
        self._http = KmsHttp("Google Cloud KMS", timeout_ms=settings.timeout_ms)
        self._account: ServiceAccount | None = None
        self._token: str | None = settings.access_token
        self._expires = float("inf") if settings.access_token else 0.0
        self._lock = trio.Lock()

    def _secrets(self) -> tuple[str | None, ...]:
        return (self.settings.access_token, self._token, self._account.private_key if self._account else None)

    def name(self, key_id: str) -> str:
        """The resource name of ``key_id`` (a bare name is a key of the connection's key ring)."""
        if "/" not in key_id and self.settings.key_ring:
            return f"{self.settings.key_ring.rstrip('/')}/cryptoKeys/{key_id}"
        return key_id

    async def token(self, stale: str | None = None) -> str:
        async with self._lock:
            if self._token is not None and self._token != stale and time.monotonic() < self._expires:
                return self._token
            if self.settings.credentials_file is None:
                raise KmsError(
                    "Google Cloud KMS: the access token was refused and there is no key file", retriable=False
                )
            what = "Google OAuth2 token request"
            if self._account is None:
                try:
                    path = self.settings.credentials_file
                    self._account = await trio.to_thread.run_sync(read_service_account, path)
                except ValueError as exc:
                    raise KmsError(f"{what}: {exc}", retriable=False) from None
            account = self._account
            now = int(time.time())
            claims = {
                "iss": account.client_email,
                "scope": SCOPE,
                "aud": account.token_uri,
                "iat": now,
                "exp": now + 3600,
            }
            headers = {"kid": account.private_key_id} if account.private_key_id else None
            try:
                assertion = jwt.encode(claims, account.private_key, algorithm="RS256", headers=headers)
            except (ValueError, TypeError, jwt.PyJWTError):
                raise KmsError(f"{what}: the key file's private_key is not an RSA key", retriable=False) from None
            form = {"grant_type": _JWT_BEARER, "assertion": assertion}
            response = await self._http.send("POST", account.token_uri, what, data=form)
            if response.status_code != 200:
                raise self._error(response, what)
            token, self._expires = oauth_token(response, what, 3600)
            self._token = token
            return token

    def _error(self, response: Any, what: str) -> KmsError:
        try:
            body = response.json()
        except ValueError:
            body = {}
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):  # {"error": {"code", "message", "status"}}
            status, message = str(error.get("status") or ""), str(error.get("message") or "")
        else:  # the token endpoint: {"error": "invalid_grant", "error_description": ...}
            status, message = (
                str(error or ""),
                str(body.get("error_description") or "") if isinstance(body, dict) else "",
            )
        detail = redact(f"{status}: {message}" if status else message, self._secrets())
        # A destroyed or disabled key version answers FAILED_PRECONDITION: the data is shredded.
        gone = status == "NOT_FOUND" or (status == "FAILED_PRECONDITION" and "DESTROYED" in message.upper())
        return status_error(response.status_code, what, detail, key_not_found=gone)

    async def _call(self, name: str, op: str, body: dict[str, str], what: str) -> dict[str, Any]:
        url = f"{self.settings.endpoint.rstrip('/')}/v1/{quote(name, safe='/')}:{op}"
        token = await self.token()
        response = await self._http.send("POST", url, what, json=body, headers={"Authorization": f"Bearer {token}"})
        if response.status_code == 401 and self.settings.credentials_file is not None:
            token = await self.token(stale=token)
            response = await self._http.send("POST", url, what, json=body, headers={"Authorization": f"Bearer {token}"})
        if response.status_code != 200:
            raise self._error(response, what)
        return json_body(response, what)

    async def wrap(self, key_id: str, dek: bytes) -> bytes:
        what = f"Google Cloud KMS encrypt with key {key_id!r}"
        answer = await self._call(self.name(key_id), "encrypt", {"plaintext": b64(dek)}, what)
        ciphertext = answer.get("ciphertext")
        if not isinstance(ciphertext, str):
            raise KmsError(f"{what}: the KMS answered without a ciphertext", retriable=False)
        return from_b64(ciphertext, what)

    async def unwrap(self, key_id: str, edek: bytes) -> bytes:
        what = f"Google Cloud KMS decrypt with key {key_id!r}"
        answer = await self._call(self.name(key_id), "decrypt", {"ciphertext": b64(edek)}, what)
        plaintext = answer.get("plaintext")
        if not isinstance(plaintext, str):
            raise KmsError(f"{what}: the KMS answered without a plaintext", retriable=False)
        return from_b64(plaintext, what)

    async def check(self) -> None:
        """Gets a token (a given access token is only checked by the first call)."""
        await self.token()

    async def aclose(self) -> None:
        await self._http.aclose()
