"""The upstream client: :mod:`kanal_schemas.http`'s kept-alive HTTP/1.1 client, set up from the proxy's
settings (TLS, the registry's base path, the credentials the proxy sends upstream).

The names the proxy has always used stay here: ``UpstreamError`` is the HTTP client's error, and
``UpstreamResponse`` its answer.
"""

from __future__ import annotations

import base64
import ssl

from kanal_schemas.http import Headers, HttpClient, HttpError, HttpResponse, TlsSettings, receive_some, send_all

from kanal_registry_proxy.settings import UpstreamRegistry

__all__ = [
    "Headers",
    "HttpClient",
    "UpstreamError",
    "UpstreamResponse",
    "client_for",
    "receive_some",
    "send_all",
    "tls_context",
    "tls_settings",
]

UpstreamError = HttpError
UpstreamResponse = HttpResponse


def tls_settings(upstream: UpstreamRegistry) -> TlsSettings:
    """Without hostname checks and without a CA, any certificate is accepted (as before the shared client)."""
    return TlsSettings(
        ca_location=upstream.ssl_ca_location,
        certificate_location=upstream.ssl_certificate_location,
        key_location=upstream.ssl_key_location,
        key_password=upstream.ssl_key_password,
        check_hostname=upstream.ssl_check_hostname,
        verify=upstream.ssl_check_hostname or bool(upstream.ssl_ca_location),
    )


def tls_context(upstream: UpstreamRegistry) -> ssl.SSLContext | None:
    return tls_settings(upstream).context() if upstream.scheme == "https" else None


def client_for(upstream: UpstreamRegistry) -> HttpClient:
    """The proxy's client of its upstream registry."""
    headers: list[tuple[bytes, bytes]] = []
    if upstream.basic_auth_user_info is not None:
        headers.append((b"Authorization", b"Basic " + base64.b64encode(upstream.basic_auth_user_info.encode())))
    elif upstream.bearer_token is not None:
        headers.append((b"Authorization", b"Bearer " + upstream.bearer_token.encode()))
    return HttpClient(
        upstream.host,
        upstream.port,
        tls=tls_context(upstream),
        timeout=upstream.timeout,
        max_connections=upstream.max_connections,
        base_path=upstream.base_path,
        default_headers=headers,
    )
