"""TLS contexts for the client listener and the upstream connection, and the principal a client
certificate gives (mTLS)."""

from __future__ import annotations

import functools
import ssl

from kanal.config.settings import Settings
from kanal.config.upstream import UpstreamSettings
from kanal.identity.principal_mapping import Rule, parse_rules, principal_for, subject_of


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


class CertificateRefused(Exception):
    """A client certificate that names nobody: Kafka closes such a connection, and so does the gateway."""


@functools.lru_cache(maxsize=4)
def _rules(text: str) -> tuple[Rule, ...]:
    return parse_rules(text)  # checked at startup: parsed once, not per connection


def certificate_principal(settings: Settings, certificate: bytes | None) -> str | None:
    """The principal of a client's certificate (DER) on an SSL listener that asks for one
    (GATEWAY_SSL_CLIENT_AUTH REQUESTED or REQUIRED): its subject, as Java prints it, mapped by
    GATEWAY_SSL_PRINCIPAL_MAPPING_RULES. None leaves the client anonymous: no certificate (under
    REQUESTED), or a SASL_SSL listener, where the SASL login names the client (Kafka ignores the
    certificate there too). CertificateRefused when no rule maps the subject."""
    if settings.security_protocol != "ssl" or settings.ssl_client_auth == "none" or certificate is None:
        return None
    try:
        subject = subject_of(certificate)
    except ValueError as exc:
        raise CertificateRefused(f"unreadable certificate subject ({exc})") from None
    principal = principal_for(subject, _rules(settings.ssl_principal_mapping_rules))
    if principal is None:
        raise CertificateRefused(f"no rule of GATEWAY_SSL_PRINCIPAL_MAPPING_RULES maps certificate subject {subject!r}")
    if not principal:
        raise CertificateRefused(f"certificate subject {subject!r} maps to an empty principal")
    return principal
