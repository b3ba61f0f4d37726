"""The upstream cluster's client configuration, from ``KAFKA_*`` variables.

Every ``KAFKA_*`` variable is a client property (prefix dropped, lower case, ``_`` to ``.``:
``KAFKA_SASL_MECHANISM`` is ``sasl.mechanism``), the convention Kafka tools share.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kanal.api.errors import ConfigError

KAFKA_PREFIX = "KAFKA_"
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class UpstreamSettings:
    """How the gateway connects to the backing cluster."""

    bootstrap_servers: tuple[tuple[str, int], ...] = (("127.0.0.1", 9092),)
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: str | None = None
    ssl_check_hostname: bool = True
    #: The membership group's timings (``KAFKA_HEARTBEAT_INTERVAL_MS``, ``KAFKA_SESSION_TIMEOUT_MS``),
    #: with the defaults of Kafka's own clients.
    heartbeat_interval_ms: int = 3000
    session_timeout_ms: int = 45000
    properties: Mapping[str, str] = field(default_factory=dict)

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")


def _property_name(env_name: str) -> str:
    return env_name[len(KAFKA_PREFIX) :].lower().replace("_", ".")


def parse_servers(text: str, where: str) -> tuple[tuple[str, int], ...]:
    servers = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        part = part.split("://", 1)[-1]
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(where, f"expected host:port[,host:port...], got {part!r}")
        servers.append((host.strip("[]"), int(port)))
    if not servers:
        raise ConfigError(where, "at least one host:port is required")
    return tuple(servers)


def parse_jaas(text: str) -> dict[str, str]:
    """username/password options of a JAAS line such as
    ``org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p";``"""
    return {k: v.replace('\\"', '"') for k, v in _JAAS_OPTION.findall(text)}


def _milliseconds(props: Mapping[str, str], prop: str, default: int, name_of: Callable[[str], str]) -> int:
    text = props.get(prop)
    if text is None:
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigError(name_of(prop), f"expected milliseconds, got {text!r}") from None
    if not 1 <= value <= 2**31 - 1:
        raise ConfigError(name_of(prop), f"must be between 1 and {2**31 - 1} ms, got {value}")
    return value


def parse_upstream(env: Mapping[str, str], file_section: Mapping[str, Any]) -> UpstreamSettings:
    """Upstream settings from the YAML ``kafka`` section, overridden by ``KAFKA_*`` variables."""
    props: dict[str, str] = {}
    where: dict[str, str] = {}
    for key, value in file_section.items():
        props[str(key)] = str(value)
        where[str(key)] = f"kafka.{key}"
    for name, value in env.items():
        if name.startswith(KAFKA_PREFIX) and len(name) > len(KAFKA_PREFIX):
            prop = _property_name(name)
            props[prop] = value
            where[prop] = name

    def name_of(prop: str) -> str:
        return where.get(prop, KAFKA_PREFIX + prop.upper().replace(".", "_"))

    servers = parse_servers(props.get("bootstrap.servers", "127.0.0.1:9092"), name_of("bootstrap.servers"))
    protocol = props.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise ConfigError(
            name_of("security.protocol"), f"expected one of {', '.join(SECURITY_PROTOCOLS)}, got {protocol!r}"
        )
    mechanism = username = password = None
    if protocol.startswith("SASL_"):
        mechanism = props.get("sasl.mechanism", "PLAIN").upper()
        if mechanism not in SASL_MECHANISMS:
            raise ConfigError(
                name_of("sasl.mechanism"), f"expected one of {', '.join(SASL_MECHANISMS)}, got {mechanism!r}"
            )
        jaas = parse_jaas(props.get("sasl.jaas.config", ""))
        username = props.get("sasl.username", jaas.get("username"))
        password = props.get("sasl.password", jaas.get("password"))
        if not username:
            raise ConfigError(
                name_of("sasl.jaas.config"), "SASL needs a username (sasl.jaas.config or KAFKA_SASL_USERNAME)"
            )
        if password is None:
            raise ConfigError(
                name_of("sasl.jaas.config"), "SASL needs a password (sasl.jaas.config or KAFKA_SASL_PASSWORD)"
            )
    check = props.get("ssl.endpoint.identification.algorithm", "https").strip().lower()
    heartbeat = _milliseconds(props, "heartbeat.interval.ms", 3000, name_of)
    session = _milliseconds(props, "session.timeout.ms", 45000, name_of)
    if heartbeat >= session:
        raise ConfigError(
            name_of("heartbeat.interval.ms"),
            f"must be lower than the session timeout ({name_of('session.timeout.ms')}={session}), got {heartbeat}",
        )
    return UpstreamSettings(
        bootstrap_servers=servers,
        security_protocol=protocol,
        sasl_mechanism=mechanism,
        sasl_username=username,
        sasl_password=password,
        ssl_ca_location=props.get("ssl.ca.location"),
        ssl_certificate_location=props.get("ssl.certificate.location"),
        ssl_key_location=props.get("ssl.key.location"),
        ssl_key_password=props.get("ssl.key.password"),
        ssl_check_hostname=check not in ("", "none"),
        heartbeat_interval_ms=heartbeat,
        session_timeout_ms=session,
        properties=props,
    )
