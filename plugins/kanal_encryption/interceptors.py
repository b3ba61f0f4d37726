"""The ``encryption`` (on produce) and ``decryption`` (on fetch) interceptor types.

Encryption is usually global (every producer's data encrypted), decryption scoped to the principals,
groups or virtual clusters allowed to read clear text: the others read ciphertext. Each interceptor
keeps its own data keys (:class:`~kanal_encryption.crypto.deks.DekManager`) and KMS clients, closed
when it is replaced or deleted.
"""

from __future__ import annotations

import logging
from typing import Any

from kanal.api import (
    ErrorCode,
    GatewayServices,
    Interceptor,
    InterceptorConfigError,
    PartitionError,
    RecordsContext,
    RecordsResult,
    hookimpl,
)

from .avro_fields import AvroSchemas, SchemaUnavailable, registry_client
from .compile import Topics, compile_plan
from .config import DecryptionConfig, EncryptionConfig, GatewayBlock
from .crypto.deks import DekManager
from .crypto.envelope import Envelope, Opener, Sealer
from .decrypt import DecryptionFailed, Selection, decrypt_batch
from .encrypt import EncryptionFailed, Plan, encrypt_batch
from .keys import Locator
from .kms.base import Kms, KmsError
from .kms.connections import normalize
from .kms.factory import KmsPool
from .kms.gateway import GatewayKms
from .kms.inline import DEFAULT_KEY_TTL_MS, InlineKmsConfig, parse_kms_config
from .kms.keystore import key_events, keystore_of
from .paths import PathError
from .runtime import runtime_of
from .targets import KEY, VALUE, Target
from .tokenize import Tokenization, tokenization_of

__all__ = ["DecryptionInterceptor", "EncryptionInterceptor"]

log = logging.getLogger("kanal_encryption")
AUDIT_TYPE = "ENCRYPTION"


class _Keys:
    """The KMS side of one interceptor: its locator, data keys and clients.

    With a ``gateway`` block its keys are the gateway KMS's (crypto shredding), in the gateway's
    keys topic. It forgets the data keys of a key that is gone (a gateway key id deleted on any
    node, or a KMS answering that a key does not exist to any interceptor of this gateway), and
    tells the others when its own KMS calls find one gone."""

    def __init__(
        self,
        services: GatewayServices,
        connection: str | None,
        kms_config: dict[str, Any] | None,
        max_records: int,
        gateway: GatewayBlock | None = None,
    ) -> None:
        self.metrics = runtime_of(services).metrics
        inline: InlineKmsConfig | None = None if kms_config is None else parse_kms_config(kms_config)
        if connection is None and inline is None:
            raise InterceptorConfigError("set kmsConnectionName (a KMS external connection) or a kmsConfig block")
        self.pool = KmsPool()
        self.locator = Locator(
            runtime_of(services).connections, self.pool, connection, inline, gateway, lambda: keystore_of(services)
        )
        ttl = inline.key_ttl_ms if inline is not None else DEFAULT_KEY_TTL_MS
        self.deks = DekManager(
            key_ttl_ms=ttl, max_records=max_records, observe=self._observed, on_key_gone=self._key_gone
        )
        self.events = key_events(services)
        self._stop_listening = self.events.listen(self._heard)

    def _observed(self, operation: str, kind: str, seconds: float, succeeded: bool) -> None:
        self.metrics.kms_calls.labels(kind, operation, "ok" if succeeded else "error").inc()
        self.metrics.kms_seconds.labels(kind, operation).observe(seconds)

    def _key_gone(self, kms: Kms, key_id: str) -> None:
        """An unwrap of this interceptor found ``key_id`` gone: every interceptor forgets it."""
        key_ref = self.locator.ref_of(kms, key_id)
        if key_ref is not None:
            self.events.publish(key_ref)

    def _heard(self, key_ref: str) -> None:
        """``key_ref`` is gone (deleted): drop what is cached of it."""
        found = self.locator.reach(key_ref)
        if found is None:
            return
        kms, key_id = found
        if isinstance(kms, GatewayKms):
            kms.forget(key_id)
        if self.deks.forget(kms, key_id):
            log.info("forgot the cached data keys of %s (the key is gone)", key_ref)

    async def aclose(self) -> None:
        self._stop_listening()
        await self.pool.aclose()


class _CryptoInterceptor(Interceptor):
    """What the encryption and decryption types share: their topics, tokenization or data keys,
    a schema registry for Avro, metrics, and closing them."""

    def __init__(
        self, config: EncryptionConfig | DecryptionConfig, services: GatewayServices, max_records: int
    ) -> None:
        super().__init__(config, services)
        self._topics = Topics(config.topic)
        self._metrics = runtime_of(services).metrics
        self._tokens = _tokenization(services, config)
        self._keys: _Keys | None = None
        if self._tokens is None:
            self._keys = _Keys(services, config.kms_connection_name, config.kms_config, max_records, config.gateway)
        self._avro = _schemas(services, config)

    async def aclose(self) -> None:
        if self._keys is not None:
            await self._keys.aclose()
        if self._tokens is not None:
            await self._tokens.aclose()
        if self._avro is not None:
            await self._avro.aclose()


class EncryptionInterceptor(_CryptoInterceptor):
    """Encrypts the configured parts of the records produced to matching topics."""

    plugin_name = "encryption"
    description = "Encrypts record values, keys, headers or JSON fields on produce (envelope encryption, a KMS)"
    config_type = EncryptionConfig

    def __init__(self, config: EncryptionConfig, services: GatewayServices) -> None:
        super().__init__(config, services, config.max_encryptions_per_dek)
        self._plan: Plan | None = None if self._keys is None else compile_plan(config, self._keys.locator)

    def wants_produce_records(self, topic: str) -> bool:
        return self._topics.matches(topic)

    @hookimpl
    async def kanal_produce_records(self, ctx: RecordsContext) -> RecordsResult:
        if not self.wants_produce_records(ctx.topic):
            return None
        records = ctx.records
        if records.has_legacy:
            return self._failed(ctx, "message format v0/v1 records cannot be encrypted", retriable=False)
        encrypted = 0
        for batch in list(records.batches):
            if batch.is_control:
                continue
            try:
                if self._tokens is not None:
                    data = await self._tokens.batch(batch, encode=True)
                else:
                    assert self._plan is not None
                    data = await encrypt_batch(
                        self._plan, ctx.topic, batch, self, self._avro, stored_topic=ctx.stored_topic
                    )
            except KmsError as exc:
                return self._failed(ctx, f"the KMS failed: {exc}", retriable=exc.retriable)
            except SchemaUnavailable as exc:
                return self._failed(ctx, str(exc), retriable=exc.retriable)
            except EncryptionFailed as exc:
                return self._failed(ctx, str(exc), retriable=False)
            except ValueError as exc:  # a key id that is not a key name; a record that does not parse
                return self._failed(ctx, str(exc), retriable=False)
            if data is not None:
                records.replace(batch, data)
                encrypted += batch.records_count
        self._metrics.encrypted.labels(self.plugin_name).inc(encrypted)
        return None

    # -- KeySource (encrypt.py)

    def sealer_now(self, target: Target, key_id: str, records: int) -> Sealer | None:
        assert self._keys is not None
        where = self._keys.locator.locate(key_id)
        sealer = self._keys.deks.sealer_now(where.kms, where.key_id, target.algorithm, records, key_ref=where.key_ref)
        self._metrics.dek_cache.labels("encrypt", "hit" if sealer is not None else "miss").inc()
        return sealer

    async def sealer(self, target: Target, key_id: str, records: int) -> Sealer:
        assert self._keys is not None
        where = self._keys.locator.locate(key_id)
        return await self._keys.deks.sealer(where.kms, where.key_id, target.algorithm, records, key_ref=where.key_ref)

    def _failed(self, ctx: RecordsContext, reason: str, *, retriable: bool) -> PartitionError:
        """The partition fails (nothing of it is stored): retriable while the KMS is away, so the
        producer's library retries and recovers when it is back."""
        self._metrics.failures.labels(self.plugin_name, "encrypt").inc()
        if self.config.enable_audit_log_on_error:
            self.services.audit(
                AUDIT_TYPE,
                ctx.connection,
                {"operation": "encrypt", "topic": ctx.topic, "partition": ctx.partition, "reason": reason},
            )
        log.warning("encryption failed for %s-%d: %s", ctx.topic, ctx.partition, reason)
        code = ErrorCode.request_timed_out if retriable else ErrorCode.invalid_record
        return PartitionError(int(code), f"encryption failed: {reason}")


class DecryptionInterceptor(_CryptoInterceptor):
    """Decrypts what it can of the records fetched from matching topics."""

    plugin_name = "decryption"
    description = "Decrypts encrypted record parts on fetch, for the clients in its scope"
    config_type = DecryptionConfig

    def __init__(self, config: DecryptionConfig, services: GatewayServices) -> None:
        super().__init__(config, services, 1)
        self._selection = Selection(
            value=_names(config.record_value_fields),
            key=_names(config.record_key_fields),
            headers=_names(config.record_header_fields),
            fail_fetch=config.error_policy == "fail_fetch",
        )
        for part, where in ((VALUE, "recordValueFields"), (KEY, "recordKeyFields")):
            try:
                self._selection.fields(part)
            except PathError as exc:
                raise InterceptorConfigError(f"{where}: {exc}") from None
        self._found: dict[str, tuple[Kms, str]] = {}

    @hookimpl
    async def kanal_fetch_records(self, ctx: RecordsContext) -> RecordsResult:
        if not self._topics.matches(ctx.topic) or ctx.records.has_legacy:
            return None
        decrypted = 0

        def failed(label: str, error: Exception) -> None:
            self._report(ctx, f"{label}: {error}")

        for batch in list(ctx.records.batches):
            if batch.is_control:
                continue
            try:
                if self._tokens is not None:
                    data = await self._tokens.batch(batch, encode=False)
                    count = batch.records_count
                else:
                    data, count = await decrypt_batch(
                        self._selection, ctx.stored_topic, batch, self, failed, self._avro
                    )
            except DecryptionFailed as exc:
                self._report(ctx, str(exc))
                return PartitionError(int(ErrorCode.resource_not_found), f"decryption failed: {exc}")
            except KmsError as exc:  # (tokens: the Transform engine refused or is away)
                self._report(ctx, f"detokenization failed: {exc}")
                if self._selection.fail_fetch:
                    return PartitionError(int(ErrorCode.resource_not_found), f"detokenization failed: {exc}")
                continue
            if data is not None:
                ctx.records.replace(batch, data)
                decrypted += count
        if decrypted:
            self._metrics.decrypted.labels(self.plugin_name).inc(decrypted)
        return None

    # -- OpenerSource (decrypt.py)

    def _find(self, envelope: Envelope) -> tuple[Kms, str]:
        found = self._found.get(envelope.key_ref)
        if found is None:
            if len(self._found) > 100_000:
                self._found.clear()
            assert self._keys is not None
            found = self._found[envelope.key_ref] = self._keys.locator.find(envelope.key_ref)
        return found

    def opener_now(self, envelope: Envelope) -> Opener | None:
        """(Called once per data key per batch: the batch keeps what it found.)"""
        kms, key_id = self._find(envelope)
        assert self._keys is not None
        opener = self._keys.deks.opener_now(kms, key_id, envelope.edek)
        self._metrics.dek_cache.labels("decrypt", "hit" if opener is not None else "miss").inc()
        return opener

    async def opener(self, envelope: Envelope) -> Opener:
        kms, key_id = self._find(envelope)
        assert self._keys is not None
        return await self._keys.deks.opener(kms, key_id, envelope.edek)

    def _report(self, ctx: RecordsContext, reason: str) -> None:
        self._metrics.failures.labels(self.plugin_name, "decrypt").inc()
        if self.config.enable_audit_log_on_error:
            self.services.audit(
                AUDIT_TYPE,
                ctx.connection,
                {"operation": "decrypt", "topic": ctx.topic, "partition": ctx.partition, "reason": reason},
            )


def _tokenization(services: GatewayServices, config: EncryptionConfig | DecryptionConfig) -> Tokenization | None:
    """The interceptor's tokenization, when its connection is a Transform one (or its keys are
    ``vault-transform://`` URIs); None: it encrypts."""
    name = config.kms_connection_name
    found = None if name is None else runtime_of(services).connections.get(normalize(name))
    inline = None if config.kms_config is None else parse_kms_config(config.kms_config)
    return tokenization_of(found, inline, KmsPool(), config.record_value, config.record_key)


def _schemas(services: GatewayServices, config: EncryptionConfig | DecryptionConfig) -> AvroSchemas | None:
    """The schemas of the interceptor's registry (Avro fields), when it names one."""
    client = registry_client(
        services.settings("GATEWAY_EXTERNAL_CONNECTION_"),
        config.schema_registry_connection_name,
        config.schema_registry_config,
    )
    return None if client is None else AvroSchemas(client)


def _names(fields: list[str] | None) -> frozenset[str] | None:
    return None if not fields else frozenset(fields)
