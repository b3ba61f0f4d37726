"""The ``GatewayServiceAccount`` resource kind and the minting of gateway tokens.

A GatewayServiceAccount manifest::

    apiVersion: gateway/v2
    kind: GatewayServiceAccount
    metadata:
      name: orders-app           # with vCluster, the identity of the account
      vCluster: tenant-a         # optional; absent = not in a virtual cluster
    spec:
      type: LOCAL                # LOCAL: authenticates with tokens from POST /gateway/v2/token
                                 # EXTERNAL: a name for a principal vouched for elsewhere (OAuth, mTLS)
      externalNames: [...]       # EXTERNAL only, at least one; each belongs to one account

Applying the stored set replaces the gateway's :class:`~kanal.identity.accounts.ServiceAccounts`
(``gateway.service_accounts``), which the listener reads on every authentication.

``POST /gateway/v2/token`` with ``{username, vCluster?, lifeTimeSeconds}`` answers ``{token}``: an
HS256 token for a LOCAL account, signed with GATEWAY_USER_POOL_SECRET_KEY. There is no default key:
without the setting no token is minted, since a key anyone can read lets anyone forge tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kanal.api.resources import (
    READY,
    Key,
    Manifest,
    ResourceError,
    ResourceKind,
    StateView,
    Status,
    check_envelope,
    envelope,
    invalid,
)
from kanal.identity import tokens
from kanal.identity.accounts import (
    USER_POOL_SECRET_ENV,
    AccountType,
    ServiceAccount,
    ServiceAccounts,
    describe,
    user_pool_secret,
)

if TYPE_CHECKING:
    pass

KIND = "GatewayServiceAccount"
#: The longest token lifetime (about 68 years): past it the expiry, in milliseconds, would no longer
#: fit the 64-bit session lifetime that Kafka's SaslAuthenticate answer carries.
MAX_LIFETIME_SECONDS = 2**31 - 1

SPEC_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "required": ["type"],
    "additionalProperties": False,
    "properties": {
        "type": {
            "type": "string",
            "enum": ["LOCAL", "EXTERNAL"],
            "description": "LOCAL: authenticates with gateway tokens; EXTERNAL: maps external principals",
        },
        "externalNames": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "description": "EXTERNAL only, at least one: principals (OAuth sub, certificate principal) that are"
            " this account; each belongs to one account",
        },
    },
}


def account_from_manifest(manifest: Mapping[str, Any]) -> ServiceAccount:
    """The account a canonical manifest stands for."""
    metadata, spec = manifest["metadata"], manifest["spec"]
    return ServiceAccount(
        name=metadata["name"],
        vcluster=metadata.get("vCluster"),
        type=AccountType(spec["type"]),
        external_names=tuple(spec.get("externalNames") or ()),
    )


def _canonical(manifest: Any, kind: ResourceKind) -> Manifest:
    metadata, spec = check_envelope(manifest, kind)
    unknown = set(metadata) - {"name", "vCluster", "labels", "annotations"}
    if unknown:
        raise invalid(f"unknown metadata field {sorted(unknown)[0]!r} (expected name, vCluster)")
    out_meta: dict[str, Any] = {"name": metadata["name"]}
    vcluster = metadata.get("vCluster")
    if vcluster not in (None, ""):
        if not isinstance(vcluster, str):
            raise invalid("metadata.vCluster must be a string")
        out_meta["vCluster"] = vcluster
    unknown = set(spec) - {"type", "externalNames"}
    if unknown:
        raise invalid(f"unknown spec field {sorted(unknown)[0]!r} (expected type, externalNames)")
    raw_type = spec.get("type")
    if not isinstance(raw_type, str) or raw_type.upper() not in AccountType.__members__:
        raise invalid(f"spec.type is required: LOCAL or EXTERNAL, got {raw_type!r}")
    account_type = AccountType[raw_type.upper()]
    names = spec.get("externalNames")
    if names is None:
        names = []
    if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
        raise invalid("spec.externalNames must be a list of non-empty strings")
    if len(set(names)) != len(names):
        raise invalid(f"spec.externalNames lists {next(n for n in names if names.count(n) > 1)!r} twice")
    out_spec: dict[str, Any] = {"type": account_type.value}
    if account_type is AccountType.EXTERNAL:
        if not names:
            raise invalid("spec.externalNames is required for an EXTERNAL account: at least one external name")
        out_spec["externalNames"] = list(names)
    elif names:
        raise invalid("spec.externalNames is only for EXTERNAL accounts; a LOCAL account authenticates with tokens")
    return envelope(kind, out_meta, out_spec)


def service_account_kind(accounts: ServiceAccounts) -> ResourceKind:
    """The GatewayServiceAccount kind; applying it replaces ``accounts``."""

    def validate(manifest: Any, state: StateView) -> Manifest:
        canonical = _canonical(manifest, kind)
        key = kind.key_of(canonical["metadata"])
        claimed = set(canonical["spec"].get("externalNames", ()))
        for other in state.resources(KIND):
            if kind.key_of(other["metadata"]) == key:
                continue
            shared = claimed & set(other["spec"].get("externalNames") or ())
            if shared:
                raise ResourceError(
                    409,
                    "Conflict",
                    f"spec.externalNames: {sorted(shared)[0]!r} already belongs to service account"
                    f" {describe(account_from_manifest(other))}",
                )
        return canonical

    def apply(resources: Sequence[Manifest], state: StateView) -> dict[Key, Status]:
        keyed = [(kind.key_of(m["metadata"]), account_from_manifest(m)) for m in resources]
        refused = {(a.vcluster, a.name): reason for a, reason in accounts.replace(a for _, a in keyed)}
        return {
            key: Status("Failed", refused[(a.vcluster, a.name)]) if (a.vcluster, a.name) in refused else READY
            for key, a in keyed
        }

    kind = ResourceKind(
        kind=KIND,
        path="service-account",
        validate=validate,
        apply=apply,
        description="Who a client is: a LOCAL account (gateway tokens) or an EXTERNAL one (external names).",
        key_fields=("vCluster",),
        columns=(
            ("NAME", "metadata.name"),
            ("VCLUSTER", "metadata.vCluster"),
            ("TYPE", "spec.type"),
            ("EXTERNAL NAMES", "spec.externalNames"),
            ("STATUS", "status.status"),
        ),
        aliases=("service-accounts", "serviceaccount", "serviceaccounts", "sa"),
        spec_schema=SPEC_SCHEMA,
        list_filters={"vcluster": "metadata.vCluster", "type": "spec.type"},
    )
    return kind


# -- tokens ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MintedToken:
    """A token and what it is for (the audit records the latter, never the token)."""

    token: str
    account: ServiceAccount
    lifetime_seconds: int


def mint_token(accounts: ServiceAccounts, secret_key: str | None, body: Any) -> MintedToken:
    """A token for ``{username, vCluster?, lifeTimeSeconds}``, or ResourceError: 409 without
    GATEWAY_USER_POOL_SECRET_KEY or for an EXTERNAL account, 404 for an unknown one, 400 for a bad body."""
    if not isinstance(body, Mapping):
        raise invalid("the body must be a JSON object {username, vCluster, lifeTimeSeconds}")
    unknown = set(body) - {"username", "vCluster", "vcluster", "lifeTimeSeconds"}
    if unknown:
        raise invalid(f"unknown field {sorted(unknown)[0]!r} (expected username, vCluster, lifeTimeSeconds)")
    username = body.get("username")
    if not isinstance(username, str) or not username:
        raise invalid("username is required: the name of a LOCAL service account")
    vcluster = body.get("vCluster", body.get("vcluster"))
    if vcluster == "":
        vcluster = None
    if vcluster is not None and not isinstance(vcluster, str):
        raise invalid("vCluster must be a string")
    lifetime = body.get("lifeTimeSeconds")
    if isinstance(lifetime, bool) or not isinstance(lifetime, int) or not 0 < lifetime <= MAX_LIFETIME_SECONDS:
        raise invalid(
            f"lifeTimeSeconds is required: how long the token is valid, a positive integer of at most"
            f" {MAX_LIFETIME_SECONDS} seconds, got {lifetime!r}"
        )
    if not secret_key:
        raise ResourceError(
            409,
            "No user pool",
            f"{USER_POOL_SECRET_ENV} is not set: the gateway has no key to sign tokens with. Set it to base64"
            " of at least 32 random bytes on every gateway node",
        )
    account = accounts.get(username, vcluster)
    if account is None:
        where = f" in vCluster {vcluster!r}" if vcluster is not None else ""
        raise ResourceError(
            404,
            "Not found",
            f"service account {username!r}{where} does not exist: create a {KIND} with spec.type LOCAL first",
        )
    if not account.local:
        raise ResourceError(
            409,
            "Conflict",
            f"service account {describe(account)} is EXTERNAL: it authenticates with its external credential;"
            " tokens are for LOCAL accounts",
        )
    token = tokens.mint(account.name, account.vcluster, lifetime, user_pool_secret(secret_key))
    return MintedToken(token, account, lifetime)


__all__ = ["KIND", "MintedToken", "account_from_manifest", "mint_token", "service_account_kind"]
