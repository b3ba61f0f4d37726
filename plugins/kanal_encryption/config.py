"""The configs of the ``encryption``, ``decryption`` and ``masking`` interceptor types, as operators
write them (camelCase keys; unknown keys refused by the core, naming them).

An encryption config names what to encrypt per part of a record::

    topic: "orders.*"                       # regex of the topics (default: every topic)
    kmsConnectionName: VAULT                # a KMS external connection; fields then name a keyId
    recordValue:
      fields:                               # JSON fields, by path ...
        - fieldName: card.number
          keyId: "cards-{{record.topic}}"
          algorithm: AES256_GCM
    recordKey:
      payload: {keyId: keys}                # ... or the whole key / value / matching headers

or, without a connection, an inline ``kmsConfig`` and ``keySecretId`` URIs (``vault-kms://...``).

The gateway KMS (crypto shredding) is set one of two ways: the ``gateway`` block beside
``kmsConnectionName`` (fields name a bare ``keyId``), or inline, ``kmsConfig.gateway`` with
``masterKeyId`` a KMS key URI (fields name ``keySecretId: gateway-kms://<keyId>``); the inline
``kmsConfig`` is parsed by :func:`kanal_encryption.kms.inline.parse_kms_config`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "DecryptionConfig",
    "EncryptionConfig",
    "FieldSpec",
    "GatewayBlock",
    "HeaderSpec",
    "KeySpec",
    "MaskingConfig",
    "MaskingPolicy",
    "MaskingRule",
    "PartSpec",
    "SchemaRegistryBlock",
]


class KeySpec(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """Which key encrypts a payload: ``keyId`` of the connection, or an inline ``keySecretId`` URI."""

    key_id: str | None = None
    key_secret_id: str | None = None
    algorithm: str = "AES128_GCM"


class FieldSpec(KeySpec, forbid_unknown_fields=True, rename="camel"):
    """One field to encrypt: a JSON path into the value or key, or a header's name."""

    field_name: str = ""


class PartSpec(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """The record's value or key: the whole of it (``payload``) or some of its JSON fields."""

    payload: KeySpec | None = None
    fields: list[FieldSpec] | None = None


class HeaderSpec(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """Headers: those whose name matches ``header`` (a regex) encrypted whole with ``payload``, and
    those named in ``fields``."""

    header: str | None = None
    payload: KeySpec | None = None
    fields: list[FieldSpec] | None = None


class GatewayBlock(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """The gateway KMS (crypto shredding), beside ``kmsConnectionName``: the gateway makes one key
    per key id (a field's ``keyId``, templates rendered), wraps it with ``masterKeyId`` of the
    connection and keeps it in its keys topic; deleting a key id there shreds what it encrypted.
    Without a connection, the same block goes in ``kmsConfig.gateway`` (its master a key URI)."""

    #: The connection's key (a bare keyId, no template) wrapping the gateway's keys.
    master_key_id: str
    #: Unwrapped gateway keys kept in memory per interceptor (least recently used dropped).
    max_keys: int = 1_000_000


class SchemaRegistryBlock(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """An inline schema registry (``schemaRegistryConfig``), for Avro fields: its URL (several,
    comma-separated, are tried in turn) and basic auth."""

    host: str
    basic_auth_username: str | None = None
    basic_auth_password: str | None = None
    timeout_ms: int = 5000


class EncryptionConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    topic: str = ".*"
    kms_connection_name: str | None = None
    #: Inline KMS blocks (``vault``, ``aws``, ``azure``, ``gcp``, ``gateway``) and ``keyTtlMs``.
    kms_config: dict[str, Any] | None = None
    #: The gateway KMS: fields' keyIds are then the gateway's keys, wrapped by the connection's master key.
    gateway: GatewayBlock | None = None
    record_value: PartSpec | None = None
    record_key: PartSpec | None = None
    record_header: HeaderSpec | None = None
    #: Compress-then-encrypt for payloads (not fields).
    compression_type: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "none"
    #: What to do with a value that is already encrypted (by this gateway's envelope).
    error_policy: Literal["fail_on_encrypted", "skip_already_encrypted"] = "fail_on_encrypted"
    enable_audit_log_on_error: bool = True
    #: Seals per data key before a new one is made (bounds nonce reuse risk; Kroxylicious' default).
    max_encryptions_per_dek: int = 5_000_000
    #: A schema registry (external connection, or inline): Confluent-framed Avro values keep being
    #: Avro, their listed fields encrypted in place (docs/encryption-avro.md).
    schema_registry_connection_name: str | None = None
    schema_registry_config: SchemaRegistryBlock | None = None


class DecryptionConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    topic: str = ".*"
    kms_connection_name: str | None = None
    #: Inline KMS blocks, as the encryption's (``gateway`` too, to read its ``gateway-kms://`` keys).
    kms_config: dict[str, Any] | None = None
    #: The gateway KMS (the same block as the encryption's) to read ``gateway-kms://`` keys.
    gateway: GatewayBlock | None = None
    #: Only these fields (JSON paths; ``payload`` for the whole value); none listed: every encrypted one.
    record_value_fields: list[str] | None = None
    record_key_fields: list[str] | None = None
    record_header_fields: list[str] | None = None
    #: Tokenized fields (a Transform connection): the same ``fields`` lists as the encryption's,
    #: each with its role (a token looks like data: it is found by its field, not by itself).
    record_value: PartSpec | None = None
    record_key: PartSpec | None = None
    error_policy: Literal["return_encrypted", "fail_fetch"] = "return_encrypted"
    enable_audit_log_on_error: bool = True
    #: The schema registry to decode Confluent-framed Avro values with (their encrypted fields).
    schema_registry_connection_name: str | None = None
    schema_registry_config: SchemaRegistryBlock | None = None


class MaskingRule(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    type: Literal["MASK_ALL", "MASK_FIRST_N", "MASK_LAST_N"] = "MASK_ALL"
    masking_char: str = "*"
    number_of_chars: int = 0


class MaskingPolicy(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    name: str
    fields: list[str]
    rule: MaskingRule = msgspec.field(default_factory=MaskingRule)


class MaskingConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    policies: list[MaskingPolicy]
    topic: str = ".*"
    error_policy: Literal["fail_fetch", "skip_masking"] = "fail_fetch"
