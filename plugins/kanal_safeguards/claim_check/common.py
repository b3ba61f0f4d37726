"""What the claim-check interceptors share (``large-message``, one object per large value, and
``large-batch``, one object per large batch): their config, the reference Kafka holds instead of the
data, and the base class that writes objects to the store all or none on produce and reads them
back within a budget on fetch.

Failures never lose a record nor leave a reference without its object: when the store fails on
produce, the partition fails with ``KAFKA_STORAGE_ERROR`` (retriable: the producer sends again) and
nothing of it goes to Kafka; when it fails on fetch, the partition's fetch fails with the same code
(the consumer fetches again) instead of handing out a reference as data.
"""

from __future__ import annotations

import hashlib
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar, Final, Self, TypeVar

import msgspec
import trio

from kanal.api import (
    ErrorCode,
    GatewayServices,
    InterceptorConfigError,
    PartitionError,
    Record,
    RecordBatch,
    RecordsContext,
)
from kanal_safeguards.base import SafeguardInterceptor, TopicMatcher
from kanal_safeguards.claim_check.object_store import (
    LocalDiskStore,
    ObjectMissing,
    ObjectStore,
    StoreError,
    new_key,
    valid_key,
)
from kanal_safeguards.claim_check.s3 import S3Settings, S3Store

__all__ = [
    "STORE_FAILED",
    "ClaimCheck",
    "ClaimCheckConfig",
    "Reference",
    "S3Config",
    "build_store",
    "marker",
]

#: The error of a partition the store failed: retriable for every Kafka client, on produce and fetch.
STORE_FAILED: Final = ErrorCode.kafka_storage_error
_PARALLEL: Final = 8  # objects moved at once per partition

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Reference:
    """What Kafka holds instead of a large value (all integers big-endian)::

        offset  size  field
        0       8     magic, ASCII "KANAL-LM" (4B 41 4E 41 4C 2D 4C 4D)
        8       1     format version, 0x01
        9       8     size of the original value in bytes (unsigned)
        17      32    SHA-256 digest of the original value
        49      2     length n of the object key in bytes (unsigned)
        51      n     object key, UTF-8: <topic>/<partition>/<32 lowercase hex digits>

    A record is a reference only when it carries the interceptor's marker header, its value
    parses as above, and the header's value equals the key inside: data that merely looks like a
    reference is never taken for one. A subclass with another ``MAGIC`` is another kind of
    reference (a batch's): one is never taken for the other.
    """

    MAGIC: ClassVar[bytes] = b"KANAL-LM"
    VERSION: ClassVar[int] = 1
    _HEAD: ClassVar[struct.Struct] = struct.Struct(">8sBQ32sH")

    key: str
    size: int
    sha256: bytes

    def encode(self) -> bytes:
        key = self.key.encode("utf-8")
        return self._HEAD.pack(self.MAGIC, self.VERSION, self.size, self.sha256, len(key)) + key

    @classmethod
    def decode(cls, value: bytes | None, header: bytes | None) -> Self | None:
        """The reference in a record's ``value`` with the marker header's value ``header``; None
        when they are not one (wrong magic, version, length, key shape, or a header naming another
        key)."""
        head = cls._HEAD
        if value is None or header is None or len(value) < head.size or not value.startswith(cls.MAGIC):
            return None
        _, version, size, sha256, length = head.unpack_from(value)
        if version != cls.VERSION or len(value) != head.size + length or value[head.size :] != header:
            return None
        try:
            key = header.decode("utf-8")
        except UnicodeDecodeError:
            return None
        return cls(key, size, sha256) if valid_key(key) else None


class S3Config(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """An S3 bucket (``uri`` for MinIO, moto or an endpoint of your own); without keys, botocore's
    default credential chain (environment, profile, instance role)."""

    bucket_name: str
    access_key: str | None = None
    secret_key: str | None = None
    session_token: str | None = None
    uri: str | None = None
    region: str = "us-east-1"


class ClaimCheckConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """What operators write under ``config:`` (camelCase keys); exactly one store. The same keys
    for both types, so that moving a topic from one to the other is a change of ``plugin:``."""

    topic: str = ".*"
    minimum_size_in_bytes: Annotated[int, msgspec.Meta(ge=1)] = 1024 * 1024
    s3_config: S3Config | None = None
    local_disk_directory: str | None = None
    store_timeout_ms: Annotated[int, msgspec.Meta(ge=1)] = 8000
    maximum_restored_bytes_per_partition: Annotated[int, msgspec.Meta(ge=1)] = 32 * 1024 * 1024


def build_store(config: ClaimCheckConfig) -> ObjectStore:
    """The configured store; InterceptorConfigError naming the key when the config cannot work."""
    s3, directory = config.s3_config, config.local_disk_directory
    if s3 is not None and directory is not None:
        raise InterceptorConfigError("s3Config, localDiskDirectory: set one store, not both")
    if s3 is not None:
        if not s3.bucket_name:
            raise InterceptorConfigError("s3Config.bucketName: must not be empty")
        if bool(s3.access_key) != bool(s3.secret_key):
            raise InterceptorConfigError("s3Config.accessKey, s3Config.secretKey: set both or neither")
        if s3.uri is not None and not s3.uri.startswith(("http://", "https://")):
            raise InterceptorConfigError(f"s3Config.uri: {s3.uri!r} is not an http:// or https:// URL")
        return S3Store(
            S3Settings(
                bucket=s3.bucket_name,
                region=s3.region,
                uri=s3.uri,
                access_key=s3.access_key,
                secret_key=s3.secret_key,
                session_token=s3.session_token,
                timeout_ms=config.store_timeout_ms,
            )
        )
    if directory is not None:
        if not Path(directory).is_dir():
            raise InterceptorConfigError(f"localDiskDirectory: {directory!r} is not an existing directory")
        return LocalDiskStore(directory)
    raise InterceptorConfigError("s3Config, localDiskDirectory: a store is required (set one of them)")


def marker(record: Record, name: str) -> bytes | None:
    """The value of the record's header ``name`` (b"" when null), or None when it has none."""
    for key, value in record.headers:
        if key == name:
            return value if value is not None else b""
    return None


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


class ClaimCheck(SafeguardInterceptor):
    """Base of the claim-check types: the store, and moving objects to and from it in parallel,
    all or none, within ``storeTimeoutMs``. Subclasses say what an object is (a value, a batch)
    and how Kafka refers to it."""

    config_type: ClassVar[type[ClaimCheckConfig]] = ClaimCheckConfig
    config: ClaimCheckConfig
    #: Where the type logs (operators filter on it).
    logger: ClassVar[logging.Logger] = logging.getLogger(__name__)
    #: What an object is, for error messages (``large message``).
    subject: ClassVar[str] = "claim check"

    def __init__(self, config: ClaimCheckConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        self._matches = TopicMatcher(config.topic)
        self._store: ObjectStore = build_store(config)
        self._timeout = config.store_timeout_ms / 1000

    def wants_produce_records(self, topic: str) -> bool:
        return self._matches(topic)

    async def aclose(self) -> None:
        await self._store.aclose()

    def _store_failed(self, topic: str, partition: int, stage: str, failure: str) -> PartitionError:
        """The retriable error of a partition the store failed, logged for operators (``stage``:
        ``not written`` on produce, ``fetch failed`` on fetch)."""
        self.logger.warning("%s: %s-%d %s, the store failed: %s", self.plugin_name, topic, partition, stage, failure)
        return PartitionError(STORE_FAILED, f"{self.subject} store unavailable: {failure}")

    async def _store_all(
        self, topic: str, partition: int, values: list[bytes], kind: type[Reference]
    ) -> list[Reference] | PartitionError:
        """Every value stored under a new key (references of type ``kind``), or a PartitionError
        after removing what was stored."""
        keys = [new_key(topic, partition) for _ in values]
        references: list[Reference | None] = [None] * len(values)
        failures: list[str] = []
        limit = trio.Semaphore(_PARALLEL)
        store = self._store

        async def put(i: int) -> None:
            async with limit:
                value = values[i]
                try:
                    digest = await trio.to_thread.run_sync(_digest, value)
                    await store.put(keys[i], value, digest)
                except StoreError as exc:
                    failures.append(str(exc))
                    return
                references[i] = kind(keys[i], len(value), digest)

        with trio.move_on_after(self._timeout) as scope:
            async with trio.open_nursery() as nursery:
                for i in range(len(values)):
                    nursery.start_soon(put, i)
        if scope.cancelled_caught:
            failures.append(f"{store.description}: no answer within {self.config.store_timeout_ms} ms")
        done = [r for r in references if r is not None]
        if failures or len(done) != len(values):
            await self._discard(keys)
            return self._store_failed(topic, partition, "not written", failures[0])
        return done

    async def _discard(self, keys: list[str]) -> None:
        """Best effort: removes what a failed produce stored (what stays is an orphan object, never
        a dangling reference)."""
        with trio.move_on_after(min(self._timeout, 2.0)):
            for key in keys:
                try:
                    await self._store.delete(key)
                except StoreError:
                    return

    def _restorable(
        self, ctx: RecordsContext, find: Callable[[RecordBatch], list[tuple[T, Reference]]]
    ) -> list[tuple[T, Reference]]:
        """The references ``find`` sees in the partition's data batches, batch after batch while
        their objects fit ``maximumRestoredBytesPerPartition``; the batches after are taken out of
        the response, and the consumer fetches them next (the first batch with references always
        comes, whatever its size, or the consumer would never move)."""
        budget = self.config.maximum_restored_bytes_per_partition
        planned = 0
        todo: list[tuple[T, Reference]] = []
        batches = ctx.records.batches
        for index, batch in enumerate(batches):
            if batch.is_control:
                continue
            found = find(batch)
            if not found:
                continue
            size = sum(reference.size for _, reference in found)
            if todo and planned + size > budget:
                for later in batches[index:]:
                    ctx.records.remove(later)
                break
            planned += size
            todo.extend(found)
        return todo

    async def _load_all(self, references: list[Reference]) -> list[bytes] | str:
        """Every referenced object, checked against its size and digest; or the first failure."""
        values: list[bytes | None] = [None] * len(references)
        failures: list[str] = []
        limit = trio.Semaphore(_PARALLEL)
        store = self._store

        async def get(i: int) -> None:
            reference = references[i]
            async with limit:
                try:
                    value = await store.get(reference.key)
                except ObjectMissing as exc:
                    failures.append(f"{exc} (the record's object is gone)")
                    return
                except StoreError as exc:
                    failures.append(str(exc))
                    return
                if len(value) != reference.size or await trio.to_thread.run_sync(_digest, value) != reference.sha256:
                    failures.append(f"{store.description}: object {reference.key} does not match its reference")
                    return
                values[i] = value

        with trio.move_on_after(self._timeout) as scope:
            async with trio.open_nursery() as nursery:
                for i in range(len(references)):
                    nursery.start_soon(get, i)
        if scope.cancelled_caught:
            failures.append(f"{store.description}: no answer within {self.config.store_timeout_ms} ms")
        if failures:
            return failures[0]
        loaded = [v for v in values if v is not None]
        if len(loaded) != len(references):  # (cannot happen without a failure; never hand out less)
            return f"{store.description}: not every object came back"
        return loaded
