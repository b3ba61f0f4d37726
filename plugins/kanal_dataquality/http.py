"""One HTTP call at a time (alert webhooks), on :mod:`kanal_schemas.http`'s client.

One connection per call (webhooks are called when an alert fires), a deadline over the whole call,
``http`` and ``https``. Raises :class:`HttpError` for anything that is not an HTTP answer (refused,
timed out, TLS failure, malformed response). Schema registry lookups go through
:class:`kanal_schemas.SchemaRegistryClient` (see :mod:`kanal_dataquality.avro`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kanal_schemas import Endpoint, HttpError, request_once

__all__ = ["HttpError", "Response", "request"]


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    headers: Mapping[str, str]  # names in lower case


async def request(
    method: str,
    url: str,
    *,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 5.0,
) -> Response:
    """One HTTP call; the whole exchange must finish within ``timeout`` seconds."""
    try:
        Endpoint.parse(url)
    except ValueError:
        raise HttpError(f"not an http(s) URL: {url!r}") from None
    try:
        response = await request_once(method, url, body=body or b"", headers=headers, timeout=timeout)
    except HttpError as exc:
        raise HttpError(f"{method} {url}: {exc}", timeout=exc.timeout) from None
    return Response(
        response.status,
        response.body,
        {name.decode("latin-1"): value.decode("latin-1") for name, value in response.headers},
    )
