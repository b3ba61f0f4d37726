"""TLS contexts for the client listener and the upstream connection."""

from __future__ import annotations

import ssl

from kanal.config.settings import Settings
from kanal.config.upstream import UpstreamSettings


def server_context(settings: Settings) -> ssl.SSLContext | None:
    """The client listener's context, or None for PLAINTEXT and SASL_PLAINTEXT."""
    if settings.security_protocol not in ("ssl", "sasl_ssl"):
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    assert settings.ssl_certificate_location is not None  # checked by settings validation
    ctx.load_cert_chain(settings.ssl_certificate_location, settings.ssl_key_location, settings.ssl_key_password)
    if settings.ssl_client_auth != "none":
        ctx.load_verify_locations(settings.ssl_ca_location)
        ctx.verify_mode = ssl.CERT_REQUIRED if settings.ssl_client_auth == "required" else ssl.CERT_OPTIONAL
    return ctx


def upstream_context(upstream: UpstreamSettings) -> ssl.SSLContext | None:
    """The context for connections to the cluster, or None without TLS."""
    if not upstream.uses_tls:
        return None
    ctx = ssl.create_default_context(cafile=upstream.ssl_ca_location)
    ctx.check_hostname = upstream.ssl_check_hostname
    if not upstream.ssl_check_hostname:
        ctx.verify_mode = ssl.CERT_REQUIRED
    if upstream.ssl_certificate_location:
        ctx.load_cert_chain(upstream.ssl_certificate_location, upstream.ssl_key_location, upstream.ssl_key_password)
    return ctx
