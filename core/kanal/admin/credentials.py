"""The ``GatewayScramCredential`` resource kind: the SCRAM-SHA-256/512 password of a LOCAL service account.

A manifest::

    apiVersion: gateway/v2
    kind: GatewayScramCredential
    metadata:
      name: orders-app           # the LOCAL service account, and the SCRAM user name its clients give
      vCluster: tenant-a         # optional: the account's virtual cluster
    spec:
      password: ...              # write-only: never stored, never shown
      mechanisms: [SCRAM-SHA-256, SCRAM-SHA-512]   # optional, both by default
      iterations: 4096           # optional, 4096 (Kafka's default) to 16384

As Kafka's AlterUserScramCredentials does, the password becomes a salt, StoredKey and ServerKey per
mechanism when the resource is validated, and only those are kept. They are kept sealed, in
``spec.sealedKeys``: encrypted (AES-256-GCM) with a key derived from GATEWAY_USER_POOL_SECRET_KEY and
bound to the name, vCluster, mechanisms and iterations. Whoever reads the state topic or the API sees
the mechanisms and iterations; they cannot try passwords offline against StoredKey, nor pose as the
gateway with ServerKey. The output of a GET can be PUT back unchanged (NOT_CHANGED); applying the same
password again is NOT_CHANGED too (it is checked against the stored salts), so ``kanal apply`` is
idempotent. Changing GATEWAY_USER_POOL_SECRET_KEY makes the sealed keys unreadable, as it makes the
gateway tokens invalid: the credentials report Failed until their passwords are applied again.

A SCRAM client sends only a user name, so the name belongs to one account: a second credential with
the same name in another vCluster is refused. The LOCAL account must exist when the credential is
applied (apply the account first, e.g. earlier in the same file) and when a client logs in: deleting
the account or the credential stops new logins.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from kanal.admin.identity import KIND as SERVICE_ACCOUNT
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
from kanal.identity.accounts import USER_POOL_SECRET_ENV, user_pool_secret
from kanal.identity.scram_credentials import DEFAULT_ITERATIONS, derive, from_dict, matches, to_dict
from kanal.protocol.sasl_mechanisms import SCRAM_HASHES, SCRAM_MAX_ITERATIONS, SCRAM_MIN_ITERATIONS, ScramCredential

if TYPE_CHECKING:
    from kanal.admin.host import GatewayHost

KIND = "GatewayScramCredential"
MECHANISMS = tuple(SCRAM_HASHES)  # canonical order: SCRAM-SHA-256, SCRAM-SHA-512
SEALED_PREFIX = "v1."
_SEALING_INFO = b"kanal GatewayScramCredential sealing key v1"
_NONCE_BYTES = 12

SPEC_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "password": {
            "type": "string",
            "minLength": 1,
            "writeOnly": True,
            "description": "The password clients log in with. Turned into salted keys when applied; never stored"
            " or shown. Required unless sealedKeys (from a GET) is given.",
        },
        "mechanisms": {
            "type": "array",
            "items": {"type": "string", "enum": list(MECHANISMS)},
            "description": "The SCRAM mechanisms the password works with (default: both).",
        },
        "iterations": {
            "type": "integer",
            "minimum": SCRAM_MIN_ITERATIONS,
            "maximum": SCRAM_MAX_ITERATIONS,
            "description": f"PBKDF2 iterations (default {DEFAULT_ITERATIONS}, as Kafka).",
        },
        "sealedKeys": {
            "type": "string",
            "description": "Written by the gateway: the salted keys, encrypted with a key derived from"
            f" {USER_POOL_SECRET_ENV}. Accepted back unchanged; ignored when a password is given.",
        },
    },
}


# -- sealing --------------------------------------------------------------------------------------


def _sealing_key(secret: bytes) -> AESGCM:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_SEALING_INFO).derive(secret)
    return AESGCM(key)


def _bound_to(name: str, vcluster: str | None, mechanisms: Sequence[str], iterations: int) -> bytes:
    """What a sealed value belongs to (authenticated, not encrypted): it cannot move to another
    credential, nor keep its keys under other settings."""
    return orjson.dumps([KIND, name, vcluster, list(mechanisms), iterations])


def seal(
    credentials: Mapping[str, ScramCredential], name: str, vcluster: str | None, iterations: int, secret: bytes
) -> str:
    """The ``sealedKeys`` text of ``credentials`` (mechanism -> credential) for one resource."""
    mechanisms = [m for m in MECHANISMS if m in credentials]
    plain = orjson.dumps({m: to_dict(credentials[m], m) for m in mechanisms})
    nonce = secrets.token_bytes(_NONCE_BYTES)
    sealed = _sealing_key(secret).encrypt(nonce, plain, _bound_to(name, vcluster, mechanisms, iterations))
    return SEALED_PREFIX + base64.b64encode(nonce + sealed).decode()


def unseal(
    text: Any, name: str, vcluster: str | None, mechanisms: Sequence[str], iterations: int, secret: bytes
) -> dict[str, ScramCredential]:
    """The credentials a ``sealedKeys`` text holds; ValueError when it is not one sealed for this
    resource with this secret."""
    if not isinstance(text, str) or not text.startswith(SEALED_PREFIX):
        raise ValueError("not a sealed value of this gateway")
    try:
        raw = base64.b64decode(text[len(SEALED_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not base64") from None
    if len(raw) <= _NONCE_BYTES:
        raise ValueError("too short")
    try:
        plain = _sealing_key(secret).decrypt(
            raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], _bound_to(name, vcluster, mechanisms, iterations)
        )
    except InvalidTag:
        raise ValueError(f"sealed for another resource, other settings or another {USER_POOL_SECRET_ENV}") from None
    data = orjson.loads(plain)
    out: dict[str, ScramCredential] = {}
    for mechanism in mechanisms:
        found, credential = from_dict(data.get(mechanism))
        if found != mechanism or credential.iterations != iterations:
            raise ValueError(f"the sealed {mechanism} keys do not match the resource")
        out[mechanism] = credential
    return out


# -- validation -----------------------------------------------------------------------------------


def _iterations(spec: Mapping[str, Any]) -> int:
    iterations = spec.get("iterations", DEFAULT_ITERATIONS)
    if (
        isinstance(iterations, bool)
        or not isinstance(iterations, int)
        or not SCRAM_MIN_ITERATIONS <= iterations <= SCRAM_MAX_ITERATIONS
    ):
        raise invalid(
            f"spec.iterations must be an integer from {SCRAM_MIN_ITERATIONS} to {SCRAM_MAX_ITERATIONS}"
            f" (Kafka's bounds; default {DEFAULT_ITERATIONS}), got {iterations!r}"
        )
    return iterations


def _mechanisms(spec: Mapping[str, Any]) -> list[str]:
    given = spec.get("mechanisms", list(MECHANISMS))
    if not isinstance(given, list) or not given or not all(isinstance(m, str) for m in given):
        raise invalid(f"spec.mechanisms must be a non-empty list of {' and '.join(MECHANISMS)}")
    names = [m.strip().upper() for m in given]
    unknown = [m for m in names if m not in MECHANISMS]
    if unknown:
        raise invalid(f"spec.mechanisms: unknown mechanism {unknown[0]!r} (expected {' or '.join(MECHANISMS)})")
    if len(set(names)) != len(names):
        raise invalid(f"spec.mechanisms lists {next(m for m in names if names.count(m) > 1)!r} twice")
    return [m for m in MECHANISMS if m in names]


def _secret(secret_key: str | None) -> bytes:
    if not secret_key:
        raise ResourceError(
            409,
            "No user pool",
            f"{USER_POOL_SECRET_ENV} is not set: SCRAM credentials are for a gateway that authenticates its"
            " clients (GATEWAY_SECURITY_PROTOCOL SASL_PLAINTEXT or SASL_SSL, GATEWAY_MANAGED), whose key seals"
            " them. Set it to base64 of at least 32 random bytes on every gateway node",
        )
    return user_pool_secret(secret_key)


def _describe(name: str, vcluster: str | None) -> str:
    return repr(name) + (f" (vCluster={vcluster})" if vcluster is not None else "")


def _check_account(state: StateView, name: str, vcluster: str | None) -> None:
    for account in state.resources(SERVICE_ACCOUNT):
        metadata = account["metadata"]
        if metadata.get("name") == name and metadata.get("vCluster") == vcluster:
            if account["spec"].get("type") != "LOCAL":
                raise ResourceError(
                    409,
                    "Conflict",
                    f"service account {_describe(name, vcluster)} is EXTERNAL: it authenticates with its external"
                    " credential; SCRAM credentials are for LOCAL accounts",
                )
            return
    raise invalid(
        f"service account {_describe(name, vcluster)} does not exist: apply a {SERVICE_ACCOUNT} with spec.type"
        " LOCAL first (e.g. earlier in the same file)"
    )


def _check_name_unique(state: StateView, name: str, vcluster: str | None) -> None:
    for other in state.resources(KIND):
        metadata = other["metadata"]
        if metadata.get("name") == name and metadata.get("vCluster") != vcluster:
            raise ResourceError(
                409,
                "Conflict",
                f"the SCRAM user name {name!r} already belongs to {_describe(name, metadata.get('vCluster'))}:"
                " a SCRAM client gives only a user name, so each name has one credential",
            )


def _unchanged(current: Manifest | None, password: str, mechanisms: list[str], iterations: int, secret: bytes) -> bool:
    """Whether the stored ``current`` already holds ``password`` with these settings."""
    if current is None:
        return False
    spec, metadata = current["spec"], current["metadata"]
    if spec.get("mechanisms") != mechanisms or spec.get("iterations") != iterations:
        return False
    try:
        stored = unseal(
            spec.get("sealedKeys"), metadata["name"], metadata.get("vCluster"), mechanisms, iterations, secret
        )
    except ValueError:
        return False
    return all(matches(password, stored[m], m) for m in mechanisms)


def scram_credential_kind(gateway: GatewayHost) -> ResourceKind:
    """The GatewayScramCredential kind; applying it replaces ``gateway.scram_credentials``."""
    credentials = gateway.scram_credentials

    def validate(manifest: Any, state: StateView) -> Manifest:
        metadata, spec = check_envelope(manifest, kind)
        unknown = set(metadata) - {"name", "vCluster", "labels", "annotations"}
        if unknown:
            raise invalid(f"unknown metadata field {sorted(unknown)[0]!r} (expected name, vCluster)")
        name = metadata["name"]
        vcluster = metadata.get("vCluster")
        if vcluster == "":
            vcluster = None
        if vcluster is not None and not isinstance(vcluster, str):
            raise invalid("metadata.vCluster must be a string")
        unknown = set(spec) - set(SPEC_SCHEMA["properties"])
        if unknown:
            raise invalid(
                f"unknown spec field {sorted(unknown)[0]!r} (expected password, mechanisms, iterations, sealedKeys)"
            )
        iterations, mechanisms = _iterations(spec), _mechanisms(spec)
        password = spec.get("password")
        if password is not None and (not isinstance(password, str) or not password):
            raise invalid("spec.password must be a non-empty string")
        if password is None and spec.get("sealedKeys") is None:
            raise invalid("spec.password is required: the password clients of this service account log in with")
        secret = _secret(gateway.settings.user_pool_secret_key)
        _check_account(state, name, vcluster)
        _check_name_unique(state, name, vcluster)
        out_meta: dict[str, Any] = {"name": name}
        if vcluster is not None:
            out_meta["vCluster"] = vcluster
        if password is not None:
            current = next((m for m in state.resources(KIND) if kind.key_of(m["metadata"]) == (name, vcluster)), None)
            if current is not None and _unchanged(current, password, mechanisms, iterations, secret):
                return envelope(kind, current["metadata"], current["spec"])
            derived = {m: derive(password, m, iterations=iterations) for m in mechanisms}
            sealed = seal(derived, name, vcluster, iterations, secret)
        else:
            try:
                unseal(spec["sealedKeys"], name, vcluster, mechanisms, iterations, secret)
            except ValueError as exc:
                raise invalid(
                    f"spec.sealedKeys cannot be used here ({exc}): give spec.password instead",
                ) from None
            sealed = spec["sealedKeys"]
        return envelope(kind, out_meta, {"mechanisms": mechanisms, "iterations": iterations, "sealedKeys": sealed})

    def apply(resources: Sequence[Manifest], state: StateView) -> dict[Key, Status]:
        secret_key = gateway.settings.user_pool_secret_key
        secret = user_pool_secret(secret_key) if secret_key else None
        statuses: dict[Key, Status] = {}
        entries: list[tuple[str, str | None, dict[str, ScramCredential]]] = []
        for manifest in resources:
            metadata, spec = manifest["metadata"], manifest["spec"]
            key = kind.key_of(metadata)
            name, vcluster = metadata["name"], metadata.get("vCluster")
            if secret is None:
                statuses[key] = Status(
                    "Failed", f"{USER_POOL_SECRET_ENV} is not set on this node: its SCRAM credentials cannot be read"
                )
                continue
            try:
                keys = unseal(spec.get("sealedKeys"), name, vcluster, spec["mechanisms"], spec["iterations"], secret)
            except (ValueError, KeyError, TypeError) as exc:
                statuses[key] = Status(
                    "Failed", f"the sealed keys cannot be read ({exc}); apply the credential again with its password"
                )
                continue
            entries.append((name, vcluster, keys))
            statuses[key] = READY
        for name, vcluster, reason in credentials.replace(entries):
            statuses[(name, vcluster)] = Status("Failed", reason)
        return statuses

    kind = ResourceKind(
        kind=KIND,
        path="scram-credential",
        validate=validate,
        apply=apply,
        description="The SCRAM-SHA-256/512 password of a LOCAL service account (stored salted and sealed).",
        key_fields=("vCluster",),
        columns=(
            ("NAME", "metadata.name"),
            ("VCLUSTER", "metadata.vCluster"),
            ("MECHANISMS", "spec.mechanisms"),
            ("ITERATIONS", "spec.iterations"),
            ("STATUS", "status.status"),
        ),
        aliases=("scram-credentials", "scramcredential", "scramcredentials", "scram"),
        spec_schema=SPEC_SCHEMA,
        list_filters={"vcluster": "metadata.vCluster"},
    )
    return kind


__all__ = ["KIND", "scram_credential_kind", "seal", "unseal"]
