"""Prometheus metrics of the encryption plugin, in the gateway's registry (served at ``/metrics``).

Counted once per partition batch, never per record:

* ``gateway_encryption_records_encrypted_total{interceptor}``: records with a part encrypted;
* ``gateway_encryption_parts_decrypted_total{interceptor}``: parts (values, keys, fields, headers) decrypted;
* ``gateway_encryption_failures_total{interceptor, operation}``: partitions failed (encrypt) or parts
  left encrypted / fetches failed (decrypt);
* ``gateway_encryption_kms_calls_total{kms, operation, outcome}`` and
  ``gateway_encryption_kms_call_seconds{kms, operation}``: wrap and unwrap calls to the KMS;
* ``gateway_encryption_dek_cache_total{operation, result}``: data key lookups (hit, miss).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["EncryptionMetrics"]


class EncryptionMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.encrypted = Counter(
            "gateway_encryption_records_encrypted", "Records encrypted on produce", ["interceptor"], registry=r
        )
        self.decrypted = Counter(
            "gateway_encryption_parts_decrypted", "Record parts decrypted on fetch", ["interceptor"], registry=r
        )
        self.failures = Counter(
            "gateway_encryption_failures",
            "Encryption failures (partitions refused) and decryption failures (parts left encrypted)",
            ["interceptor", "operation"],
            registry=r,
        )
        self.kms_calls = Counter(
            "gateway_encryption_kms_calls", "Calls to a KMS", ["kms", "operation", "outcome"], registry=r
        )
        self.kms_seconds = Histogram(
            "gateway_encryption_kms_call_seconds", "Latency of KMS calls", ["kms", "operation"], registry=r
        )
        self.dek_cache = Counter(
            "gateway_encryption_dek_cache", "Data key cache lookups", ["operation", "result"], registry=r
        )
