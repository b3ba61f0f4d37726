"""Where a key lives: a KMS client and the key's id there, and the reference an envelope keeps.

An encryption config names keys one of two ways: a bare ``keyId`` of a KMS connection
(``kmsConnectionName``), or an inline ``keySecretId`` URI whose KMS's credentials are in
``kmsConfig``. The envelope keeps a reference to the key, so a decrypter finds it from the data
alone: ``connection://<NAME>/<keyId>`` for a connection's key (the connection declared on the
decrypting gateway too), the URI itself for an inline one (the decrypter's ``kmsConfig`` holding
the credentials).

With a ``gateway`` block beside ``kmsConnectionName`` (crypto shredding), a bare ``keyId`` names a
key of the gateway KMS instead (:mod:`kanal_encryption.kms.gateway`): made by the gateway per key id,
wrapped by the connection's ``gateway.masterKeyId``; the envelope keeps ``gateway-kms://<keyId>``,
which a decrypter with the same ``gateway`` block finds. Such key ids are free text (a record key,
an e-mail address...): any characters but control ones, up to 1024.

The gateway KMS also has an inline form, without a connection: ``kmsConfig.gateway.masterKeyId`` is
another KMS's key URI (its block in the same ``kmsConfig``), and fields name gateway keys with
``keySecretId: gateway-kms://<keyId>`` beside other inline URIs. Both forms are one
:class:`~kanal_encryption.kms.gateway.GatewayKms` over the gateway's keys topic, and their envelopes
keep the same ``gateway-kms://<keyId>``, so the admin API's deletion shreds either.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from kanal.api import InterceptorConfigError

from .config import GatewayBlock
from .kms.base import Kms
from .kms.connections import KmsConnection, normalize
from .kms.factory import KmsPool
from .kms.gateway import GatewayKms
from .kms.inline import GatewayInline, InlineKmsConfig, check_key_name, parse_key_secret_id, resolve_key
from .kms.keystore import GATEWAY_KMS, KeyStore

__all__ = ["CONNECTION", "GATEWAY_KMS", "KeyLocation", "Locator", "check_gateway_key_id"]

CONNECTION = "connection://"
MAX_GATEWAY_KEY_ID = 1024


def check_gateway_key_id(key_id: str, where: str = "keyId") -> str:
    """``key_id`` if it can name a gateway KMS key (templates, or a rendered one); else an error."""
    if not key_id or len(key_id) > MAX_GATEWAY_KEY_ID or any(ord(c) < 32 or ord(c) == 127 for c in key_id):
        raise InterceptorConfigError(
            f"{where}: invalid gateway key id {key_id[:80]!r}: 1 to {MAX_GATEWAY_KEY_ID} characters, no control ones"
        )
    return key_id


class KeyLocation(NamedTuple):
    kms: Kms
    key_id: str
    key_ref: str  # what the envelope keeps


class Locator:
    """Locates keys for one interceptor: its connection (if it names one) or its inline config."""

    def __init__(
        self,
        connections: Mapping[str, KmsConnection],
        pool: KmsPool,
        connection: str | None,
        inline: InlineKmsConfig | None,
        gateway: GatewayBlock | None = None,
        store: Callable[[], KeyStore] | None = None,
    ) -> None:
        self._connections = connections
        self._pool = pool
        self._connection = None if connection is None else self._named(connection, "kmsConnectionName")
        self._inline = inline
        self._located: dict[str, KeyLocation] = {}
        # the key references used: (id of a KMS, key id) -> reference, and reference -> (KMS, key id)
        self._refs: dict[tuple[int, str], str] = {}
        self._used: dict[str, tuple[Kms, str]] = {}
        self.gateway: GatewayKms | None = None
        # a bare keyId names a gateway key (the gateway block beside kmsConnectionName); otherwise
        # gateway keys, if any, are the keySecretIds gateway-kms://... (kmsConfig.gateway)
        self._bare_gateway = gateway is not None
        inline_gateway = None if inline is None else inline.gateway
        if gateway is not None and inline_gateway is not None:
            raise InterceptorConfigError(
                "gateway: the gateway KMS is set twice: keep the gateway block (beside kmsConnectionName, "
                "bare keyIds) or kmsConfig.gateway (inline, gateway-kms:// keySecretIds), not both"
            )
        if gateway is not None:
            self.gateway = self._gateway(gateway, store)
        elif inline is not None and inline_gateway is not None:
            self.gateway = self._inline_gateway(inline_gateway, inline, store)

    def _gateway(self, block: GatewayBlock, store: Callable[[], KeyStore] | None) -> GatewayKms:
        if self._connection is None:
            raise InterceptorConfigError(
                "gateway: the gateway KMS needs kmsConnectionName (the KMS connection holding gateway.masterKeyId);"
                " without a connection, put the block in kmsConfig.gateway with masterKeyId a KMS key URI"
            )
        check_key_name(block.master_key_id, templates=False, where="gateway.masterKeyId")
        if block.max_keys < 1:
            raise InterceptorConfigError(f"gateway.maxKeys: expected a positive number, got {block.max_keys}")
        master = self._pool.get(self._connection.kind, self._connection.settings)
        assert isinstance(master, Kms)
        master_ref = f"{CONNECTION}{normalize(self._connection.name)}/{block.master_key_id}"
        keys = _keystore(store, "gateway")
        return GatewayKms(keys, master, block.master_key_id, master_ref=master_ref, max_keys=block.max_keys)

    def _inline_gateway(
        self, block: GatewayInline, inline: InlineKmsConfig, store: Callable[[], KeyStore] | None
    ) -> GatewayKms:
        """The gateway KMS of ``kmsConfig.gateway``: its master is an inline key (the KMS block was
        checked with the config), recorded in the keys topic by its URI."""
        master, key_id = resolve_key(block.master, inline, self._pool, where="kmsConfig.gateway.masterKeyId")
        if not isinstance(master, Kms):  # (parse_kms_config refuses Transform roles already)
            raise InterceptorConfigError(f"kmsConfig.gateway.masterKeyId: {block.master.uri!r} cannot wrap keys")
        keys = _keystore(store, "kmsConfig.gateway")
        return GatewayKms(keys, master, key_id, master_ref=block.master.uri, max_keys=block.max_keys)

    def _named(self, name: str, where: str) -> KmsConnection:
        found = self._connections.get(normalize(name))
        if found is None:
            known = ", ".join(sorted(c.name for c in self._connections.values())) or "none is declared"
            raise InterceptorConfigError(
                f"{where}: no KMS connection {name!r} (GATEWAY_EXTERNAL_CONNECTION_<NAME>_TYPE; known: {known})"
            )
        if found.kind == "vault-transform":
            raise InterceptorConfigError(f"{where}: {name!r} is a Transform (tokenization) connection, not a KMS")
        return found

    def check(self, key_id: str | None, key_secret_id: str | None, where: str) -> str:
        """The key text of a field or payload as configured (templates kept); InterceptorConfigError
        when it names no key, both kinds, or one the config cannot reach."""
        if self._bare_gateway:
            if key_id is None or key_secret_id is not None:
                raise InterceptorConfigError(
                    f"{where}: with a gateway block, name the key with keyId (not keySecretId)"
                )
            return check_gateway_key_id(key_id, where=f"{where}.keyId")
        if self._connection is not None:
            if key_id is None or key_secret_id is not None:
                hint = ""
                if key_secret_id is not None and key_secret_id.startswith(GATEWAY_KMS):
                    hint = "; gateway KMS keys beside a connection: the gateway block, fields naming a bare keyId"
                raise InterceptorConfigError(
                    f"{where}: with kmsConnectionName, name the key with keyId (not keySecretId){hint}"
                )
            check_key_name(key_id, where=f"{where}.keyId")
            return key_id
        if key_secret_id is None or key_id is not None:
            raise InterceptorConfigError(
                f"{where}: name the key with keySecretId (a KMS URI), or set kmsConnectionName"
            )
        if key_secret_id.startswith(GATEWAY_KMS):
            if self.gateway is None:
                raise InterceptorConfigError(
                    f"{where}.keySecretId: {key_secret_id!r} is a gateway KMS key: set kmsConfig.gateway "
                    "(masterKeyId: the KMS key URI wrapping the gateway's keys, with that KMS's block)"
                )
            check_gateway_key_id(key_secret_id[len(GATEWAY_KMS) :], where=f"{where}.keySecretId")
            return key_secret_id
        parse_key_secret_id(key_secret_id, where=f"{where}.keySecretId")
        return key_secret_id

    def locate(self, text: str) -> KeyLocation:
        """The location of a rendered key text (a bare key id of the connection, or a URI)."""
        found = self._located.get(text)
        if found is None:
            found = self._located[text] = self._locate(text)
            if len(self._located) > 100_000:  # templated per record key: keep the memory bounded
                self._located.clear()
            self._remember(found.kms, found.key_id, found.key_ref)
        return found

    def _remember(self, kms: Kms, key_id: str, key_ref: str) -> None:
        if len(self._refs) > 100_000:
            self._refs.clear()
            self._used.clear()
        self._refs[(id(kms), key_id)] = key_ref
        self._used[key_ref] = (kms, key_id)

    def ref_of(self, kms: Kms, key_id: str) -> str | None:
        """The key reference this locator gave (``locate``) or read (``find``) for ``key_id`` of ``kms``."""
        return self._refs.get((id(kms), key_id))

    def reach(self, key_ref: str) -> tuple[Kms, str] | None:
        """The KMS and key id of ``key_ref`` if this locator has used it (None otherwise): what to
        forget when that key is gone."""
        if key_ref.startswith(GATEWAY_KMS):
            return None if self.gateway is None else (self.gateway, key_ref[len(GATEWAY_KMS) :])
        return self._used.get(key_ref)

    def _locate(self, text: str) -> KeyLocation:
        if self._bare_gateway:
            assert self.gateway is not None
            check_gateway_key_id(text)
            return KeyLocation(self.gateway, text, GATEWAY_KMS + text)
        if self._connection is not None:
            check_key_name(text, templates=False, where="keyId")
            kms = self._pool.get(self._connection.kind, self._connection.settings)
            assert isinstance(kms, Kms)
            return KeyLocation(kms, text, f"{CONNECTION}{normalize(self._connection.name)}/{text}")
        if text.startswith(GATEWAY_KMS):  # (a keySecretId's scheme is never a template: check() saw it)
            if self.gateway is None:
                raise InterceptorConfigError(f"{text!r}: a gateway KMS key, and no kmsConfig.gateway to reach it with")
            key_id = check_gateway_key_id(text[len(GATEWAY_KMS) :], where="keySecretId")
            return KeyLocation(self.gateway, key_id, text)
        if self._inline is None:
            raise InterceptorConfigError(f"{text!r}: no kmsConfig to reach it with")
        kms, key_id = resolve_key(text, self._inline, self._pool)
        assert isinstance(kms, Kms)
        return KeyLocation(kms, key_id, text)

    def find(self, key_ref: str) -> tuple[Kms, str]:
        """The KMS and key id of an envelope's key reference (decrypting). Raises
        InterceptorConfigError (a ValueError) when this gateway cannot reach it."""
        found = self._find(key_ref)
        self._remember(found[0], found[1], key_ref)
        return found

    def _find(self, key_ref: str) -> tuple[Kms, str]:
        if key_ref.startswith(GATEWAY_KMS):
            if self.gateway is None:
                raise InterceptorConfigError(
                    f"{key_ref!r}: a gateway KMS key: set kmsConfig.gateway (masterKeyId: a KMS key URI), or the"
                    " gateway block (gateway.masterKeyId) and kmsConnectionName"
                )
            return self.gateway, key_ref[len(GATEWAY_KMS) :]
        if key_ref.startswith(CONNECTION):
            name, _, key_id = key_ref[len(CONNECTION) :].partition("/")
            connection = self._named(name, "the data's key")
            kms = self._pool.get(connection.kind, connection.settings)
            assert isinstance(kms, Kms)
            return kms, key_id
        if self._inline is None:
            raise InterceptorConfigError(f"{key_ref!r}: no kmsConfig to reach it with")
        kms, key_id = resolve_key(key_ref, self._inline, self._pool)
        assert isinstance(kms, Kms)
        return kms, key_id


def _keystore(store: Callable[[], KeyStore] | None, where: str) -> KeyStore:
    """The gateway's keys topic, which only a gateway (not a config check alone) has."""
    if store is None:
        raise InterceptorConfigError(f"{where}: the gateway KMS is not available here (no keys topic)")
    return store()
