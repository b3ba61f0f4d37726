"""A small S3 client for the claim-check interceptors: PUT, GET and DELETE of one object,
signed with botocore's SigV4 signer and sent with httpx.

Only the signer comes from botocore: its client is synchronous, and the gateway must not block its
event loop on a 20 MB upload. The client creates nothing (no bucket): the bucket must exist. With a
``uri`` (MinIO, moto, a VPC endpoint) objects are addressed path-style
(``<uri>/<bucket>/<key>``), else virtual-hosted on AWS (``https://<bucket>.s3.<region>.amazonaws.com/<key>``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Final

import httpx
import trio
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, ReadOnlyCredentials
from botocore.session import Session

from kanal_safeguards.claim_check.object_store import ObjectMissing, StoreError

__all__ = ["S3Settings", "S3Store"]

_EMPTY_SHA256: Final = hashlib.sha256(b"").hexdigest()
_CODE: Final = re.compile(rb"<Code>([^<]{1,100})</Code>")


@dataclass(frozen=True)
class S3Settings:
    """The bucket, where it is, and the credentials (none: botocore's default chain)."""

    bucket: str
    region: str = "us-east-1"
    uri: str | None = None
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    timeout_ms: int = 8000


class _Signer(S3SigV4Auth):  # type: ignore[misc]  # (botocore is untyped)
    """SigV4 for S3 with the payload's SHA-256 given, not computed again over the body (the
    interceptor hashed the value already, off the event loop)."""

    def __init__(self, credentials: Credentials, region: str, payload_sha256: str) -> None:
        super().__init__(credentials, "s3", region)
        self._payload_sha256 = payload_sha256

    def payload(self, request: AWSRequest) -> str:
        return self._payload_sha256


class S3Store:
    """The :class:`~kanal_safeguards.object_store.ObjectStore` of one S3 bucket."""

    def __init__(self, settings: S3Settings) -> None:
        self.settings = settings
        where = f" at {settings.uri}" if settings.uri else f" in {settings.region}"
        self.description = f"S3 bucket {settings.bucket!r}{where}"
        if settings.uri:
            self._base = f"{settings.uri.rstrip('/')}/{settings.bucket}/"
        else:
            self._base = f"https://{settings.bucket}.s3.{settings.region}.amazonaws.com/"
        self._static: ReadOnlyCredentials | None = None
        if settings.access_key and settings.secret_key:
            self._static = ReadOnlyCredentials(settings.access_key, settings.secret_key, settings.session_token)
        self._chain: Credentials | None = None
        self._client = httpx.AsyncClient(timeout=settings.timeout_ms / 1000, follow_redirects=False)

    async def _credentials(self) -> ReadOnlyCredentials:
        if self._static is not None:
            return self._static
        if self._chain is None:  # the chain may read files or ask the instance metadata service: off the loop
            self._chain = await trio.to_thread.run_sync(lambda: Session().get_credentials())
            if self._chain is None:
                raise StoreError(f"{self.description}: no AWS credentials (set s3Config.accessKey and secretKey)")
        chain = self._chain
        frozen: ReadOnlyCredentials = await trio.to_thread.run_sync(chain.get_frozen_credentials)
        return frozen

    async def _send(self, method: str, key: str, payload_sha256: str, content: bytes | None = None) -> httpx.Response:
        url = self._base + key  # keys are [A-Za-z0-9._/-] only (object_store.valid_key): nothing to quote
        headers = {"Content-Type": "application/octet-stream"} if content is not None else {}
        request = AWSRequest(method=method, url=url, headers=headers)
        credentials = await self._credentials()
        signer = _Signer(
            Credentials(credentials.access_key, credentials.secret_key, credentials.token),
            self.settings.region,
            payload_sha256,
        )
        signer.add_auth(request)
        signed = {k: str(v) for k, v in request.headers.items()}
        try:
            return await self._client.request(method, url, content=content, headers=signed)
        except httpx.TimeoutException:
            raise StoreError(
                f"{self.description}: {method} {key} got no answer within {self.settings.timeout_ms} ms"
            ) from None
        except httpx.HTTPError as exc:
            raise StoreError(f"{self.description}: cannot reach S3 for {method} {key} ({type(exc).__name__})") from None

    def _failed(self, response: httpx.Response, method: str, key: str) -> StoreError:
        found = _CODE.search(response.content[:2000])
        code = found.group(1).decode("ascii", "replace") if found else ""
        text = f"{self.description}: {method} {key} answered HTTP {response.status_code}" + (f" {code}" if code else "")
        if response.status_code == 404 and code in ("NoSuchKey", ""):
            return ObjectMissing(text)
        return StoreError(text)

    async def put(self, key: str, data: bytes, sha256: bytes) -> None:
        response = await self._send("PUT", key, sha256.hex(), data)
        if response.status_code != 200:
            raise self._failed(response, "PUT", key)

    async def get(self, key: str) -> bytes:
        response = await self._send("GET", key, _EMPTY_SHA256)
        if response.status_code != 200:
            raise self._failed(response, "GET", key)
        return response.content

    async def delete(self, key: str) -> None:
        response = await self._send("DELETE", key, _EMPTY_SHA256)
        if response.status_code not in (200, 204):
            raise self._failed(response, "DELETE", key)

    async def aclose(self) -> None:
        await self._client.aclose()
