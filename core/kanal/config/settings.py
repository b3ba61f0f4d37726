"""The gateway's settings: one table of every ``GATEWAY_*`` variable, parsed and validated.

Environment variables win over the YAML file. Every error names the variable (or YAML path) at
fault, so a broken config fails at startup, not at the first client.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from difflib import get_close_matches
from typing import Any

from kanal.api.errors import ConfigError
from kanal.api.interceptor import InterceptorSpec, Scope
from kanal.api.settings import FamilyCheck, Hint, SettingsFamily
from kanal.config.upstream import UpstreamSettings, parse_upstream
from kanal.config.users import AdminUser, parse_users
from kanal.identity.accounts import USER_POOL_SECRET_ENV, user_pool_secret
from kanal.identity.principal_mapping import parse_rules
from kanal.pipeline.chain import PASSTHROUGH
from kanal.protocol.framing import DEFAULT_MAX_FRAME_SIZE

GATEWAY_PREFIX = "GATEWAY_"
FEATURE_FLAG_PREFIX = "GATEWAY_FEATURE_FLAGS_"
#: The core's own feature flags (``GATEWAY_FEATURE_FLAGS_<NAME>``); plugins declare theirs.
CORE_FEATURE_FLAGS = frozenset(
    {"AUDIT", "INTERNAL_LOAD_BALANCING", "LIFECYCLE_METRICS", "TOPIC_IDS", "VALIDATE_REQUESTS"}
)

_BOOL = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def _int(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"expected an integer, got {text!r}") from None
        if not lo <= value <= hi:
            raise ValueError(f"must be between {lo} and {hi}, got {value}")
        return value

    return parse


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")
        return value

    return parse


def parse_bool(text: str) -> bool:
    try:
        return _BOOL[text.strip().lower()]
    except KeyError:
        raise ValueError(f"expected true or false, got {text!r}") from None


def _str(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text.strip()


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated list, blanks dropped."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _super_users(text: str) -> tuple[str, ...]:
    """A ';'-separated list (a certificate's name holds commas), blanks dropped."""
    return tuple(n.strip() for n in text.split(";") if n.strip())


def _mapping_rules(text: str) -> str:
    """Kafka principal mapping rules, checked now so a typo fails at startup (kept as text)."""
    parse_rules(text)
    return text.strip()


def _secret_key(text: str) -> str:
    """The base64 text of a signing key, checked to decode to a key long enough (kept as text)."""
    user_pool_secret(text)
    return text.strip()


@dataclass(frozen=True)
class Option:
    """One ``GATEWAY_*`` setting: its attribute, parser, default and meaning (for the docs)."""

    env: str
    attr: str
    parse: Callable[[str], Any]
    default: Any
    doc: str


OPTIONS: tuple[Option, ...] = (
    Option(
        "GATEWAY_PORT_START",
        "port_start",
        _int(1, 65535),
        6969,
        "First client port; port N serves broker MIN_BROKERID + (N - PORT_START).",
    ),
    Option(
        "GATEWAY_PORT_COUNT",
        "port_count",
        _int(1, 10000),
        None,
        "Number of client ports (default: broker id span + 3).",
    ),
    Option(
        "GATEWAY_MIN_BROKERID",
        "min_broker_id",
        _int(0, 2**31 - 1),
        None,
        "Broker id served on the first port (default: the smallest upstream broker id).",
    ),
    Option("GATEWAY_BIND_HOST", "bind_host", _str, "0.0.0.0", "Interface the client ports listen on."),
    Option(
        "GATEWAY_ADVERTISED_HOST",
        "advertised_host",
        _str,
        None,
        "Host announced to clients in broker addresses (default: the bind host, or this machine's name"
        " when binding all interfaces).",
    ),
    Option("GATEWAY_HTTP_PORT", "http_port", _int(0, 65535), 8888, "Admin API, health and metrics port."),
    Option(
        "GATEWAY_CLUSTER_ID",
        "cluster_id",
        _str,
        "gateway",
        "Name of this gateway cluster (names its state topics and its membership group).",
    ),
    Option(
        "GATEWAY_GROUP_ID",
        "group_id",
        _str,
        None,
        "The fleet's membership group on the backing cluster, which every node joins (default:"
        " kanal_<GATEWAY_CLUSTER_ID>-fleet); with group ACLs the gateway needs Read on it. Tuned by"
        " KAFKA_HEARTBEAT_INTERVAL_MS and KAFKA_SESSION_TIMEOUT_MS.",
    ),
    Option(
        "GATEWAY_RACK_ID",
        "rack_id",
        _str,
        None,
        "The rack (or zone) of this node, announced to the fleet in its member metadata.",
    ),
    Option(
        "GATEWAY_MAX_FRAME_SIZE",
        "max_frame_size",
        _int(1024, 2**31 - 1),
        DEFAULT_MAX_FRAME_SIZE,
        "Largest Kafka frame accepted from a client or the upstream, in bytes.",
    ),
    Option(
        "GATEWAY_MAX_IN_FLIGHT_REQUESTS",
        "max_in_flight",
        _int(1, 100000),
        1000,
        "Requests a client may have in flight before the gateway stops reading from it.",
    ),
    Option(
        "GATEWAY_UPSTREAM_CONNECT_TIMEOUT_MS",
        "upstream_connect_timeout_ms",
        _int(1, 3600000),
        10000,
        "Timeout to connect and authenticate to an upstream broker.",
    ),
    Option(
        "GATEWAY_UPSTREAM_REQUEST_TIMEOUT_MS",
        "upstream_request_timeout_ms",
        _int(1, 3600000),
        30000,
        "Longest the gateway waits for the upstream to answer a request, on top of the wait the request"
        " itself asks for (a Fetch's max wait, a JoinGroup's rebalance timeout); past it the client gets a"
        " retriable error (REQUEST_TIMED_OUT) and that upstream connection is closed.",
    ),
    Option(
        "GATEWAY_UPSTREAM_CONNECTION_POOL_TYPE",
        "upstream_pool_type",
        _choice("none", "round_robin"),
        "none",
        "NONE: each client connection has its own upstream connection. ROUND_ROBIN: client connections share"
        " GATEWAY_UPSTREAM_NUM_CONNECTION upstream connections per broker (requests that may wait at the"
        " broker, such as long-poll Fetches, and clients that authenticate to the broker keep their own).",
    ),
    Option(
        "GATEWAY_UPSTREAM_NUM_CONNECTION",
        "upstream_num_connection",
        _int(1, 1000),
        10,
        "Shared upstream connections per broker when GATEWAY_UPSTREAM_CONNECTION_POOL_TYPE is ROUND_ROBIN.",
    ),
    Option(
        "GATEWAY_HOOK_TIMEOUT_MS",
        "hook_timeout_ms",
        _int(1, 3600000),
        10000,
        "Longest an interceptor hook may take for one request, response or batch; past it the client"
        " connection is closed with a log line naming the interceptor.",
    ),
    Option(
        "GATEWAY_TLS_HANDSHAKE_TIMEOUT_MS",
        "tls_handshake_timeout_ms",
        _int(1, 3600000),
        10000,
        "Longest a client may take to complete the TLS handshake; then its connection is closed.",
    ),
    Option(
        "GATEWAY_IDLE_CONNECTION_TIMEOUT_MS",
        "idle_connection_timeout_ms",
        _int(0, 86400000),
        600000,
        "A client connection with no request in flight that sends nothing for this long is closed (0: never).",
    ),
    Option(
        "GATEWAY_SHUTDOWN_TIMEOUT_MS",
        "shutdown_timeout_ms",
        _int(0, 3600000),
        10000,
        "How long shutdown waits for in-flight requests to be answered.",
    ),
    Option(
        "GATEWAY_LOG_FORMAT",
        "log_format",
        _choice("text", "json"),
        "text",
        "text (human readable) or json (one object per line).",
    ),
    Option("GATEWAY_LOG_LEVEL", "log_level", _choice("debug", "info", "warning", "error"), "info", "Log level."),
    Option(
        "GATEWAY_SECURITY_PROTOCOL",
        "security_protocol",
        _choice("plaintext", "ssl", "sasl_plaintext", "sasl_ssl"),
        None,
        "Client listener protocol: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (clients must authenticate)."
        " Unset: the cluster's KAFKA_SECURITY_PROTOCOL (PLAINTEXT by default).",
    ),
    Option(
        "GATEWAY_SECURITY_MODE",
        "security_mode",
        _choice("gateway_managed", "kafka_managed"),
        None,
        "Who authenticates clients of a SASL listener: GATEWAY_MANAGED (the gateway, with its tokens)"
        " or KAFKA_MANAGED (the cluster: each client's SASL exchange is relayed to the broker on a"
        " connection of its own). Unset: KAFKA_MANAGED when GATEWAY_SECURITY_PROTOCOL is unset and the"
        " cluster's protocol is SASL_*, else GATEWAY_MANAGED.",
    ),
    Option(
        "GATEWAY_AUTHENTICATION_CONNECTION_MAX_REAUTH_MS",
        "max_reauth_ms",
        _int(0, 2**63 - 1),
        0,
        "Longest session of an authenticated client before it must re-authenticate (KIP-368);"
        " 0: only the credential's expiry limits it.",
    ),
    Option(
        "GATEWAY_AUTHENTICATION_MAX_FAILURES_PER_MINUTE",
        "max_failed_logins_per_minute",
        _int(0, 1_000_000),
        30,
        "Failed logins from one client host in a minute after which its logins are refused unchecked"
        " until they age out (a brute-force guard); 0: no limit.",
    ),
    Option(
        "GATEWAY_SSL_CERTIFICATE_LOCATION",
        "ssl_certificate_location",
        _str,
        None,
        "PEM certificate (chain) of the client listener.",
    ),
    Option("GATEWAY_SSL_KEY_LOCATION", "ssl_key_location", _str, None, "PEM private key of the client listener."),
    Option("GATEWAY_SSL_KEY_PASSWORD", "ssl_key_password", str, None, "Password of the private key, if encrypted."),
    Option(
        "GATEWAY_SSL_CA_LOCATION", "ssl_ca_location", _str, None, "PEM CA bundle used to verify client certificates."
    ),
    Option(
        "GATEWAY_SSL_CLIENT_AUTH",
        "ssl_client_auth",
        _choice("none", "requested", "required"),
        "none",
        "Client certificate authentication: NONE, REQUESTED or REQUIRED.",
    ),
    Option(
        "GATEWAY_SSL_PRINCIPAL_MAPPING_RULES",
        "ssl_principal_mapping_rules",
        _mapping_rules,
        "DEFAULT",
        "How a client certificate's subject becomes the principal, in Kafka's syntax"
        " (``RULE:<pattern>/<replacement>/[LU],...,DEFAULT``); DEFAULT keeps the whole subject.",
    ),
    Option(
        "GATEWAY_OAUTH_JWKS_URL",
        "oauth_jwks_url",
        _str,
        None,
        "Where the identity provider publishes its signing keys (http(s):// or file://) for OAUTHBEARER"
        " logins; unset: OAUTHBEARER is not offered.",
    ),
    Option(
        "GATEWAY_OAUTH_JWKS_REFRESH",
        "oauth_jwks_refresh_ms",
        _int(1000, 2**31 - 1),
        3600000,
        "How often the JWKS is fetched again (ms); a token with an unknown key id also triggers a fetch.",
    ),
    Option(
        "GATEWAY_OAUTH_EXPECTED_ISSUER",
        "oauth_expected_issuer",
        _str,
        None,
        "The ``iss`` a token must carry; unset: not checked.",
    ),
    Option(
        "GATEWAY_OAUTH_EXPECTED_AUDIENCES",
        "oauth_expected_audiences",
        _names,
        (),
        "Comma-separated audiences; a token's ``aud`` must name one of them. Unset: not checked.",
    ),
    Option(
        "GATEWAY_OAUTH_SUB_CLAIM_NAME",
        "oauth_sub_claim_name",
        _str,
        "sub",
        "The claim that names the principal.",
    ),
    Option(
        "GATEWAY_OAUTH_GROUPS_CLAIM_NAME",
        "oauth_groups_claim_name",
        _str,
        "groups",
        "The claim listing the principal's external groups (matched by GatewayGroup externalGroups).",
    ),
    Option(
        "GATEWAY_AUDIT_LOG_TOPIC",
        "audit_log_topic",
        _str,
        None,
        "Topic audit events are written to (default: _kanal_<GATEWAY_CLUSTER_ID>_auditlogs);"
        " GATEWAY_FEATURE_FLAGS_AUDIT=false turns the audit log off.",
    ),
    Option(
        "GATEWAY_AUDIT_LOG_RETENTION_MS",
        "audit_log_retention_ms",
        _int(-1, 2**63 - 1),
        604800000,
        "retention.ms of the audit log topic when the gateway creates it (7 days; -1: forever).",
    ),
    Option(
        USER_POOL_SECRET_ENV,
        "user_pool_secret_key",
        _secret_key,
        None,
        "Key that signs gateway tokens (POST /gateway/v2/token), base64 of at least 32 random bytes; the same"
        " on every node. Unset: no token is minted.",
    ),
    Option(
        "GATEWAY_ADMIN_API_USERS",
        "admin_api_users",
        parse_users,
        (),
        "Admin API users, a YAML/JSON list of {username, password, admin}; users without admin: true are"
        " read-only. Unset: the admin API is disabled (health and metrics are still served).",
    ),
    Option(
        "GATEWAY_ACL_ENABLED",
        "acl_enabled",
        parse_bool,
        False,
        "Whether the gateway enforces its own Kafka ACLs on the passthrough cluster (managed by super users"
        " with CreateAcls, DescribeAcls and DeleteAcls, stored in GATEWAY_ACLS_TOPIC). Off: every request"
        " goes to the cluster, which enforces its own ACLs, if any. Not with GATEWAY_SECURITY_MODE=KAFKA_MANAGED.",
    ),
    Option(
        "GATEWAY_SUPER_USERS",
        "super_users",
        _super_users,
        None,
        "Principals allowed everything when the gateway enforces ACLs, separated by ';' (certificate"
        " names hold commas); User:alice or alice. Unset: the admin API users' names.",
    ),
    Option(
        "GATEWAY_ACLS_TOPIC",
        "acls_topic",
        _str,
        None,
        "Compacted topic holding the gateway's ACLs (default: _kanal_<GATEWAY_CLUSTER_ID>_acls).",
    ),
    Option(
        "GATEWAY_RESOURCES_TOPIC",
        "resources_topic",
        _str,
        None,
        "Compacted topic holding the admin API resources (default: _kanal_<GATEWAY_CLUSTER_ID>_resources).",
    ),
    Option(
        "GATEWAY_STATE_REPLICATION_FACTOR",
        "state_replication_factor",
        _int(-1, 32767),
        -1,
        "Replication factor of the state topics the gateway creates (-1: the cluster's default).",
    ),
)
_BY_ENV = {o.env: o for o in OPTIONS}

#: Variables of earlier gateway releases that are refused at startup (spec 03, 3.22.0 breaking change
#: 4), each with what replaces it.
REMOVED: Mapping[str, str] = {
    "GATEWAY_CONSUMER_GROUP_MEMBERSHIP_TIMEOUT_MS": "KAFKA_SESSION_TIMEOUT_MS",
    "GATEWAY_CONSUMER_GROUP_POLL_INTERVAL_MS": "KAFKA_HEARTBEAT_INTERVAL_MS",
    "GATEWAY_INIT_CONSUMER_GROUP_MEMBERSHIP_TIMEOUT_MS": "KAFKA_SESSION_TIMEOUT_MS",
}


def _removed(name: str, where: str) -> None:
    replacement = REMOVED.get(name)
    if replacement is not None:
        raise ConfigError(
            where,
            f"removed: the membership group is tuned by {replacement} now (see docs/fleet.md); unset {name}",
        )


@dataclass(frozen=True)
class Settings:
    """Everything the gateway needs to start, validated."""

    port_start: int = 6969
    port_count: int | None = None
    min_broker_id: int | None = None
    bind_host: str = "0.0.0.0"
    advertised_host: str | None = None
    http_port: int = 8888
    cluster_id: str = "gateway"
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_in_flight: int = 1000
    upstream_connect_timeout_ms: int = 10000
    upstream_request_timeout_ms: int = 30000
    upstream_pool_type: str = "none"
    upstream_num_connection: int = 10
    hook_timeout_ms: int = 10000
    tls_handshake_timeout_ms: int = 10000
    idle_connection_timeout_ms: int = 600000
    shutdown_timeout_ms: int = 10000
    log_format: str = "text"
    log_level: str = "info"
    security_protocol: str = "plaintext"
    #: GATEWAY_SECURITY_PROTOCOL was unset and taken from KAFKA_SECURITY_PROTOCOL (for messages).
    security_protocol_inferred: bool = False
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: str | None = None
    ssl_ca_location: str | None = None
    ssl_client_auth: str = "none"
    security_mode: str | None = None
    max_reauth_ms: int = 0
    max_failed_logins_per_minute: int = 30
    ssl_principal_mapping_rules: str = "DEFAULT"
    oauth_jwks_url: str | None = None
    oauth_jwks_refresh_ms: int = 3600000
    oauth_expected_issuer: str | None = None
    oauth_expected_audiences: tuple[str, ...] = ()
    oauth_sub_claim_name: str = "sub"
    oauth_groups_claim_name: str = "groups"
    audit_log_topic: str | None = None
    audit_log_retention_ms: int = 604800000
    user_pool_secret_key: str | None = field(default=None, repr=False)  # a secret: never in a repr or a log
    admin_api_users: tuple[AdminUser, ...] = ()
    resources_topic: str | None = None
    acl_enabled: bool = False
    super_users: tuple[str, ...] | None = None
    acls_topic: str | None = None
    state_replication_factor: int = -1
    group_id: str | None = None
    rack_id: str | None = None
    feature_flags: Mapping[str, bool] = field(default_factory=dict)
    upstream: UpstreamSettings = field(default_factory=UpstreamSettings)
    interceptors: tuple[InterceptorSpec, ...] = ()

    def feature(self, name: str, default: bool = False) -> bool:
        """A ``GATEWAY_FEATURE_FLAGS_<NAME>`` flag (name in any case, without the prefix)."""
        return self.feature_flags.get(name.upper(), default)

    @property
    def internal_load_balancing(self) -> bool:
        """GATEWAY_FEATURE_FLAGS_INTERNAL_LOAD_BALANCING (on by default): answers spread clients over
        the fleet's live nodes; off behind an external load balancer (every answer names this node)."""
        return self.feature("internal_load_balancing", True)

    @property
    def fleet_group_id(self) -> str:
        """The membership group: GATEWAY_GROUP_ID, else ``kanal_<GATEWAY_CLUSTER_ID>-fleet``."""
        return self.group_id or f"kanal_{self.cluster_id}-fleet"


def _yaml_key_to_env(key: str) -> str:
    snake = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key)
    return GATEWAY_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", snake).upper()


def _check_mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(where, f"expected a mapping, got {type(value).__name__}")
    return value


def gateway_values(env: Mapping[str, str], file_section: Any) -> dict[str, tuple[str, str]]:
    """Raw ``GATEWAY_*`` values by variable name, from the file then the environment; each with
    the key to name in errors."""
    values: dict[str, tuple[str, str]] = {}
    for key, value in _check_mapping(file_section, "gateway").items():
        name = _yaml_key_to_env(str(key))
        _removed(name, f"gateway.{key}")
        if name.startswith(FEATURE_FLAG_PREFIX) or name in _BY_ENV:
            values[name] = (
                "" if value is None else str(value).lower() if isinstance(value, bool) else str(value),
                f"gateway.{key}",
            )
        else:
            raise ConfigError(f"gateway.{key}", _unknown_yaml_hint(str(key)))
    for name, value in env.items():
        if name.startswith(GATEWAY_PREFIX):
            values[name] = (value, name)
    return values


def _env_to_yaml_key(name: str) -> str:
    """``GATEWAY_PORT_START`` -> ``portStart``: how the config file's ``gateway`` section spells it."""
    first, *rest = name.removeprefix(GATEWAY_PREFIX).lower().split("_")
    return first + "".join(word.capitalize() for word in rest)


def _unknown_yaml_hint(key: str) -> str:
    """An unknown key of the config file's ``gateway`` section, with the closest key in YAML spelling."""
    close = get_close_matches(key, [_env_to_yaml_key(name) for name in _BY_ENV], n=1)
    return "unknown setting" + (f" (did you mean gateway.{close[0]}?)" if close else "")


def parse_interceptors(items: Any) -> tuple[InterceptorSpec, ...]:
    """Interceptor specs from the YAML ``interceptors`` list."""
    if items is None:
        return ()
    if not isinstance(items, list):
        raise ConfigError("interceptors", "expected a list")
    specs = []
    for i, item in enumerate(items):
        where = f"interceptors[{i}]"
        item = _check_mapping(item, where)
        unknown = set(item) - {"name", "plugin", "pluginClass", "priority", "scope", "config"}
        if unknown:
            raise ConfigError(
                f"{where}.{sorted(unknown)[0]}", "unknown key (expected name, plugin, priority, scope, config)"
            )
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}.name", "required, a non-empty string")
        plugin = item.get("plugin", item.get("pluginClass"))
        if not isinstance(plugin, str) or not plugin:
            raise ConfigError(f"{where}.plugin", "required, the name of an installed interceptor type")
        priority = item.get("priority", 100)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ConfigError(f"{where}.priority", f"expected an integer, got {priority!r}")
        scope = _check_mapping(item.get("scope"), f"{where}.scope")
        bad_scope = set(scope) - {"vCluster", "vcluster", "group", "username"}
        if bad_scope:
            raise ConfigError(
                f"{where}.scope.{sorted(bad_scope)[0]}", "unknown key (expected vCluster, group, username)"
            )
        if scope.get("group") is not None and scope.get("username") is not None:
            raise ConfigError(f"{where}.scope", "group and username cannot both be set")
        config = _check_mapping(item.get("config"), f"{where}.config")
        # As in the admin API: no vCluster targets clients in no virtual cluster, null every one.
        vcluster = scope.get("vCluster", scope.get("vcluster", PASSTHROUGH))
        specs.append(
            InterceptorSpec(
                name=name,
                plugin=plugin,
                priority=priority,
                scope=Scope(vcluster, scope.get("group"), scope.get("username")),
                config=dict(config),
            )
        )
    return tuple(specs)


class KnownSettings:
    """The ``GATEWAY_*`` names plugins declare (``kanal_settings``): variables, families (``GATEWAY_X_*``,
    or a :class:`~kanal.api.settings.SettingsFamily` its plugin checks) and feature flags
    (``GATEWAY_FEATURE_FLAGS_X``). Any other ``GATEWAY_*`` name fails at startup, and so does a variable
    of a checked family that none of the plugins declaring that family reads."""

    def __init__(self, declared: Iterable[str | SettingsFamily] = ()) -> None:
        names: set[str] = set()
        prefixes: set[str] = set()
        self.families: dict[str, list[Callable[[Mapping[str, str]], FamilyCheck]]] = {}
        for item in declared:
            if isinstance(item, SettingsFamily):
                if item.check is None:
                    prefixes.add(item.prefix)
                else:
                    self.families.setdefault(item.prefix, []).append(item.check)
            elif item.endswith("*"):
                prefixes.add(item.upper()[:-1])
            else:
                names.add(item.upper())
        self.flags = CORE_FEATURE_FLAGS | {
            n[len(FEATURE_FLAG_PREFIX) :] for n in names if n.startswith(FEATURE_FLAG_PREFIX)
        }
        self.prefixes = tuple(sorted(prefixes))
        self.names = {n for n in names if not n.startswith(FEATURE_FLAG_PREFIX)}

    def check_flag(self, name: str, where: str) -> str:
        flag = name[len(FEATURE_FLAG_PREFIX) :]
        if flag not in self.flags:
            close = get_close_matches(flag, sorted(self.flags), n=1)
            hint = f" (did you mean {FEATURE_FLAG_PREFIX}{close[0]}?)" if close else ""
            known = ", ".join(sorted(self.flags))
            raise ConfigError(where, f"unknown feature flag{hint}; known flags: {known}")
        return flag

    def check_other(self, name: str, where: str) -> None:
        """Accepts a declared name or a variable under a family's prefix (checked families are then
        checked as a whole by :meth:`check_families`)."""
        if name in self.names or name.startswith(self.prefixes) or name.startswith(tuple(self.families)):
            return
        families = [p + "*" for p in (*self.prefixes, *self.families)]
        close = get_close_matches(name, [*_BY_ENV, *self.names, *families], n=1)
        raise ConfigError(where, "unknown setting" + (f" (did you mean {close[0]}?)" if close else ""))

    def check_families(self, env: Mapping[str, str]) -> None:
        """Runs every plugin's check of its family on the family's variables of ``env``; a variable
        no plugin reads fails, with the closest name or value the plugins would have read there."""
        read: set[str] = set()
        hints: dict[str, list[Hint]] = {}
        family_names: set[str] = set()
        for prefix, checks in self.families.items():
            variables = {n: v for n, v in env.items() if n.startswith(prefix)}
            family_names.update(variables)
            for check in checks:
                verdict = check(variables)
                read.update(verdict.read)
                for variable, hint in verdict.hints.items():
                    hints.setdefault(variable, []).append(hint)
        accepted = read | self.names | _BY_ENV.keys()
        unread = sorted(n for n in family_names - accepted if not n.startswith(self.prefixes))
        if unread:
            raise _unread_error(unread, env, hints)


def _unread_error(unread: list[str], env: Mapping[str, str], hints: Mapping[str, list[Hint]]) -> ConfigError:
    """The error for the first variable of a family no plugin reads: a value no plugin knows first (a
    connection TYPE explains the variables around it), then a name with a close known name."""
    for name in unread:
        values = sorted({v for h in hints.get(name, ()) for v in h.values})
        if values:
            what = next(h.what for h in hints[name] if h.values)
            value = env[name]
            by_upper = {v.upper(): v for v in values}
            close = get_close_matches(value.strip().upper(), list(by_upper), n=1)
            suggestion = f" (did you mean {by_upper[close[0]]}?)" if close else ""
            return ConfigError(name, f"unknown {what} {value!r}{suggestion}; known: {', '.join(values)}")
    for name in unread:
        names = sorted({n for h in hints.get(name, ()) for n in h.names} - {name})
        close = get_close_matches(name, names, n=1)
        if close:
            return ConfigError(name, f"unknown setting (did you mean {close[0]}?)")
    return ConfigError(unread[0], "unknown setting (no plugin reads it)")


def build_settings(
    env: Mapping[str, str], document: Mapping[str, Any] | None = None, known: KnownSettings | None = None
) -> Settings:
    """Validated settings from the environment and an optional (already expanded) YAML document;
    ``known`` holds what the plugins declared (an unknown ``GATEWAY_*`` name fails, naming the
    closest known one; their checks of the families they declared run here, so a bad variable of a
    family stops the gateway at startup, not at first use)."""
    known = known or KnownSettings()
    doc = _check_mapping(document, "config file")
    unknown_sections = set(doc) - {"gateway", "kafka", "interceptors"}
    if unknown_sections:
        raise ConfigError(sorted(unknown_sections)[0], "unknown section (expected gateway, kafka, interceptors)")
    values: dict[str, Any] = {}
    flags: dict[str, bool] = {}
    for name, (raw, where) in gateway_values(env, doc.get("gateway")).items():
        if name.startswith(FEATURE_FLAG_PREFIX):
            flag = known.check_flag(name, where)
            try:
                flags[flag] = parse_bool(raw)
            except ValueError as exc:
                raise ConfigError(where, str(exc)) from None
            continue
        option = _BY_ENV.get(name)
        if option is None:
            _removed(name, where)
            known.check_other(name, where)
            continue
        try:
            values[option.attr] = option.parse(raw)
        except ValueError as exc:
            raise ConfigError(where, str(exc)) from None
    known.check_families(env)
    upstream = parse_upstream(env, _check_mapping(doc.get("kafka"), "kafka"))
    if "security_protocol" not in values:
        # As the notes describe: the clients speak what the cluster speaks, and a cluster that
        # authenticates its clients keeps doing so (KAFKA_MANAGED) unless the mode says otherwise.
        values["security_protocol"] = upstream.security_protocol.lower()
        values["security_protocol_inferred"] = True
        if upstream.uses_sasl and "security_mode" not in values:
            values["security_mode"] = "kafka_managed"
    settings = Settings(
        **values,
        feature_flags=flags,
        upstream=upstream,
        interceptors=parse_interceptors(doc.get("interceptors")),
    )
    _check_tls(settings)
    _check_security(settings)
    return settings


def _protocol_named(settings: Settings) -> str:
    """``SASL_SSL``, or ``SASL_SSL (unset, so the cluster's KAFKA_SECURITY_PROTOCOL)``, for messages."""
    protocol = settings.security_protocol.upper()
    if settings.security_protocol_inferred:
        return f"{protocol} (unset, so KAFKA_SECURITY_PROTOCOL's; set GATEWAY_SECURITY_PROTOCOL to choose)"
    return protocol


def _check_security(settings: Settings) -> None:
    """The listener's protocol and who authenticates on it (GATEWAY_SECURITY_MODE)."""
    protocol = settings.security_protocol.upper()
    sasl = protocol.startswith("SASL_")
    if settings.security_mode == "kafka_managed" and not sasl:
        raise ConfigError(
            "GATEWAY_SECURITY_MODE",
            f"KAFKA_MANAGED needs a SASL listener, but GATEWAY_SECURITY_PROTOCOL is {_protocol_named(settings)}",
        )
    if settings.acl_enabled and settings.security_mode == "kafka_managed":
        raise ConfigError(
            "GATEWAY_ACL_ENABLED",
            "the cluster enforces its own ACLs when GATEWAY_SECURITY_MODE is KAFKA_MANAGED (its clients log in"
            " to it); unset GATEWAY_ACL_ENABLED, or use GATEWAY_MANAGED for the gateway to enforce them",
        )
    if sasl and settings.security_mode != "kafka_managed" and not settings.user_pool_secret_key:
        raise ConfigError(
            USER_POOL_SECRET_ENV,
            f"required when GATEWAY_SECURITY_PROTOCOL is {_protocol_named(settings)} and GATEWAY_SECURITY_MODE is"
            " GATEWAY_MANAGED (it signs the tokens clients log in with)",
        )


def _check_tls(settings: Settings) -> None:
    if settings.security_protocol in ("ssl", "sasl_ssl"):
        for attr, env in (
            ("ssl_certificate_location", "GATEWAY_SSL_CERTIFICATE_LOCATION"),
            ("ssl_key_location", "GATEWAY_SSL_KEY_LOCATION"),
        ):
            if not getattr(settings, attr):
                raise ConfigError(env, f"required when GATEWAY_SECURITY_PROTOCOL is {_protocol_named(settings)}")
    if settings.ssl_client_auth != "none" and not settings.ssl_ca_location:
        raise ConfigError("GATEWAY_SSL_CA_LOCATION", "required when GATEWAY_SSL_CLIENT_AUTH is set")
