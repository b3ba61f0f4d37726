"""The proxy's settings, read from environment variables, every error naming the variable at fault.

The table :data:`VARIABLES` lists every variable with its default and meaning; ``docs/registry-proxy.md``
documents each of them (a test checks that it does).
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from kanal.api import ConfigError

log = logging.getLogger(__name__)

AuthProvider = Literal["basic", "jwt", "gateway"]
AuthorizationMode = Literal["reactive", "topic-acl", "read-only"]

AUTHORIZATION_MODES: tuple[AuthorizationMode, ...] = ("reactive", "topic-acl", "read-only")
COMMANDS_TOPIC = "_vendor_srp_commands"
EVENTS_TOPIC = "_vendor_srp_events"

# (variable, default shown in the docs, meaning)
VARIABLES: tuple[tuple[str, str, str], ...] = (
    ("VENDOR_LICENSE", "none (required)", "license token; checked once at startup"),
    ("VENDOR_LICENSE_PUBLIC_KEY", "none (required)", "Ed25519 public key (PEM text or file path) that verifies it"),
    ("AUTH_PROVIDER", "none (required)", "basic, jwt or gateway (gateway tokens; hosted by the gateway only)"),
    ("AUTHORIZATION_MODE", "reactive", "reactive, topic-acl or read-only"),
    ("AUTH_USE_REACTIVE_CONFIG", "unset", "deprecated; true maps to reactive"),
    ("AUTHORIZATION_SUPER_USERS", "empty", "semicolon-separated principals that bypass every check"),
    ("AUTHORIZATION_GUID_SUBJECT_CACHE_TTL", "5m", "cache of schema id/GUID to subjects"),
    ("AUTHORIZATION_TOPIC_ACL_CACHE_TTL", "500ms", "cache of ACL lookups per topic"),
    ("AUTHORIZATION_TOPIC_ACL_LOOKUP_TIMEOUT", "5s", "timeout of one ACL lookup"),
    ("BASIC_AUTH_LOCATION", "/etc/srp/basic-auth.json", "credentials file"),
    ("BASIC_AUTH_RELOAD_INTERVAL", "30s", "reload period of the credentials file"),
    ("BASIC_AUTH_ALLOW_PLAINTEXT", "false", "accept plaintext passwords in the credentials file"),
    ("AUTH_JWT_JWKS_URL", "unset", "JWKS document with the token signing keys"),
    ("AUTH_JWT_PUBLIC_KEY", "unset", "static verification key (PEM text or file path) instead of a JWKS"),
    ("AUTH_JWT_ISSUER", "none (required with jwt)", "expected iss claim"),
    ("AUTH_JWT_AUDIENCE", "none (required with jwt)", "expected aud claim (comma-separated: any of)"),
    ("AUTH_JWT_PRINCIPAL_CLAIM", "sub", "claim naming the principal (dotted path for nested claims)"),
    ("AUTH_JWT_ALGORITHMS", "RS256,RS384,RS512,PS256,PS384,PS512,ES256,ES384,ES512,EdDSA", "accepted algorithms"),
    ("AUTH_JWT_LEEWAY", "30s", "clock skew allowed on exp/nbf/iat"),
    ("AUTH_JWT_JWKS_REFRESH_INTERVAL", "5m", "how often the JWKS is fetched again"),
    ("SRP_HTTP_PORT", "8081", "listen port"),
    ("SRP_BIND_HOST", "0.0.0.0", "listen address"),
    ("SRP_TLS_CERTIFICATE_LOCATION", "unset", "serve HTTPS with this certificate (PEM, chain first)"),
    ("SRP_TLS_KEY_LOCATION", "unset", "the certificate's private key (PEM)"),
    ("SRP_ENABLED", "false", "kanal run hosts the proxy when true"),
    ("SRP_ACCESS_LOG", "true", "one structured log line per request"),
    ("SRP_LOG_FORMAT", "json", "json or text (kanal registry-proxy)"),
    ("SRP_LOG_LEVEL", "info", "log level (kanal registry-proxy)"),
    ("SRP_HEARTBEAT_INTERVAL", "10s", "reactive mode: heartbeat period on the events topic"),
    ("SRP_INSTANCE_ID", "<hostname>:<port>", "reactive mode: this instance's id in heartbeats"),
    ("SCHEMA_REGISTRY_PROXY_APP_ID", "schema-registry-proxy", "reactive mode: the proxy cluster's id"),
    ("SRP_COMMANDS_TOPIC", COMMANDS_TOPIC, "reactive mode: commands topic"),
    ("SRP_EVENTS_TOPIC", EVENTS_TOPIC, "reactive mode: events topic"),
    ("SCHEMA_REGISTRY_URL", "none (required)", "upstream registry base URL (http or https)"),
    ("SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO", "unset", "user:password the proxy sends upstream"),
    ("SCHEMA_REGISTRY_BEARER_AUTH_TOKEN", "unset", "bearer token the proxy sends upstream"),
    ("SCHEMA_REGISTRY_SSL_CA_LOCATION", "system CAs", "CA bundle that verifies the upstream"),
    ("SCHEMA_REGISTRY_SSL_CERTIFICATE_LOCATION", "unset", "client certificate (mutual TLS)"),
    ("SCHEMA_REGISTRY_SSL_KEY_LOCATION", "unset", "client key (mutual TLS)"),
    ("SCHEMA_REGISTRY_SSL_KEY_PASSWORD", "unset", "password of the client key"),
    ("SCHEMA_REGISTRY_SSL_CHECK_HOSTNAME", "true", "verify the upstream's host name"),
    ("SCHEMA_REGISTRY_TIMEOUT", "30s", "timeout of one upstream call"),
    ("SCHEMA_REGISTRY_MAX_CONNECTIONS", "100", "kept-alive upstream connections at most"),
    ("KAFKA_BOOTSTRAP_SERVERS", "none", "backing Kafka cluster (topic-acl and reactive modes); KAFKA_* as the gateway"),
    ("OTEL_TRACES_EXPORTER", "none", "none, console or otlp (otlp needs opentelemetry-exporter-otlp)"),
    ("OTEL_SERVICE_NAME", "kanal-registry-proxy", "service name of the traces"),
)

_BOOL = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$", re.IGNORECASE)
_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str, key: str) -> float:
    """Seconds from ``500ms``, ``30s``, ``5m``, ``1h`` or a bare number of seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ConfigError(key, f"expected a duration such as 500ms, 30s, 5m or 1h, got {text!r}")
    unit = match.group(2).lower() if match.group(2) else None
    return float(match.group(1)) * _UNITS[unit]


def parse_bool(text: str, key: str) -> bool:
    try:
        return _BOOL[text.strip().lower()]
    except KeyError:
        raise ConfigError(key, f"expected true or false, got {text!r}") from None


def read_pem(value: str, key: str) -> bytes:
    """PEM text given inline, or the contents of the file it names."""
    text = value.strip()
    if text.startswith("-----BEGIN"):
        return text.encode()
    try:
        with open(text, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise ConfigError(key, f"neither PEM text nor a readable file: {exc.strerror or exc}") from None


@dataclass(frozen=True)
class UpstreamRegistry:
    """Where and how the proxy reaches the registry it fronts."""

    url: str
    scheme: str
    host: str
    port: int
    base_path: str
    basic_auth_user_info: str | None = None
    bearer_token: str | None = None
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: str | None = None
    ssl_check_hostname: bool = True
    timeout: float = 30.0
    max_connections: int = 100


@dataclass(frozen=True)
class JwtSettings:
    jwks_url: str | None
    public_key: bytes | None
    issuer: str
    audience: tuple[str, ...]
    principal_claim: str = "sub"
    algorithms: tuple[str, ...] = ("RS256",)
    leeway: float = 30.0
    jwks_refresh_interval: float = 300.0


@dataclass(frozen=True)
class ProxySettings:
    license_token: str
    license_public_key: bytes
    auth_provider: AuthProvider
    upstream: UpstreamRegistry
    authorization_mode: AuthorizationMode = "reactive"
    super_users: frozenset[str] = frozenset()
    guid_subject_cache_ttl: float = 300.0
    topic_acl_cache_ttl: float = 0.5
    topic_acl_lookup_timeout: float = 5.0
    basic_auth_location: str = "/etc/srp/basic-auth.json"
    basic_auth_reload_interval: float = 30.0
    basic_auth_allow_plaintext: bool = False
    jwt: JwtSettings | None = None
    http_port: int = 8081
    bind_host: str = "0.0.0.0"
    tls_certificate_location: str | None = None
    tls_key_location: str | None = None
    access_log: bool = True
    log_format: str = "json"
    log_level: str = "info"
    app_id: str = "schema-registry-proxy"
    instance_id: str = ""
    heartbeat_interval: float = 10.0
    commands_topic: str = COMMANDS_TOPIC
    events_topic: str = EVENTS_TOPIC
    traces_exporter: str = "none"
    service_name: str = "kanal-registry-proxy"
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @property
    def needs_kafka(self) -> bool:
        return self.authorization_mode in ("topic-acl", "reactive")


def _get(env: Mapping[str, str], key: str) -> str | None:
    value = env.get(key)
    if value is None or not value.strip():
        return None
    return value.strip()


def _duration(env: Mapping[str, str], key: str, default: float, allow_zero: bool = False) -> float:
    value = _get(env, key)
    if value is None:
        return default
    seconds = parse_duration(value, key)
    if seconds <= 0 and not (allow_zero and seconds == 0):
        raise ConfigError(key, "must be greater than zero")
    return seconds


def _bool(env: Mapping[str, str], key: str, default: bool) -> bool:
    value = _get(env, key)
    return default if value is None else parse_bool(value, key)


def _int(env: Mapping[str, str], key: str, default: int, lo: int, hi: int) -> int:
    value = _get(env, key)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(key, f"expected an integer, got {value!r}") from None
    if not lo <= number <= hi:
        raise ConfigError(key, f"must be between {lo} and {hi}, got {number}")
    return number


def parse_upstream_registry(env: Mapping[str, str]) -> UpstreamRegistry:
    url = _get(env, "SCHEMA_REGISTRY_URL")
    if url is None:
        raise ConfigError("SCHEMA_REGISTRY_URL", "required: the URL of the schema registry to proxy")
    parts = urlsplit(url.split(",")[0].strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError("SCHEMA_REGISTRY_URL", f"expected http(s)://host[:port][/path], got {url!r}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ConfigError("SCHEMA_REGISTRY_URL", f"invalid port in {url!r}") from None
    user_info = _get(env, "SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO")
    if user_info is None and parts.username is not None:
        from urllib.parse import unquote

        user_info = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    if user_info is not None and ":" not in user_info:
        raise ConfigError("SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO", "expected user:password")
    return UpstreamRegistry(
        url=f"{parts.scheme}://{parts.hostname}:{port}{parts.path.rstrip('/')}",
        scheme=parts.scheme,
        host=parts.hostname,
        port=port,
        base_path=parts.path.rstrip("/"),
        basic_auth_user_info=user_info,
        bearer_token=_get(env, "SCHEMA_REGISTRY_BEARER_AUTH_TOKEN"),
        ssl_ca_location=_get(env, "SCHEMA_REGISTRY_SSL_CA_LOCATION"),
        ssl_certificate_location=_get(env, "SCHEMA_REGISTRY_SSL_CERTIFICATE_LOCATION"),
        ssl_key_location=_get(env, "SCHEMA_REGISTRY_SSL_KEY_LOCATION"),
        ssl_key_password=_get(env, "SCHEMA_REGISTRY_SSL_KEY_PASSWORD"),
        ssl_check_hostname=_bool(env, "SCHEMA_REGISTRY_SSL_CHECK_HOSTNAME", True),
        timeout=_duration(env, "SCHEMA_REGISTRY_TIMEOUT", 30.0),
        max_connections=_int(env, "SCHEMA_REGISTRY_MAX_CONNECTIONS", 100, 1, 10_000),
    )


def parse_jwt(env: Mapping[str, str]) -> JwtSettings:
    jwks_url = _get(env, "AUTH_JWT_JWKS_URL")
    key_text = _get(env, "AUTH_JWT_PUBLIC_KEY")
    if (jwks_url is None) == (key_text is None):
        raise ConfigError(
            "AUTH_JWT_JWKS_URL", "with AUTH_PROVIDER=jwt set exactly one of AUTH_JWT_JWKS_URL and AUTH_JWT_PUBLIC_KEY"
        )
    if jwks_url is not None and urlsplit(jwks_url).scheme not in ("http", "https"):
        raise ConfigError("AUTH_JWT_JWKS_URL", f"expected an http(s) URL, got {jwks_url!r}")
    issuer = _get(env, "AUTH_JWT_ISSUER")
    if issuer is None:
        raise ConfigError("AUTH_JWT_ISSUER", "required with AUTH_PROVIDER=jwt: the expected iss claim")
    audience = _get(env, "AUTH_JWT_AUDIENCE")
    if audience is None:
        raise ConfigError("AUTH_JWT_AUDIENCE", "required with AUTH_PROVIDER=jwt: the expected aud claim")
    algorithms = tuple(
        a.strip() for a in (_get(env, "AUTH_JWT_ALGORITHMS") or VARIABLES_DEFAULT_ALGORITHMS).split(",") if a.strip()
    )
    if any(a.upper().startswith("HS") or a.lower() == "none" for a in algorithms):
        raise ConfigError("AUTH_JWT_ALGORITHMS", "only asymmetric algorithms are accepted (no HS*, no none)")
    return JwtSettings(
        jwks_url=jwks_url,
        public_key=read_pem(key_text, "AUTH_JWT_PUBLIC_KEY") if key_text is not None else None,
        issuer=issuer,
        audience=tuple(a.strip() for a in audience.split(",") if a.strip()),
        principal_claim=_get(env, "AUTH_JWT_PRINCIPAL_CLAIM") or "sub",
        algorithms=algorithms,
        leeway=_duration(env, "AUTH_JWT_LEEWAY", 30.0, allow_zero=True),
        jwks_refresh_interval=_duration(env, "AUTH_JWT_JWKS_REFRESH_INTERVAL", 300.0),
    )


VARIABLES_DEFAULT_ALGORITHMS = "RS256,RS384,RS512,PS256,PS384,PS512,ES256,ES384,ES512,EdDSA"


def authorization_mode(env: Mapping[str, str], warnings: list[str]) -> AuthorizationMode:
    """AUTHORIZATION_MODE, else the deprecated AUTH_USE_REACTIVE_CONFIG, else reactive."""
    legacy = _get(env, "AUTH_USE_REACTIVE_CONFIG")
    mode = _get(env, "AUTHORIZATION_MODE")
    if legacy is not None:
        use_reactive = parse_bool(legacy, "AUTH_USE_REACTIVE_CONFIG")
        if mode is not None:
            warnings.append("AUTH_USE_REACTIVE_CONFIG is deprecated and ignored: AUTHORIZATION_MODE is set and wins")
        elif use_reactive:
            warnings.append("AUTH_USE_REACTIVE_CONFIG is deprecated: use AUTHORIZATION_MODE=reactive")
            return "reactive"
        else:
            warnings.append(
                "AUTH_USE_REACTIVE_CONFIG=false is deprecated and has no effect: the mode is the default, reactive;"
                " choose another with AUTHORIZATION_MODE"
            )
    if mode is None:
        return "reactive"
    for choice in AUTHORIZATION_MODES:
        if mode.lower() == choice:
            return choice
    raise ConfigError("AUTHORIZATION_MODE", f"expected one of {', '.join(AUTHORIZATION_MODES)}, got {mode!r}")


def load_settings(env: Mapping[str, str], *, hosted: bool = False) -> ProxySettings:
    """Every setting of the proxy, or a ConfigError naming the variable at fault.

    ``hosted``: the gateway hosts the proxy and gives it its own Kafka client and state logs, so
    ``KAFKA_BOOTSTRAP_SERVERS`` is not required here. Alone, the ``KAFKA_*`` variables name the cluster,
    and the command line's client checks the others when it is created. The license itself is checked
    by :func:`kanal_registry_proxy.license.check_license`.
    """
    warnings: list[str] = []
    token = _get(env, "VENDOR_LICENSE")
    if token is None:
        raise ConfigError("VENDOR_LICENSE", "required: a license token (see docs/registry-proxy.md, License)")
    public_key = _get(env, "VENDOR_LICENSE_PUBLIC_KEY")
    if public_key is None:
        raise ConfigError("VENDOR_LICENSE_PUBLIC_KEY", "required: the Ed25519 public key that verifies VENDOR_LICENSE")
    provider = _get(env, "AUTH_PROVIDER")
    if provider is None:
        raise ConfigError("AUTH_PROVIDER", "required: basic, jwt or gateway (the proxy has no default provider)")
    provider = provider.lower()
    if provider not in ("basic", "jwt", "gateway"):
        raise ConfigError("AUTH_PROVIDER", f"expected basic, jwt or gateway, got {provider!r}")
    if provider == "gateway" and not hosted:
        raise ConfigError(
            "AUTH_PROVIDER",
            "gateway checks gateway tokens, so it needs the gateway to host the proxy"
            " (SRP_ENABLED=true kanal run), not kanal registry-proxy",
        )
    mode = authorization_mode(env, warnings)
    super_users = frozenset(
        name.strip() for name in (env.get("AUTHORIZATION_SUPER_USERS") or "").split(";") if name.strip()
    )
    http_port = _int(env, "SRP_HTTP_PORT", 8081, 0, 65535)
    if not hosted and mode in ("topic-acl", "reactive") and _get(env, "KAFKA_BOOTSTRAP_SERVERS") is None:
        raise ConfigError(
            "KAFKA_BOOTSTRAP_SERVERS",
            f"required with AUTHORIZATION_MODE={mode}: the Kafka cluster that holds the "
            + ("ACLs" if mode == "topic-acl" else "permission topics"),
        )
    if _get(env, "SRP_TLS_KEY_LOCATION") is not None and _get(env, "SRP_TLS_CERTIFICATE_LOCATION") is None:
        raise ConfigError("SRP_TLS_CERTIFICATE_LOCATION", "required when SRP_TLS_KEY_LOCATION is set")
    log_format = (_get(env, "SRP_LOG_FORMAT") or "json").lower()
    if log_format not in ("json", "text"):
        raise ConfigError("SRP_LOG_FORMAT", f"expected json or text, got {log_format!r}")
    exporter = (_get(env, "OTEL_TRACES_EXPORTER") or "none").lower()
    if exporter not in ("none", "console", "otlp"):
        raise ConfigError("OTEL_TRACES_EXPORTER", f"expected none, console or otlp, got {exporter!r}")
    return ProxySettings(
        license_token=token,
        license_public_key=read_pem(public_key, "VENDOR_LICENSE_PUBLIC_KEY"),
        auth_provider="basic" if provider == "basic" else "gateway" if provider == "gateway" else "jwt",
        upstream=parse_upstream_registry(env),
        authorization_mode=mode,
        super_users=super_users,
        guid_subject_cache_ttl=_duration(env, "AUTHORIZATION_GUID_SUBJECT_CACHE_TTL", 300.0),
        topic_acl_cache_ttl=_duration(env, "AUTHORIZATION_TOPIC_ACL_CACHE_TTL", 0.5),
        topic_acl_lookup_timeout=_duration(env, "AUTHORIZATION_TOPIC_ACL_LOOKUP_TIMEOUT", 5.0),
        basic_auth_location=_get(env, "BASIC_AUTH_LOCATION") or "/etc/srp/basic-auth.json",
        basic_auth_reload_interval=_duration(env, "BASIC_AUTH_RELOAD_INTERVAL", 30.0),
        basic_auth_allow_plaintext=_bool(env, "BASIC_AUTH_ALLOW_PLAINTEXT", False),
        jwt=parse_jwt(env) if provider == "jwt" else None,
        http_port=http_port,
        bind_host=_get(env, "SRP_BIND_HOST") or "0.0.0.0",
        tls_certificate_location=_get(env, "SRP_TLS_CERTIFICATE_LOCATION"),
        tls_key_location=_get(env, "SRP_TLS_KEY_LOCATION"),
        access_log=_bool(env, "SRP_ACCESS_LOG", True),
        log_format=log_format,
        log_level=(_get(env, "SRP_LOG_LEVEL") or "info").lower(),
        app_id=_get(env, "SCHEMA_REGISTRY_PROXY_APP_ID") or "schema-registry-proxy",
        instance_id=_get(env, "SRP_INSTANCE_ID") or f"{socket.gethostname()}:{http_port}",
        heartbeat_interval=_duration(env, "SRP_HEARTBEAT_INTERVAL", 10.0),
        commands_topic=_get(env, "SRP_COMMANDS_TOPIC") or COMMANDS_TOPIC,
        events_topic=_get(env, "SRP_EVENTS_TOPIC") or EVENTS_TOPIC,
        traces_exporter=exporter,
        service_name=_get(env, "OTEL_SERVICE_NAME") or "kanal-registry-proxy",
        warnings=tuple(warnings),
    )
