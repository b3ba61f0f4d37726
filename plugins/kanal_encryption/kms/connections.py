"""KMS external connections, declared once at startup with environment variables::

    GATEWAY_EXTERNAL_CONNECTION_<NAME>_TYPE=VAULT | AWS_KMS | AZURE_KEY_VAULT | GCP_KMS
    GATEWAY_EXTERNAL_CONNECTION_<NAME>_CONFIG_<PROPERTY>=<value>

``<NAME>`` is how encryption interceptors refer to the connection (``kmsConnectionName``), compared
without case and with every character other than a letter or digit read as ``_``. Properties are in
:data:`PROPERTIES` (documented in the operator page on encryption KMS). Every value may hold
``${VAR}`` / ``${VAR|default}`` placeholders.

A connection of one of these types with a missing, unknown (the closest is named), renamed (Vault's
``ENGINE`` and ``MOUNT``) or malformed property stops the gateway, naming the variable. Without
``TYPE``, a connection is read as a KMS one only when its properties are clearly one type's (a Vault
``URI``, an Azure ``VAULT_URL``...); otherwise it is left to the other plugins (schema registries),
and the gateway refuses it only if none reads it, with this plugin's hints.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from difflib import get_close_matches
from typing import Final

from kanal.api import (
    EXTERNAL_CONNECTION_PREFIX,
    ConfigError,
    ExternalConnection,
    FamilyCheck,
    Hint,
    expand_placeholders,
    external_connections,
)
from kanal_encryption.kms.aws import AwsSettings
from kanal_encryption.kms.azure import DEFAULT_AUTHORITY, AzureSettings
from kanal_encryption.kms.factory import KmsClient, KmsSettings, build
from kanal_encryption.kms.gcp import DEFAULT_ENDPOINT, GcpSettings, read_service_account
from kanal_encryption.kms.vault_client import AUTH_TYPES, VaultAuth, VaultSettings

__all__ = [
    "ENGINE_TYPES",
    "PREFIX",
    "PROPERTIES",
    "RENAMED",
    "TYPES",
    "KmsConnection",
    "check_kms_connections",
    "normalize",
    "parse_kms_connections",
]

PREFIX: Final = EXTERNAL_CONNECTION_PREFIX
VAULT: Final = "VAULT"
AWS_KMS: Final = "AWS_KMS"
AZURE_KEY_VAULT: Final = "AZURE_KEY_VAULT"
GCP_KMS: Final = "GCP_KMS"
TYPES: Final = (VAULT, AWS_KMS, AZURE_KEY_VAULT, GCP_KMS)
ENGINE_TYPES: Final = ("TRANSIT", "TRANSFORM")

#: The properties of each connection type.
PROPERTIES: Final[Mapping[str, tuple[str, ...]]] = {
    VAULT: (
        "URI",
        "AUTH_TYPE",
        "TOKEN",
        "ROLE_ID",
        "SECRET_ID",
        "PATH",
        "USERNAME",
        "PASSWORD",
        "USERPASS_AUTH_MOUNT",
        "ROLE",
        "JWT",
        "JWT_PATH",
        "ENGINE_TYPE",
        "ENGINE_MOUNT",
        "NAMESPACE",
        "TIMEOUT_MS",
    ),
    AWS_KMS: ("REGION", "ACCESS_KEY", "SECRET_KEY", "SESSION_TOKEN", "ENDPOINT", "TIMEOUT_MS"),
    AZURE_KEY_VAULT: (
        "VAULT_URL",
        "TENANT_ID",
        "CLIENT_ID",
        "CLIENT_SECRET",
        "USERNAME",
        "PASSWORD",
        "AUTHORITY_HOST",
        "TIMEOUT_MS",
    ),
    GCP_KMS: ("CREDENTIALS_FILE", "ACCESS_TOKEN", "ENDPOINT", "KEY_RING", "TIMEOUT_MS"),
}
#: Vault properties renamed in 3.22 (old -> new): the old names stop the gateway.
RENAMED: Final = {"ENGINE": "ENGINE_TYPE", "MOUNT": "ENGINE_MOUNT"}
#: Properties that make a connection without TYPE clearly of one type.
_SIGNATURE: Final[Mapping[str, frozenset[str]]] = {
    VAULT: frozenset({"URI", "AUTH_TYPE", "ENGINE_TYPE", "ENGINE_MOUNT", *RENAMED}),
    AWS_KMS: frozenset({"REGION", "ACCESS_KEY", "SECRET_KEY"}),
    AZURE_KEY_VAULT: frozenset({"VAULT_URL", "TENANT_ID", "CLIENT_ID"}),
    GCP_KMS: frozenset({"CREDENTIALS_FILE", "KEY_RING"}),
}
#: Vault properties each auth type uses (the others are refused: a likely mix-up).
_AUTH_PROPERTIES: Final[Mapping[str, frozenset[str]]] = {
    "TOKEN": frozenset({"TOKEN"}),
    "APP_ROLE": frozenset({"ROLE_ID", "SECRET_ID", "PATH"}),
    "USERNAME_PASSWORD": frozenset({"USERNAME", "PASSWORD", "USERPASS_AUTH_MOUNT"}),
    "KUBERNETES": frozenset({"ROLE", "JWT", "JWT_PATH", "PATH"}),
    "JWT": frozenset({"ROLE", "JWT", "JWT_PATH", "PATH"}),
}
_ALL_AUTH: Final = frozenset().union(*_AUTH_PROPERTIES.values())


def normalize(name: str) -> str:
    """The key of a connection name: upper case, any other character than a letter or digit as ``_``."""
    return re.sub(r"[^A-Z0-9]", "_", name.upper())


def _type_of(value: str) -> str:
    return value.strip().upper().replace("-", "_")


@dataclass(frozen=True)
class KmsConnection:
    """One KMS connection: its name as written, its type and the settings of that type."""

    name: str
    type: str
    settings: KmsSettings = field(repr=False)
    #: Vault only: TRANSIT (wrap keys) or TRANSFORM (tokenization, key ids are role names).
    engine: str = "TRANSIT"

    @property
    def kind(self) -> str:
        """The scheme of the inline key ids of the same KMS (``vault-kms``, ``aws-kms``...)."""
        if self.type == VAULT:
            return "vault-transform" if self.engine == "TRANSFORM" else "vault-kms"
        return {AWS_KMS: "aws-kms", AZURE_KEY_VAULT: "azure-kms", GCP_KMS: "gcp-kms"}[self.type]

    def build(self) -> KmsClient:
        """A new client of this connection (a VaultTransform for ENGINE_TYPE=TRANSFORM; the caller
        closes it with ``aclose``)."""
        return build(self.kind, self.settings)


def _kms_type(connection: ExternalConnection) -> str | None:
    """A connection's KMS type, or None when it is not (clearly) a KMS connection."""
    if connection.type is not None:
        declared = _type_of(connection.type[0])
        return declared if declared in TYPES else None
    names = set(connection.props)
    if "URL" in names:  # a schema registry's
        return None
    matches = [
        t for t in TYPES if names & _SIGNATURE[t] and names <= {*PROPERTIES[t], *(RENAMED if t == VAULT else ())}
    ]
    return matches[0] if len(matches) == 1 else None


def check_kms_connections(env: Mapping[str, str]) -> FamilyCheck:
    """The startup check of ``GATEWAY_EXTERNAL_CONNECTION_*`` for the plugin's ``kanal_settings``
    family: KMS connections are parsed (ConfigError naming the variable) and read; the others may be
    another plugin's, so they only get hints (the KMS types and properties)."""
    parse_kms_connections(env)
    declared, malformed = external_connections(env)
    every = sorted({p for props in PROPERTIES.values() for p in props})
    read: list[str] = []
    hints: dict[str, Hint] = {}
    for name, connection in declared.items():
        if _kms_type(connection) is not None:
            read.extend(connection.variables)
            continue
        if connection.type is not None:
            hints[connection.type[1]] = Hint(values=TYPES, what="external connection type")
        for prop, (_, variable) in connection.props.items():
            if prop not in every:
                hints[variable] = Hint(names=[f"{PREFIX}{name}_CONFIG_{p}" for p in every])
    for variable in malformed:
        rest = variable[len(PREFIX) :]
        names = {rest[:i] for i, c in enumerate(rest) if c == "_"} | {rest}
        suffixes = ("_TYPE", *(f"_CONFIG_{p}" for p in every))
        hints[variable] = Hint(names=[f"{PREFIX}{n}{s}" for n in names for s in suffixes])
    return FamilyCheck(read=read, hints=hints)


class _Props:
    """The expanded properties of one connection, read one by one with errors naming the variable."""

    def __init__(self, name: str, kind: str, declared: ExternalConnection, env: Mapping[str, str]) -> None:
        self.name, self.kind = name, kind
        self.values: dict[str, str] = {}
        for prop, (value, variable) in declared.props.items():
            if prop in RENAMED and kind == VAULT:
                raise ConfigError(
                    variable,
                    f"{prop} was renamed: write {self.variable(RENAMED[prop])} instead (the old name is not read)",
                )
            known = PROPERTIES[kind]
            if prop not in known:
                close = get_close_matches(prop, known, n=1)
                raise ConfigError(
                    variable,
                    f"unknown {kind} connection property {prop}"
                    + (f" (did you mean {close[0]}?)" if close else "")
                    + f"; known: {', '.join(known)}",
                )
            self.values[prop] = str(expand_placeholders(value, env, variable))

    def variable(self, prop: str) -> str:
        return f"{PREFIX}{self.name}_CONFIG_{prop}"

    def get(self, prop: str, default: str | None = None) -> str | None:
        value = self.values.get(prop, "")
        return value if value != "" else default

    def require(self, prop: str, why: str) -> str:
        value = self.get(prop)
        if value is None:
            raise ConfigError(self.variable(prop), f"required: {why}")
        return value

    def choice(self, prop: str, allowed: tuple[str, ...], default: str) -> str:
        value = _type_of(self.get(prop, default) or default)
        if value not in allowed:
            raise ConfigError(self.variable(prop), f"expected one of {', '.join(allowed)}, got {self.get(prop)!r}")
        return value

    def url(self, prop: str, why: str, *, required: bool = True) -> str | None:
        value = self.require(prop, why) if required else self.get(prop)
        if value is not None and not value.startswith(("http://", "https://")):
            raise ConfigError(self.variable(prop), f"expected an http:// or https:// URL, got {value!r}")
        return value.rstrip("/") if value else None

    def timeout(self) -> int:
        value = self.get("TIMEOUT_MS", "10000") or "10000"
        if not value.isdigit() or int(value) <= 0:
            raise ConfigError(self.variable("TIMEOUT_MS"), f"expected a positive integer (milliseconds), got {value!r}")
        return int(value)


def _vault(p: _Props, env: Mapping[str, str]) -> tuple[KmsSettings, str]:
    uri = p.url("URI", "the Vault (or OpenBao) address, e.g. https://vault:8200")
    auth_type = p.choice("AUTH_TYPE", AUTH_TYPES, "TOKEN")
    for prop in p.values:
        if prop in _ALL_AUTH and prop not in _AUTH_PROPERTIES[auth_type]:
            users = [t for t, props in _AUTH_PROPERTIES.items() if prop in props]
            raise ConfigError(
                p.variable(prop), f"not used with AUTH_TYPE={auth_type} (it belongs to AUTH_TYPE {' or '.join(users)})"
            )
    if auth_type == "TOKEN":
        p.require("TOKEN", "the Vault token (AUTH_TYPE=TOKEN)")
    elif auth_type == "APP_ROLE":
        p.require("ROLE_ID", "the AppRole role id (AUTH_TYPE=APP_ROLE)")
        p.require("SECRET_ID", "the AppRole secret id (AUTH_TYPE=APP_ROLE)")
    elif auth_type == "USERNAME_PASSWORD":
        p.require("USERNAME", "the Vault user (AUTH_TYPE=USERNAME_PASSWORD)")
        p.require("PASSWORD", "the Vault user's password (AUTH_TYPE=USERNAME_PASSWORD)")
    else:
        p.require("ROLE", f"the Vault role to log in as (AUTH_TYPE={auth_type})")
        if auth_type == "JWT" and p.get("JWT") is None and p.get("JWT_PATH") is None:
            raise ConfigError(p.variable("JWT"), "required (or JWT_PATH, a file holding it): the JWT to log in with")
    engine = p.choice("ENGINE_TYPE", ENGINE_TYPES, "TRANSIT")
    auth = VaultAuth(
        type=auth_type,
        token=p.get("TOKEN"),
        role_id=p.get("ROLE_ID"),
        secret_id=p.get("SECRET_ID"),
        username=p.get("USERNAME"),
        password=p.get("PASSWORD"),
        role=p.get("ROLE"),
        jwt=p.get("JWT"),
        jwt_path=p.get("JWT_PATH"),
        mount=p.get("USERPASS_AUTH_MOUNT") if auth_type == "USERNAME_PASSWORD" else p.get("PATH"),
    )
    mount = (p.get("ENGINE_MOUNT") or engine.lower()).strip("/")
    settings = VaultSettings(
        uri=uri or "", auth=auth, mount=mount, namespace=p.get("NAMESPACE"), timeout_ms=p.timeout()
    )
    return settings, engine


def _aws(p: _Props, env: Mapping[str, str]) -> tuple[KmsSettings, str]:
    access, secret, session = p.get("ACCESS_KEY"), p.get("SECRET_KEY"), p.get("SESSION_TOKEN")
    if (access is None) != (secret is None):
        missing = "SECRET_KEY" if secret is None else "ACCESS_KEY"
        raise ConfigError(p.variable(missing), "required: static credentials need both ACCESS_KEY and SECRET_KEY")
    if session is not None and access is None:
        raise ConfigError(p.variable("SESSION_TOKEN"), "a session token needs ACCESS_KEY and SECRET_KEY too")
    region = p.get("REGION")
    if region is not None and not re.fullmatch(r"[a-z]{2}(-[a-z0-9]+)+-\d+", region):
        raise ConfigError(p.variable("REGION"), f"expected an AWS region such as eu-west-1, got {region!r}")
    settings = AwsSettings(
        region=region,
        access_key=access,
        secret_key=secret,
        session_token=session,
        endpoint=p.url("ENDPOINT", "", required=False),
        timeout_ms=p.timeout(),
    )
    return settings, "TRANSIT"


def _azure(p: _Props, env: Mapping[str, str]) -> tuple[KmsSettings, str]:
    vault_url = p.url("VAULT_URL", "the vault's URL, e.g. https://my-vault.vault.azure.net")
    tenant = p.require("TENANT_ID", "the Entra ID tenant of the app registration")
    client = p.require("CLIENT_ID", "the app registration's client id")
    secret, username, password = p.get("CLIENT_SECRET"), p.get("USERNAME"), p.get("PASSWORD")
    if secret is None and (username is None or password is None):
        raise ConfigError(p.variable("CLIENT_SECRET"), "required (or USERNAME and PASSWORD): the app's credentials")
    if secret is not None and (username is not None or password is not None):
        raise ConfigError(
            p.variable("USERNAME" if username else "PASSWORD"), "give CLIENT_SECRET or USERNAME and PASSWORD, not both"
        )
    settings = AzureSettings(
        vault_url=vault_url or "",
        tenant_id=tenant,
        client_id=client,
        client_secret=secret,
        username=username,
        password=password,
        authority_host=p.url("AUTHORITY_HOST", "", required=False) or DEFAULT_AUTHORITY,
        timeout_ms=p.timeout(),
    )
    return settings, "TRANSIT"


def _gcp(p: _Props, env: Mapping[str, str]) -> tuple[KmsSettings, str]:
    file, token = p.get("CREDENTIALS_FILE"), p.get("ACCESS_TOKEN")
    if file is not None and token is not None:
        raise ConfigError(p.variable("ACCESS_TOKEN"), "give CREDENTIALS_FILE or ACCESS_TOKEN, not both")
    where = p.variable("CREDENTIALS_FILE")
    if file is None and token is None:
        file = env.get("GOOGLE_APPLICATION_CREDENTIALS") or None
        where = "GOOGLE_APPLICATION_CREDENTIALS"
        if file is None:
            raise ConfigError(
                p.variable("CREDENTIALS_FILE"),
                "required (or ACCESS_TOKEN, or GOOGLE_APPLICATION_CREDENTIALS): a service account key file",
            )
    if file is not None:
        try:
            read_service_account(file)
        except ValueError as exc:
            raise ConfigError(where, str(exc)) from None
    ring = p.get("KEY_RING")
    if ring is not None and not re.fullmatch(r"projects/[^/]+/locations/[^/]+/keyRings/[^/]+", ring):
        raise ConfigError(p.variable("KEY_RING"), f"expected projects/<p>/locations/<l>/keyRings/<r>, got {ring!r}")
    settings = GcpSettings(
        credentials_file=file,
        access_token=token,
        endpoint=p.url("ENDPOINT", "", required=False) or DEFAULT_ENDPOINT,
        key_ring=ring,
        timeout_ms=p.timeout(),
    )
    return settings, "TRANSIT"


_PARSERS: Final[Mapping[str, Callable[[_Props, Mapping[str, str]], tuple[KmsSettings, str]]]] = {
    VAULT: _vault,
    AWS_KMS: _aws,
    AZURE_KEY_VAULT: _azure,
    GCP_KMS: _gcp,
}


def parse_kms_connections(env: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, KmsConnection]:
    """The KMS connections declared in ``env``, by normalized name; ConfigError (naming the variable)
    for one that cannot work. Placeholders in values are resolved with ``environ`` (default: the
    process environment and ``env``: the family check sees only the family's variables)."""
    declared, _ = external_connections(env)
    lookup: Mapping[str, str] = {**os.environ, **env} if environ is None else environ
    out: dict[str, KmsConnection] = {}
    for name in sorted(declared):
        kind = _kms_type(declared[name])
        if kind is None:
            continue
        props = _Props(name, kind, declared[name], lookup)
        settings, engine = _PARSERS[kind](props, lookup)
        out[normalize(name)] = KmsConnection(name=name, type=kind, settings=settings, engine=engine)
    return out
