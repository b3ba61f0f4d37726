"""HTTP calls to a KMS, and how their failures become :class:`KmsError`.

Every KMS here is a REST API, so they share one rule: a KMS that cannot be reached, times out,
throttles (429) or fails (5xx) may answer later (retriable); a missing key is
:class:`KmsKeyNotFound`; any other refusal means the request or the credentials are wrong (not
retriable). Messages name the KMS and the operation, never a secret: the KMS's own error text is
kept short and scrubbed of every credential the client holds.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, Final
from urllib.parse import urlsplit

import httpx

from kanal_encryption.kms.base import KmsError, KmsKeyNotFound

__all__ = ["DEFAULT_TIMEOUT_MS", "KmsHttp", "json_body", "redact", "status_error"]

#: Per-request timeout when a connection or kmsConfig block does not set one.
DEFAULT_TIMEOUT_MS: Final = 10_000

_DETAIL_MAX: Final = 300


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` without any of ``secrets`` (a KMS may echo what it was sent), cut to a readable length."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text if len(text) <= _DETAIL_MAX else text[:_DETAIL_MAX] + "..."


def status_error(status: int, what: str, detail: str, *, key_not_found: bool = False) -> KmsError:
    """The error of a non-2xx answer ``status``; ``key_not_found`` when the KMS's body said so."""
    text = f"{what}: HTTP {status}" + (f": {detail}" if detail else "")
    if key_not_found or status == 404:
        return KmsKeyNotFound(text)
    if status == 429 or status >= 500:
        return KmsError(text, retriable=True)
    return KmsError(text, retriable=False)


def json_body(response: httpx.Response, what: str) -> dict[str, Any]:
    """The JSON object of a 2xx answer (anything else is the KMS's fault: not retriable)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise KmsError(f"{what}: the KMS answered HTTP {response.status_code} without a JSON object", retriable=False)
    return body


def oauth_token(response: httpx.Response, what: str, default_lifetime: float) -> tuple[str, float]:
    """The access token of an OAuth2 token endpoint's answer (RFC 6749 5.1) and when to fetch a new
    one (``time.monotonic()`` based: a minute before it expires, or halfway for short ones)."""
    answer = json_body(response, what)
    token = answer.get("access_token")
    if not isinstance(token, str):
        raise KmsError(f"{what}: no access_token in the answer", retriable=False)
    try:
        lifetime = float(answer.get("expires_in") or default_lifetime)
    except (TypeError, ValueError):
        lifetime = default_lifetime
    return token, time.monotonic() + max(lifetime - 60, lifetime / 2)


class KmsHttp:
    """One KMS's HTTP client: a pooled ``httpx.AsyncClient`` and the transport-error mapping.

    ``secrets`` returns the credentials in use now, so that no message carries one.
    """

    def __init__(self, name: str, *, timeout_ms: int = DEFAULT_TIMEOUT_MS, verify: bool | str = True) -> None:
        self.name = name
        self.timeout_ms = timeout_ms
        self._client = httpx.AsyncClient(timeout=timeout_ms / 1000, verify=verify, follow_redirects=False)

    async def send(
        self,
        method: str,
        url: str,
        what: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        data: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """The answer, whatever its status; KmsError (retriable) when there is none."""
        host = urlsplit(url).netloc
        try:
            return await self._client.request(method, url, json=json, content=content, data=data, headers=headers)
        except httpx.TimeoutException:
            raise KmsError(
                f"{what}: {self.name} at {host} did not answer within {self.timeout_ms} ms", retriable=True
            ) from None
        except httpx.HTTPError as exc:
            raise KmsError(
                f"{what}: cannot reach {self.name} at {host} ({type(exc).__name__})", retriable=True
            ) from None

    async def aclose(self) -> None:
        await self._client.aclose()
