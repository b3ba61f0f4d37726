"""The data-quality plugin's settings, from environment variables; every error names the variable.

The gateway refuses unknown ``GATEWAY_*`` variables, so the plugin's own variables start with
``DATA_QUALITY_``. :data:`VARIABLES` lists them all (``docs/data-quality.md`` documents each one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import yaml

from kanal.api import ConfigError

# (variable, default shown in the docs, meaning)
VARIABLES: tuple[tuple[str, str, str], ...] = (
    (
        "DATA_QUALITY_SCHEMA_REGISTRY_URL",
        "SCHEMA_REGISTRY_URL, else unset",
        "schema registry (Confluent REST API) used by EnforceAvro and to decode Avro payloads",
    ),
    (
        "DATA_QUALITY_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO",
        "SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO, else unset",
        "user:password sent to the registry",
    ),
    ("DATA_QUALITY_SCHEMA_REGISTRY_TIMEOUT", "5s", "timeout of one registry lookup"),
    ("DATA_QUALITY_SCHEMA_REGISTRY_CACHE_SIZE", "1000", "schemas kept in the cache (least recently used go first)"),
    ("DATA_QUALITY_SCHEMA_REGISTRY_NEGATIVE_TTL", "5s", "how long an unknown schema id is remembered as unknown"),
    ("DATA_QUALITY_PRIORITY", "100", "priority of the data-quality interceptor in the chain (lower runs first)"),
    (
        "DATA_QUALITY_HISTORY_TOPIC",
        "_kanal_<GATEWAY_CLUSTER_ID>_data_quality_violations",
        "topic on the backing cluster holding violation reports and count flushes",
    ),
    ("DATA_QUALITY_HISTORY_RETENTION", "7d", "retention.ms of the history topic when the gateway creates it"),
    ("DATA_QUALITY_COUNTS_FLUSH_INTERVAL", "10s", "how often a node publishes its counts (at most 60s)"),
    (
        "DATA_QUALITY_MAX_REPORTS_PER_SECOND",
        "100",
        "violation reports (history entries) per policy and node per second; extra ones are counted, not kept",
    ),
    ("DATA_QUALITY_HISTORY_MAX_ENTRIES", "10000", "history entries kept in memory per policy"),
    (
        "DATA_QUALITY_CLUSTERS",
        "none",
        "Kafka clusters without a gateway that policies may observe: YAML {name: {bootstrapServers: host:port,...}}",
    ),
    (
        "DATA_QUALITY_OBSERVER",
        "true",
        "whether this node consumes the topics of clusters without a gateway when it leads the fleet",
    ),
    (
        "DATA_QUALITY_GROUPS",
        "none",
        "groups for the Manage data quality permission: YAML {group: {members: [user], permissions: [...]}}",
    ),
    ("DATA_QUALITY_WEBHOOK_TIMEOUT", "5s", "timeout of one alert webhook POST"),
    (
        "DATA_QUALITY_HELPER_PROCESS",
        "true",
        "whether a helper process checks part of each large produced batch, on another core",
    ),
)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_BOOL = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}

MANAGE_DATA_QUALITY = "ManageDataQuality"


@dataclass(frozen=True)
class ObservedCluster:
    """A Kafka cluster without a gateway, observed by consuming its topics."""

    name: str
    bootstrap_servers: str
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Group:
    """A group of admin API users, with its permissions on the gateway cluster."""

    name: str
    members: frozenset[str]
    permissions: frozenset[str]


@dataclass(frozen=True)
class Settings:
    registry_url: str | None = None
    registry_user_info: str | None = None
    registry_timeout: float = 5.0
    registry_cache_size: int = 1000
    registry_negative_ttl: float = 5.0
    priority: int = 100
    history_topic: str | None = None
    history_retention: float = 7 * 86400.0
    flush_interval: float = 10.0
    max_reports_per_second: int = 100
    history_max_entries: int = 10_000
    clusters: Mapping[str, ObservedCluster] = field(default_factory=dict)
    observer: bool = True
    groups: Mapping[str, Group] = field(default_factory=dict)
    webhook_timeout: float = 5.0
    helper_process: bool = True


def _duration(env: Mapping[str, str], name: str, default: float, *, maximum: float | None = None) -> float:
    text = env.get(name)
    if text is None or not text.strip():
        return default
    match = _DURATION.match(text)
    if match is None:
        raise ConfigError(name, f"expected a duration such as 500ms, 5s, 1m, 7d; got {text!r}")
    value = float(match.group(1)) * _UNITS[match.group(2).lower() if match.group(2) else None]
    if value <= 0:
        raise ConfigError(name, "must be positive")
    if maximum is not None and value > maximum:
        raise ConfigError(name, f"must be at most {maximum:g}s, got {text!r}")
    return value


def _int(env: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    text = env.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(name, f"expected an integer, got {text!r}") from None
    if not lo <= value <= hi:
        raise ConfigError(name, f"must be between {lo} and {hi}, got {value}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    text = env.get(name)
    if text is None or not text.strip():
        return default
    try:
        return _BOOL[text.strip().lower()]
    except KeyError:
        raise ConfigError(name, f"expected true or false, got {text!r}") from None


def _url(name: str, text: str | None) -> str | None:
    if text is None or not text.strip():
        return None
    url = text.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(name, f"expected an http(s) URL, got {text!r}")
    return url


def _yaml(env: Mapping[str, str], name: str) -> Any:
    text = env.get(name)
    if text is None or not text.strip():
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(name, f"invalid YAML/JSON: {exc}") from None


def _clusters(env: Mapping[str, str], gateway_cluster: str) -> dict[str, ObservedCluster]:
    name = "DATA_QUALITY_CLUSTERS"
    data = _yaml(env, name)
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(name, "expected a mapping {cluster name: {bootstrapServers: host:port}}")
    out: dict[str, ObservedCluster] = {}
    for cluster, item in data.items():
        if not isinstance(cluster, str) or not cluster:
            raise ConfigError(name, f"cluster names are non-empty strings, got {cluster!r}")
        if cluster == gateway_cluster:
            raise ConfigError(name, f"{cluster}: this is the gateway's own cluster (GATEWAY_CLUSTER_ID)")
        if isinstance(item, str):
            item = {"bootstrapServers": item}
        if not isinstance(item, Mapping):
            raise ConfigError(f"{name}.{cluster}", "expected {bootstrapServers: host:port,...}")
        servers = item.get("bootstrapServers")
        if not isinstance(servers, str) or not servers.strip():
            raise ConfigError(f"{name}.{cluster}.bootstrapServers", "required, host:port[,host:port...]")
        unknown = set(item) - {"bootstrapServers", "properties"}
        if unknown:
            raise ConfigError(f"{name}.{cluster}.{sorted(unknown)[0]}", "unknown key (expected bootstrapServers)")
        props = item.get("properties") or {}
        if not isinstance(props, Mapping):
            raise ConfigError(f"{name}.{cluster}.properties", "expected a mapping")
        out[cluster] = ObservedCluster(cluster, servers.strip(), {str(k): str(v) for k, v in props.items()})
    return out


def _groups(env: Mapping[str, str]) -> dict[str, Group]:
    name = "DATA_QUALITY_GROUPS"
    data = _yaml(env, name)
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(name, "expected a mapping {group: {members: [user], permissions: [ManageDataQuality]}}")
    out: dict[str, Group] = {}
    for group, item in data.items():
        where = f"{name}.{group}"
        if not isinstance(item, Mapping):
            raise ConfigError(where, "expected {members: [...], permissions: [...]}")
        unknown = set(item) - {"members", "permissions"}
        if unknown:
            raise ConfigError(f"{where}.{sorted(unknown)[0]}", "unknown key (expected members, permissions)")
        members = item.get("members") or []
        permissions = item.get("permissions") or []
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise ConfigError(f"{where}.members", "expected a list of admin API user names")
        if not isinstance(permissions, list) or not all(isinstance(p, str) for p in permissions):
            raise ConfigError(f"{where}.permissions", "expected a list of permission names")
        bad = [p for p in permissions if p != MANAGE_DATA_QUALITY]
        if bad:
            raise ConfigError(f"{where}.permissions", f"unknown permission {bad[0]!r} (known: {MANAGE_DATA_QUALITY})")
        out[str(group)] = Group(str(group), frozenset(members), frozenset(permissions))
    return out


def load_settings(env: Mapping[str, str], gateway_cluster: str = "gateway") -> Settings:
    """Settings from the environment; raises ConfigError naming the variable at fault."""
    registry_name = (
        "DATA_QUALITY_SCHEMA_REGISTRY_URL" if env.get("DATA_QUALITY_SCHEMA_REGISTRY_URL") else "SCHEMA_REGISTRY_URL"
    )
    user_info = env.get("DATA_QUALITY_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO") or env.get(
        "SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO"
    )
    if user_info is not None and ":" not in user_info:
        raise ConfigError("DATA_QUALITY_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO", "expected user:password")
    topic = env.get("DATA_QUALITY_HISTORY_TOPIC")
    if topic is not None and not re.match(r"^[A-Za-z0-9._-]{1,249}$", topic):
        raise ConfigError("DATA_QUALITY_HISTORY_TOPIC", f"not a valid topic name: {topic!r}")
    return Settings(
        registry_url=_url(registry_name, env.get(registry_name)),
        registry_user_info=user_info or None,
        registry_timeout=_duration(env, "DATA_QUALITY_SCHEMA_REGISTRY_TIMEOUT", 5.0),
        registry_cache_size=_int(env, "DATA_QUALITY_SCHEMA_REGISTRY_CACHE_SIZE", 1000, 1, 10_000_000),
        registry_negative_ttl=_duration(env, "DATA_QUALITY_SCHEMA_REGISTRY_NEGATIVE_TTL", 5.0),
        priority=_int(env, "DATA_QUALITY_PRIORITY", 100, -(2**31), 2**31 - 1),
        history_topic=topic or None,
        history_retention=_duration(env, "DATA_QUALITY_HISTORY_RETENTION", 7 * 86400.0),
        flush_interval=_duration(env, "DATA_QUALITY_COUNTS_FLUSH_INTERVAL", 10.0, maximum=60.0),
        max_reports_per_second=_int(env, "DATA_QUALITY_MAX_REPORTS_PER_SECOND", 100, 1, 1_000_000),
        history_max_entries=_int(env, "DATA_QUALITY_HISTORY_MAX_ENTRIES", 10_000, 10, 10_000_000),
        clusters=_clusters(env, gateway_cluster),
        observer=_bool(env, "DATA_QUALITY_OBSERVER", True),
        groups=_groups(env),
        webhook_timeout=_duration(env, "DATA_QUALITY_WEBHOOK_TIMEOUT", 5.0),
        helper_process=_bool(env, "DATA_QUALITY_HELPER_PROCESS", True),
    )
