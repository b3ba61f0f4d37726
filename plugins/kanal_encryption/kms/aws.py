"""AWS KMS over its JSON API, signed with botocore's SigV4 signer and sent with httpx.

wrap = ``TrentService.Encrypt`` (the EDEK is the ``CiphertextBlob``, which names the key), unwrap =
``TrentService.Decrypt``. Only the signer comes from botocore: its client is synchronous, and the
gateway must not block its event loop on a KMS call. The key id may be a key id, a key ARN, an alias
name (``alias/...``) or an alias ARN; an ARN's region is used for that key, so one client reaches
keys of several regions.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Final

import trio
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, ReadOnlyCredentials
from botocore.session import Session

from kanal_encryption.kms.base import KmsError, KmsKeyNotFound
from kanal_encryption.kms.codec import b64, from_b64
from kanal_encryption.kms.http import DEFAULT_TIMEOUT_MS, KmsHttp, redact, status_error

__all__ = ["ARN", "AwsKms", "AwsSettings"]

#: ``arn:<partition>:kms:<region>:<account>:key/<id>`` or ``...:alias/<name>``.
ARN: Final = re.compile(r"^arn:(aws[a-z-]*):kms:([a-z0-9-]+):(\d{12}):(key|alias)/(.+)$")
_RETRIABLE: Final = {
    "ThrottlingException",
    "KMSInternalException",
    "DependencyTimeoutException",
    "KeyUnavailableException",
    "ServiceUnavailableException",
    "InternalFailure",
}


@dataclass(frozen=True)
class AwsSettings:
    """Region, credentials (none: botocore's default chain) and an endpoint override (tests, VPC)."""

    region: str | None = None
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    endpoint: str | None = None
    timeout_ms: int = DEFAULT_TIMEOUT_MS


class AwsKms:
    """The :class:`~kanal_encryption.kms.base.Kms` of AWS KMS keys."""

    kind = "aws-kms"

    def __init__(self, settings: AwsSettings) -> None:
        self.settings = settings
        self._http = KmsHttp("AWS KMS", timeout_ms=settings.timeout_ms)
        self._static: ReadOnlyCredentials | None = None
        if settings.access_key and settings.secret_key:
            self._static = ReadOnlyCredentials(settings.access_key, settings.secret_key, settings.session_token)
        self._chain: Credentials | None = None
        self._secrets: tuple[str | None, ...] = (settings.secret_key, settings.session_token)

    async def _credentials(self, what: str) -> ReadOnlyCredentials:
        if self._static is not None:
            return self._static
        if self._chain is None:  # the chain may read files or ask the instance metadata service: off the loop
            self._chain = await trio.to_thread.run_sync(lambda: Session().get_credentials())
            if self._chain is None:
                raise KmsError(
                    f"{what}: no AWS credentials (set them, or configure the default chain)", retriable=False
                )
        chain = self._chain
        frozen: ReadOnlyCredentials = await trio.to_thread.run_sync(chain.get_frozen_credentials)
        self._secrets = (frozen.secret_key, frozen.token)
        return frozen

    def _region(self, key_id: str | None, what: str) -> str:
        match = ARN.match(key_id or "")
        region = match.group(2) if match else self.settings.region
        if not region:
            raise KmsError(f"{what}: no region (set the connection's REGION or use a key ARN)", retriable=False)
        return region

    async def call(self, target: str, body: dict[str, Any], what: str, key_id: str | None = None) -> dict[str, Any]:
        """One signed ``TrentService.<target>`` call; KmsError when it fails."""
        region = self._region(key_id, what)
        url = (self.settings.endpoint or f"https://kms.{region}.amazonaws.com").rstrip("/") + "/"
        content = json.dumps(body).encode("utf-8")
        request = AWSRequest(
            method="POST",
            url=url,
            data=content,
            headers={"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": f"TrentService.{target}"},
        )
        credentials = await self._credentials(what)
        SigV4Auth(
            Credentials(credentials.access_key, credentials.secret_key, credentials.token), "kms", region
        ).add_auth(request)
        headers = {k: str(v) for k, v in request.headers.items()}
        response = await self._http.send("POST", url, what, content=content, headers=headers)
        try:
            answer = response.json()
        except ValueError:
            answer = {}
        answer = answer if isinstance(answer, dict) else {}
        if response.status_code == 200:
            return answer
        kind = str(answer.get("__type") or "").rsplit("#", 1)[-1]
        message = str(answer.get("message") or answer.get("Message") or "")
        detail = redact(f"{kind}: {message}" if kind else message, self._secrets)
        if kind == "NotFoundException" or (kind == "KMSInvalidStateException" and "pending deletion" in message):
            raise KmsKeyNotFound(f"{what}: {detail}")
        if kind in _RETRIABLE:
            raise KmsError(f"{what}: {detail}", retriable=True)
        raise status_error(response.status_code, what, detail)

    async def wrap(self, key_id: str, dek: bytes) -> bytes:
        what = f"AWS KMS Encrypt with key {key_id!r}"
        answer = await self.call("Encrypt", {"KeyId": key_id, "Plaintext": b64(dek)}, what, key_id)
        blob = answer.get("CiphertextBlob")
        if not isinstance(blob, str):
            raise KmsError(f"{what}: AWS KMS answered without a CiphertextBlob", retriable=False)
        return from_b64(blob, what)

    async def unwrap(self, key_id: str, edek: bytes) -> bytes:
        what = f"AWS KMS Decrypt with key {key_id!r}"
        answer = await self.call("Decrypt", {"KeyId": key_id, "CiphertextBlob": b64(edek)}, what, key_id)
        plaintext = answer.get("Plaintext")
        if not isinstance(plaintext, str):
            raise KmsError(f"{what}: AWS KMS answered without a Plaintext", retriable=False)
        return from_b64(plaintext, what)

    async def check(self) -> None:
        """Signs a ``ListKeys`` call: an access denial still proves the endpoint and the signature
        work (the gateway's role needs only Encrypt and Decrypt); bad credentials do not pass."""
        try:
            await self.call("ListKeys", {"Limit": 1}, "AWS KMS check")
        except KmsError as exc:
            if "AccessDeniedException" not in str(exc):
                raise

    async def aclose(self) -> None:
        await self._http.aclose()
