"""``large-message``: a claim check. On produce, every record value of at least
``minimumSizeInBytes`` on the matching topics goes to an object store (S3, or a local directory for
development); Kafka gets a small reference instead, marked by the header ``kanal.large-message``.
On fetch, marked records get their value back from the store and lose the header.

Failures never lose a record nor leave a reference without its object: when the store fails on
produce, the partition fails with ``KAFKA_STORAGE_ERROR`` (retriable: the producer sends again) and
nothing of it goes to Kafka; when it fails on fetch, the partition's fetch fails with the same code
(the consumer fetches again) instead of handing out the reference as data. The reference format is
documented byte by byte in ``docs/safeguards-large-messages.md`` and in :class:`Reference`.
"""

from __future__ import annotations

import hashlib
import logging
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar, Final

import msgspec
import trio

from kanal.api import (
    NONE,
    ErrorCode,
    GatewayServices,
    Interceptor,
    InterceptorConfigError,
    PartitionError,
    Record,
    RecordBatch,
    RecordsContext,
    RecordsResult,
    hookimpl,
    records_area,
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
    "INTERCEPTORS",
    "MARKER",
    "LargeMessage",
    "LargeMessageConfig",
    "Reference",
    "S3Config",
]

log = logging.getLogger(__name__)

#: The header that marks a record whose value is in the store; its value is the object key (UTF-8).
MARKER: Final = "kanal.large-message"
_MARKER_BYTES: Final = MARKER.encode()
#: The error of a partition the store failed: retriable for every Kafka client, on produce and fetch.
STORE_FAILED: Final = ErrorCode.kafka_storage_error
_PARALLEL: Final = 8  # objects moved at once per partition


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

    A record is a reference only when it carries the ``kanal.large-message`` header, its value
    parses as above, and the header's value equals the key inside: data that merely looks like a
    reference is never taken for one.
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
    def decode(cls, value: bytes | None, header: bytes | None) -> Reference | None:
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


class LargeMessageConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """What operators write under ``config:`` (camelCase keys); exactly one store."""

    topic: str = ".*"
    minimum_size_in_bytes: Annotated[int, msgspec.Meta(ge=1)] = 1024 * 1024
    s3_config: S3Config | None = None
    local_disk_directory: str | None = None
    store_timeout_ms: Annotated[int, msgspec.Meta(ge=1)] = 8000
    maximum_restored_bytes_per_partition: Annotated[int, msgspec.Meta(ge=1)] = 32 * 1024 * 1024


def build_store(config: LargeMessageConfig) -> ObjectStore:
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


def _marker(record: Record) -> bytes | None:
    """The marker header's value, or None when the record has none."""
    for key, value in record.headers:
        if key == MARKER:
            return value if value is not None else b""
    return None


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


class LargeMessage(SafeguardInterceptor):
    """Moves large record values to an object store on produce and back on fetch."""

    plugin_name: ClassVar[str] = "large-message"
    description: ClassVar[str] = "Keeps large record values in S3 (or a directory), with a reference in Kafka."
    config_type: ClassVar[type[LargeMessageConfig]] = LargeMessageConfig
    config: LargeMessageConfig

    def __init__(self, config: LargeMessageConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        self._matches = TopicMatcher(config.topic)
        self._store: ObjectStore = build_store(config)
        self._timeout = config.store_timeout_ms / 1000

    def wants_produce_records(self, topic: str) -> bool:
        return self._matches(topic)

    async def aclose(self) -> None:
        await self._store.aclose()

    @hookimpl
    async def kanal_produce_records(self, ctx: RecordsContext) -> RecordsResult:
        """Stores the large values of this partition, all or none, then puts references in place."""
        if not self._matches(ctx.topic):
            return None
        minimum = self.config.minimum_size_in_bytes
        large: list[tuple[RecordBatch, Record, bytes]] = []
        for batch in ctx.records.batches:
            if batch.is_control:
                continue
            data, start = records_area(batch)
            marked = _MARKER_BYTES in data  # a cheap test before reading any header
            if len(data) - start < minimum and not marked:
                continue  # no value of this batch can be large
            for record in batch.records():
                if marked and _marker(record) is not None:
                    return PartitionError(
                        ErrorCode.invalid_record, f"the record header {MARKER} is reserved for the gateway"
                    )
                value = record.value
                if value is not None and len(value) >= minimum:
                    large.append((batch, record, value))
        if not large:
            return None
        references = await self._store_all(ctx.topic, ctx.partition, [value for _, _, value in large])
        if isinstance(references, PartitionError):
            return references
        changed: dict[int, RecordBatch] = {}
        for (batch, record, _), reference in zip(large, references, strict=True):
            record.value = reference.encode()
            record.headers = [*record.headers, (MARKER, reference.key.encode("utf-8"))]
            changed[id(batch)] = batch
        for batch in changed.values():
            batch.mark_changed()
        return None

    async def _store_all(self, topic: str, partition: int, values: list[bytes]) -> list[Reference] | PartitionError:
        """Every value stored under a new key, or a PartitionError after removing what was stored."""
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
                references[i] = Reference(keys[i], len(value), digest)

        with trio.move_on_after(self._timeout) as scope:
            async with trio.open_nursery() as nursery:
                for i in range(len(values)):
                    nursery.start_soon(put, i)
        if scope.cancelled_caught:
            failures.append(f"{store.description}: no answer within {self.config.store_timeout_ms} ms")
        done = [r for r in references if r is not None]
        if failures or len(done) != len(values):
            await self._discard(keys)
            log.warning("large-message: %s-%d not written, the store failed: %s", topic, partition, failures[0])
            return PartitionError(STORE_FAILED, f"large message store unavailable: {failures[0]}")
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

    @hookimpl
    async def kanal_fetch_records(self, ctx: RecordsContext) -> RecordsResult:
        """Restores the marked records of this partition, or fails it (retriably) when it cannot."""
        if not self._matches(ctx.topic):
            return None
        budget = self.config.maximum_restored_bytes_per_partition
        planned = 0
        todo: list[tuple[RecordBatch, Record, Reference]] = []
        batches = ctx.records.batches
        cut: int | None = None
        for index, batch in enumerate(batches):
            if batch.is_control:
                continue
            data, _ = records_area(batch)
            if _MARKER_BYTES not in data:
                continue
            found: list[tuple[RecordBatch, Record, Reference]] = []
            for record in batch.records():
                header = _marker(record)
                if header is None:
                    continue
                reference = Reference.decode(record.value, header)
                if reference is None:
                    log.warning(
                        "large-message: %s-%d offset %d has the %s header but no valid reference: left as it is",
                        ctx.topic,
                        ctx.partition,
                        batch.offset_of(record),
                        MARKER,
                    )
                    continue
                found.append((batch, record, reference))
            size = sum(reference.size for _, _, reference in found)
            if todo and planned + size > budget:
                cut = index  # the consumer fetches the rest again, from the first batch left out
                break
            planned += size
            todo.extend(found)
        if cut is not None:
            for batch in batches[cut:]:
                ctx.records.remove(batch)
        if not todo:
            return None
        failure = await self._restore_all(todo)
        if failure is not None:
            log.warning("large-message: %s-%d fetch failed, the store failed: %s", ctx.topic, ctx.partition, failure)
            return PartitionError(STORE_FAILED, f"large message store unavailable: {failure}")
        changed: dict[int, RecordBatch] = {}
        for batch, record, _ in todo:
            record.headers = [(key, value) for key, value in record.headers if key != MARKER]
            changed[id(batch)] = batch
        for batch in changed.values():
            batch.compression = NONE  # (recompressing megabytes would hold up the gateway's loop)
            batch.mark_changed()
        return None

    async def _restore_all(self, todo: list[tuple[RecordBatch, Record, Reference]]) -> str | None:
        """Puts every stored value in its record; the first failure, or None when all came back
        (records are changed only when all did)."""
        values: list[bytes | None] = [None] * len(todo)
        failures: list[str] = []
        limit = trio.Semaphore(_PARALLEL)
        store = self._store

        async def get(i: int) -> None:
            reference = todo[i][2]
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
                for i in range(len(todo)):
                    nursery.start_soon(get, i)
        if scope.cancelled_caught:
            failures.append(f"{store.description}: no answer within {self.config.store_timeout_ms} ms")
        if failures:
            return failures[0]
        for (_, record, _), value in zip(todo, values, strict=True):
            record.value = value
        return None


INTERCEPTORS: list[type[Interceptor]] = [LargeMessage]
