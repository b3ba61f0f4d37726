"""Where a key lives: a KMS client and the key's id there, and the reference an envelope keeps.

An encryption config names keys one of two ways: a bare ``keyId`` of a KMS connection
(``kmsConnectionName``), or an inline ``keySecretId`` URI whose KMS's credentials are in
``kmsConfig``. The envelope keeps a reference to the key, so a decrypter finds it from the data
alone: ``connection://<NAME>/<keyId>`` for a connection's key (the connection declared on the
decrypting gateway too), the URI itself for an inline one (the decrypter's ``kmsConfig`` holding
the credentials).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from kanal.api import InterceptorConfigError

from .kms.base import Kms
from .kms.connections import KmsConnection, normalize
from .kms.factory import KmsPool
from .kms.inline import InlineKmsConfig, check_key_name, parse_key_secret_id, resolve_key

__all__ = ["CONNECTION", "KeyLocation", "Locator"]

CONNECTION = "connection://"


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
    ) -> None:
        self._connections = connections
        self._pool = pool
        self._connection = None if connection is None else self._named(connection, "kmsConnectionName")
        self._inline = inline
        self._located: dict[str, KeyLocation] = {}

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
        if self._connection is not None:
            if key_id is None or key_secret_id is not None:
                raise InterceptorConfigError(
                    f"{where}: with kmsConnectionName, name the key with keyId (not keySecretId)"
                )
            check_key_name(key_id, where=f"{where}.keyId")
            return key_id
        if key_secret_id is None or key_id is not None:
            raise InterceptorConfigError(
                f"{where}: name the key with keySecretId (a KMS URI), or set kmsConnectionName"
            )
        parse_key_secret_id(key_secret_id, where=f"{where}.keySecretId")
        return key_secret_id

    def locate(self, text: str) -> KeyLocation:
        """The location of a rendered key text (a bare key id of the connection, or a URI)."""
        found = self._located.get(text)
        if found is None:
            found = self._located[text] = self._locate(text)
            if len(self._located) > 100_000:  # templated per record key: keep the memory bounded
                self._located.clear()
        return found

    def _locate(self, text: str) -> KeyLocation:
        if self._connection is not None:
            check_key_name(text, templates=False, where="keyId")
            kms = self._pool.get(self._connection.kind, self._connection.settings)
            assert isinstance(kms, Kms)
            return KeyLocation(kms, text, f"{CONNECTION}{normalize(self._connection.name)}/{text}")
        if self._inline is None:
            raise InterceptorConfigError(f"{text!r}: no kmsConfig to reach it with")
        kms, key_id = resolve_key(text, self._inline, self._pool)
        assert isinstance(kms, Kms)
        return KeyLocation(kms, key_id, text)

    def find(self, key_ref: str) -> tuple[Kms, str]:
        """The KMS and key id of an envelope's key reference (decrypting). Raises
        InterceptorConfigError (a ValueError) when this gateway cannot reach it."""
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
