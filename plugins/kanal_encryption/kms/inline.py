"""Inline KMS configuration of an interceptor: its ``kmsConfig`` block and ``keySecretId`` URIs.

A ``keySecretId`` names the KMS and the key in one URI (the KMS's credentials come from
``kmsConfig``)::

    vault-kms://<host:port>/<mount>/keys/<key>          Vault or OpenBao transit
    vault-transform://<host:port>/<mount>/role/<role>   Vault Transform (tokenization)
    aws-kms://<key id | key ARN | alias/<name> | alias ARN>
    azure-kms://<vault>.vault.azure.net/keys/<name>[/<version>]
    gcp-kms://projects/<p>/locations/<l>/keyRings/<r>/cryptoKeys/<k>
    in-memory-kms://<key>
    gateway-kms://<key id>                              the gateway KMS (crypto shredding)

A ``gateway-kms://`` key is made by the gateway itself, per key id (free text, templates allowed),
and wrapped by the master key of ``kmsConfig.gateway`` (``masterKeyId``: any other KMS's key URI,
whose block is in the same ``kmsConfig``). It is parsed here (:func:`parse_kms_config`) and resolved
by :class:`kanal_encryption.keys.Locator`, which holds the gateway's keys topic.

Key names (a Vault key or role, an Azure key, an in-memory key) start with a letter, then letters,
digits, ``_`` and ``-``. A key id may hold ``{{...}}`` templates (``{{record.topic}}``): they are
accepted when the configuration is checked, and the caller resolves them and parses the result with
``templates=False`` before calling the KMS. Placeholders (``${VAR}``) are expanded by the gateway
before the interceptor sees its configuration.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from difflib import get_close_matches
from typing import Any, Final, NamedTuple

from kanal.api import InterceptorConfigError
from kanal_encryption.kms.aws import ARN, AwsSettings
from kanal_encryption.kms.azure import DEFAULT_AUTHORITY, AzureSettings
from kanal_encryption.kms.factory import KmsClient, KmsPool, KmsSettings
from kanal_encryption.kms.gcp import DEFAULT_ENDPOINT, GcpSettings
from kanal_encryption.kms.http import DEFAULT_TIMEOUT_MS
from kanal_encryption.kms.vault_client import AUTH_TYPES, VaultAuth, VaultSettings

__all__ = [
    "DEFAULT_KEY_TTL_MS",
    "DEFAULT_MAX_GATEWAY_KEYS",
    "GATEWAY_SCHEME",
    "SCHEMES",
    "GatewayInline",
    "InlineKmsConfig",
    "KeySecretId",
    "ResolvedKey",
    "VaultInline",
    "check_key_name",
    "parse_key_secret_id",
    "parse_kms_config",
    "resolve_key",
]

SCHEMES: Final = ("vault-kms", "vault-transform", "aws-kms", "azure-kms", "gcp-kms", "in-memory-kms")
DEFAULT_KEY_TTL_MS: Final = 3_600_000
#: The gateway KMS's scheme: its keys are resolved by the locator, not by :func:`resolve_key`.
GATEWAY_SCHEME: Final = "gateway-kms"
#: Unwrapped gateway KEKs kept in memory per interceptor, unless ``kmsConfig.gateway.maxKeys`` says.
DEFAULT_MAX_GATEWAY_KEYS: Final = 1_000_000
KEY_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
TEMPLATE: Final = re.compile(r"\{\{[^{}/]*\}\}")
_AUTHORITY: Final = re.compile(r"[A-Za-z0-9._\-\[\]:]+")
_AWS_KEY: Final = re.compile(r"(alias/[A-Za-z0-9/_-]+|[A-Za-z0-9-]+)")
_GCP_KEY: Final = re.compile(r"projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[A-Za-z0-9_-]+")
_EXAMPLES: Final = {
    "vault-kms": "vault-kms://<host:port>/<mount>/keys/<key>",
    "vault-transform": "vault-transform://<host:port>/<mount>/role/<role>",
    "aws-kms": "aws-kms://arn:aws:kms:<region>:<account>:key/<id> (or alias/<name>)",
    "azure-kms": "azure-kms://<vault>.vault.azure.net/keys/<name>/<version>",
    "gcp-kms": "gcp-kms://projects/<p>/locations/<l>/keyRings/<r>/cryptoKeys/<k>",
    "in-memory-kms": "in-memory-kms://<key>",
}


def _fail(where: str, problem: str) -> InterceptorConfigError:
    return InterceptorConfigError(f"{where}: {problem}")


def _mask(text: str, templates: bool, where: str) -> str:
    """``text`` with each template as one letter, for validation (an error if templates are refused)."""
    if not templates and "{{" in text:
        raise _fail(where, f"unresolved template in {text!r}")
    return TEMPLATE.sub("x", text)


def check_key_name(key: str, *, templates: bool = True, where: str = "keyId") -> str:
    """``key`` if it is a valid key name (templates accepted when ``templates``); else an error."""
    if not KEY_NAME.fullmatch(_mask(key, templates, where)):
        raise _fail(where, f"invalid key name {key!r}: it starts with a letter, then letters, digits, '_' or '-'")
    return key


@dataclass(frozen=True)
class KeySecretId:
    """A parsed ``keySecretId``: the KMS (``kind``, ``authority``, ``mount``) and the ``key_id`` the
    KMS is called with."""

    kind: str
    key_id: str
    authority: str = ""
    mount: str | None = None
    uri: str = ""

    @property
    def templated(self) -> bool:
        return "{{" in self.uri


def parse_key_secret_id(uri: str, *, templates: bool = True, where: str = "keySecretId") -> KeySecretId:
    """The parts of ``uri``; InterceptorConfigError (a ValueError) naming ``where`` when malformed."""
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in SCHEMES:
        close = get_close_matches(scheme, SCHEMES, n=1) if sep else []
        raise _fail(
            where,
            f"{uri!r} is not a KMS key URI"
            + (f" (did you mean {close[0]}://?)" if close else "")
            + f"; expected <kms>://<key> with <kms> one of {', '.join(SCHEMES)}",
        )
    bad = _fail(where, f"malformed {scheme} key URI {uri!r}; expected {_EXAMPLES[scheme]}")
    masked = _mask(rest, templates, where)
    parts = rest.split("/")
    masked_parts = masked.split("/")
    if len(parts) != len(masked_parts) or any(p == "" for p in masked_parts):
        raise bad
    if scheme in ("vault-kms", "vault-transform"):
        marker = "keys" if scheme == "vault-kms" else "role"
        if len(parts) < 4 or parts[-2] != marker or not _AUTHORITY.fullmatch(masked_parts[0]):
            raise bad
        key = check_key_name(parts[-1], templates=templates, where=where)
        return KeySecretId(scheme, key, authority=parts[0], mount="/".join(parts[1:-2]), uri=uri)
    if scheme == "aws-kms":
        if not (ARN.match(masked) or _AWS_KEY.fullmatch(masked)):
            raise bad
        return KeySecretId(scheme, rest, uri=uri)
    if scheme == "azure-kms":
        if len(parts) not in (3, 4) or parts[1] != "keys" or not _AUTHORITY.fullmatch(masked_parts[0]):
            raise bad
        check_key_name(parts[2], templates=templates, where=where)
        if len(parts) == 4 and not re.fullmatch(r"[A-Za-z0-9]+", masked_parts[3]):
            raise bad
        return KeySecretId(scheme, "/".join(parts[2:]), authority=parts[0], uri=uri)
    if scheme == "gcp-kms":
        if not _GCP_KEY.fullmatch(masked):
            raise bad
        return KeySecretId(scheme, rest, uri=uri)
    if len(parts) != 1:  # in-memory-kms
        raise bad
    return KeySecretId(scheme, check_key_name(rest, templates=templates, where=where), uri=uri)


@dataclass(frozen=True)
class VaultInline:
    """``kmsConfig.vault``: the address (default: ``https://`` and the key URI's host:port) and auth."""

    uri: str | None = None
    auth: VaultAuth = field(default_factory=VaultAuth)
    namespace: str | None = None
    timeout_ms: int = DEFAULT_TIMEOUT_MS


@dataclass(frozen=True)
class AzureInline:
    """``kmsConfig.azure``: credentials (the vault comes from each key URI)."""

    tenant_id: str
    client_id: str
    client_secret: str | None = field(default=None, repr=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    authority_host: str = DEFAULT_AUTHORITY
    timeout_ms: int = DEFAULT_TIMEOUT_MS


@dataclass(frozen=True)
class GatewayInline:
    """``kmsConfig.gateway``: the gateway KMS (``gateway-kms://`` keys), its KEKs wrapped by
    ``master``, a key of another KMS of the same ``kmsConfig`` (so no KMS connection is needed)."""

    master: KeySecretId
    max_keys: int = DEFAULT_MAX_GATEWAY_KEYS


@dataclass(frozen=True)
class InlineKmsConfig:
    """A parsed ``kmsConfig`` (a block per KMS used, each optional) and the DEK cache TTL."""

    vault: VaultInline | None = None
    aws: AwsSettings | None = None
    azure: AzureInline | None = None
    gcp: GcpSettings | None = None
    gateway: GatewayInline | None = None
    key_ttl_ms: int = DEFAULT_KEY_TTL_MS


class _Block:
    """One ``kmsConfig`` mapping, read key by key with errors naming the path."""

    def __init__(self, value: Any, where: str, known: tuple[str, ...]) -> None:
        if not isinstance(value, Mapping):
            raise _fail(where, f"expected an object, got {type(value).__name__}")
        for key in value:
            if key not in known:
                close = get_close_matches(str(key), known, n=1)
                raise _fail(
                    f"{where}.{key}",
                    "unknown key" + (f" (did you mean {close[0]}?)" if close else "") + f"; known: {', '.join(known)}",
                )
        self.value, self.where = value, where

    def text(self, key: str, *, required: bool = False) -> str | None:
        value = self.value.get(key)
        if value is None or value == "":
            if required:
                raise _fail(f"{self.where}.{key}", "required")
            return None
        if not isinstance(value, str | int):
            raise _fail(f"{self.where}.{key}", f"expected a string, got {type(value).__name__}")
        return str(value)

    def number(self, key: str, default: int) -> int:
        value = self.value.get(key, default)
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _fail(f"{self.where}.{key}", f"expected a non-negative integer, got {value!r}")
        return value

    def url(self, key: str) -> str | None:
        value = self.text(key)
        if value is not None and not value.startswith(("http://", "https://")):
            raise _fail(f"{self.where}.{key}", f"expected an http:// or https:// URL, got {value!r}")
        return value.rstrip("/") if value else None


_VAULT_KEYS: Final = (
    "uri",
    "version",
    "namespace",
    "type",
    "token",
    "roleId",
    "secretId",
    "path",
    "username",
    "password",
    "userpassAuthMount",
    "role",
    "jwt",
    "jwtPath",
    "timeoutMs",
)


def _vault(value: Any, where: str) -> VaultInline:
    b = _Block(value, where, _VAULT_KEYS)
    auth_type = (b.text("type") or "TOKEN").upper()
    if auth_type not in AUTH_TYPES:
        raise _fail(f"{where}.type", f"unsupported auth type {auth_type!r}; supported: {', '.join(AUTH_TYPES)}")
    required = {
        "TOKEN": ("token",),
        "APP_ROLE": ("roleId", "secretId"),
        "USERNAME_PASSWORD": ("username", "password"),
        "KUBERNETES": ("role",),
        "JWT": ("role",),
    }[auth_type]
    for key in required:
        b.text(key, required=True)
    if auth_type == "JWT" and b.text("jwt") is None and b.text("jwtPath") is None:
        raise _fail(f"{where}.jwt", "required (or jwtPath) with type JWT")
    auth = VaultAuth(
        type=auth_type,
        token=b.text("token"),
        role_id=b.text("roleId"),
        secret_id=b.text("secretId"),
        username=b.text("username"),
        password=b.text("password"),
        role=b.text("role"),
        jwt=b.text("jwt"),
        jwt_path=b.text("jwtPath"),
        mount=b.text("userpassAuthMount") if auth_type == "USERNAME_PASSWORD" else b.text("path"),
    )
    return VaultInline(
        uri=b.url("uri"), auth=auth, namespace=b.text("namespace"), timeout_ms=b.number("timeoutMs", DEFAULT_TIMEOUT_MS)
    )


def _aws(value: Any, where: str) -> AwsSettings:
    b = _Block(value, where, ("basicCredentials", "sessionCredentials", "region", "endpoint", "timeoutMs"))
    basic, session = b.value.get("basicCredentials"), b.value.get("sessionCredentials")
    if basic is not None and session is not None:
        raise _fail(where, "give basicCredentials or sessionCredentials, not both")
    access = secret = token = None
    if basic is not None:
        c = _Block(basic, f"{where}.basicCredentials", ("accessKey", "secretKey"))
        access, secret = c.text("accessKey", required=True), c.text("secretKey", required=True)
    elif session is not None:
        c = _Block(session, f"{where}.sessionCredentials", ("accessKey", "secretKey", "sessionToken"))
        access, secret = c.text("accessKey", required=True), c.text("secretKey", required=True)
        token = c.text("sessionToken", required=True)
    return AwsSettings(
        region=b.text("region"),
        access_key=access,
        secret_key=secret,
        session_token=token,
        endpoint=b.url("endpoint"),
        timeout_ms=b.number("timeoutMs", DEFAULT_TIMEOUT_MS),
    )


def _azure(value: Any, where: str) -> AzureInline:
    b = _Block(value, where, ("tokenCredential", "usernamePasswordCredential", "authorityHost", "timeoutMs"))
    token, user = b.value.get("tokenCredential"), b.value.get("usernamePasswordCredential")
    if (token is None) == (user is None):
        raise _fail(where, "give tokenCredential {clientId, tenantId, clientSecret} or usernamePasswordCredential")
    if token is not None:
        c = _Block(token, f"{where}.tokenCredential", ("clientId", "tenantId", "clientSecret"))
        secret, username, password = c.text("clientSecret", required=True), None, None
    else:
        c = _Block(user, f"{where}.usernamePasswordCredential", ("clientId", "tenantId", "username", "password"))
        secret, username = None, c.text("username", required=True)
        password = c.text("password", required=True)
    return AzureInline(
        tenant_id=c.text("tenantId", required=True) or "",
        client_id=c.text("clientId", required=True) or "",
        client_secret=secret,
        username=username,
        password=password,
        authority_host=b.url("authorityHost") or DEFAULT_AUTHORITY,
        timeout_ms=b.number("timeoutMs", DEFAULT_TIMEOUT_MS),
    )


def _gcp(value: Any, where: str) -> GcpSettings:
    b = _Block(value, where, ("serviceAccountCredentialsFilePath", "accessToken", "endpoint", "timeoutMs"))
    file, token = b.text("serviceAccountCredentialsFilePath"), b.text("accessToken")
    if file is not None and token is not None:
        raise _fail(where, "give serviceAccountCredentialsFilePath or accessToken, not both")
    return GcpSettings(
        credentials_file=file,
        access_token=token,
        endpoint=b.url("endpoint") or DEFAULT_ENDPOINT,
        timeout_ms=b.number("timeoutMs", DEFAULT_TIMEOUT_MS),
    )


def _gateway(value: Any, where: str) -> GatewayInline:
    """``kmsConfig.gateway``; its master's KMS block is checked by :func:`parse_kms_config`."""
    b = _Block(value, where, ("masterKeyId", "maxKeys"))
    uri = b.text("masterKeyId", required=True) or ""
    at = f"{where}.masterKeyId"
    if uri.startswith(f"{GATEWAY_SCHEME}://"):
        raise _fail(at, f"{uri!r}: the gateway KMS's master key is a key of another KMS, not a gateway one")
    if "://" not in uri:
        raise _fail(
            at,
            f"{uri!r} is not a KMS key URI: inline, the master key is named by its URI "
            f"({_EXAMPLES['vault-kms']}, {_EXAMPLES['aws-kms']}...); a bare key name of a KMS "
            "connection goes in the gateway block beside kmsConnectionName",
        )
    master = parse_key_secret_id(uri, templates=False, where=at)
    if master.kind == "vault-transform":
        raise _fail(at, f"{uri!r} is a Transform (tokenization) role, not a key that can wrap keys")
    max_keys = b.number("maxKeys", DEFAULT_MAX_GATEWAY_KEYS)
    if max_keys < 1:
        raise _fail(f"{where}.maxKeys", f"expected a positive number, got {max_keys}")
    return GatewayInline(master, max_keys)


def parse_kms_config(config: Mapping[str, Any] | None, where: str = "kmsConfig") -> InlineKmsConfig:
    """The parsed ``kmsConfig`` (None or empty: defaults); InterceptorConfigError naming the key."""
    if not config:
        return InlineKmsConfig()
    b = _Block(config, where, ("vault", "aws", "azure", "gcp", "gateway", "keyTtlMs"))
    value = b.value
    parsed = InlineKmsConfig(
        vault=_vault(value["vault"], f"{where}.vault") if value.get("vault") is not None else None,
        aws=_aws(value["aws"], f"{where}.aws") if value.get("aws") is not None else None,
        azure=_azure(value["azure"], f"{where}.azure") if value.get("azure") is not None else None,
        gcp=_gcp(value["gcp"], f"{where}.gcp") if value.get("gcp") is not None else None,
        gateway=_gateway(value["gateway"], f"{where}.gateway") if value.get("gateway") is not None else None,
        key_ttl_ms=b.number("keyTtlMs", DEFAULT_KEY_TTL_MS),
    )
    if parsed.gateway is not None:  # the master's KMS block must be here too (refused now, not per record)
        settings_for(parsed.gateway.master, parsed, f"{where}.gateway.masterKeyId")
    return parsed


class ResolvedKey(NamedTuple):
    """The KMS client of a key and the key id to call it with (a role for a VaultTransform)."""

    kms: KmsClient
    key_id: str


def settings_for(key: KeySecretId, config: InlineKmsConfig, where: str = "keySecretId") -> KmsSettings:
    """The settings of the KMS ``key`` lives in, from ``config``; an error when its block is missing."""
    if key.kind in ("vault-kms", "vault-transform"):
        if config.vault is None:
            raise _fail(where, f"{key.uri!r} needs a kmsConfig.vault block (its address and auth)")
        vault = config.vault
        return VaultSettings(
            uri=vault.uri or f"https://{key.authority}",
            auth=vault.auth,
            mount=key.mount or ("transit" if key.kind == "vault-kms" else "transform"),
            namespace=vault.namespace,
            timeout_ms=vault.timeout_ms,
        )
    if key.kind == "aws-kms":
        return config.aws or AwsSettings()  # no block: botocore's default credential chain
    if key.kind == "azure-kms":
        if config.azure is None:
            raise _fail(where, f"{key.uri!r} needs a kmsConfig.azure block (tokenCredential)")
        a = config.azure
        return AzureSettings(
            vault_url=f"https://{key.authority}",
            tenant_id=a.tenant_id,
            client_id=a.client_id,
            client_secret=a.client_secret,
            username=a.username,
            password=a.password,
            authority_host=a.authority_host,
            timeout_ms=a.timeout_ms,
        )
    if key.kind == "gcp-kms":
        if config.gcp is not None:
            return config.gcp
        file = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        if not file:
            raise _fail(where, f"{key.uri!r} needs a kmsConfig.gcp block or GOOGLE_APPLICATION_CREDENTIALS")
        return GcpSettings(credentials_file=file)
    return None  # in-memory


def resolve_key(
    uri: str | KeySecretId, config: InlineKmsConfig, pool: KmsPool, *, where: str = "keySecretId"
) -> ResolvedKey:
    """The client (shared through ``pool`` per KMS and credentials) and key id of a resolved
    ``keySecretId`` (no templates left)."""
    key = uri if isinstance(uri, KeySecretId) else parse_key_secret_id(uri, templates=False, where=where)
    return ResolvedKey(pool.get(key.kind, settings_for(key, config, where)), key.key_id)
