"""Where the claim-check interceptors (``large-message``, ``large-batch``) keep what they take out
of Kafka: the store protocol, its errors, and the local-directory store (for development).

Object keys are made by the interceptor (``<topic>/<partition>/<32 hex digits>``) and checked by
:func:`valid_key` before any store sees one, so a key never escapes its directory or bucket.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path
from typing import Final, Protocol

import trio

__all__ = ["LocalDiskStore", "ObjectMissing", "ObjectStore", "StoreError", "new_key", "valid_key"]

#: ``<topic>/<partition>/<uuid4 hex>``: Kafka's topic characters, a partition number, 32 hex digits.
_KEY: Final = re.compile(r"(?!\.{1,2}/)[A-Za-z0-9._-]{1,249}/[0-9]{1,10}/[0-9a-f]{32}")


def new_key(topic: str, partition: int) -> str:
    """A unique object key for a value of ``topic``/``partition`` (a random UUID: no coordination
    between gateway nodes is needed)."""
    return f"{topic}/{partition}/{uuid.uuid4().hex}"


def valid_key(key: str) -> bool:
    """Whether ``key`` has the shape :func:`new_key` makes (a reference read from Kafka may have
    been written by anyone with access to the broker)."""
    return _KEY.fullmatch(key) is not None


class StoreError(Exception):
    """The store did not do what was asked (unreachable, timed out, refused): Kafka clients get a
    retriable error and try again."""


class ObjectMissing(StoreError):
    """The store answered, but has no object under the key (deleted, or written elsewhere)."""


class ObjectStore(Protocol):
    """A flat key-value store of bytes; every call may raise :class:`StoreError`."""

    description: str
    """What operators read in log lines and errors (``S3 bucket 'b'``), never a secret."""

    async def put(self, key: str, data: bytes, sha256: bytes) -> None:
        """Stores ``data`` (whose SHA-256 digest is ``sha256``) under ``key``, replacing nothing."""

    async def get(self, key: str) -> bytes:
        """The bytes stored under ``key``; :class:`ObjectMissing` when there are none."""

    async def delete(self, key: str) -> None:
        """Removes ``key`` (nothing when it is not there)."""

    async def aclose(self) -> None:
        """Releases connections."""


class LocalDiskStore:
    """Objects as files under one directory (``<dir>/<topic>/<partition>/<id>``), written to a
    temporary name and renamed, so a reader never sees half a value. File I/O runs in a worker
    thread: the gateway's loop never waits on the disk."""

    def __init__(self, directory: str) -> None:
        self.root = Path(directory)
        self.description = f"local directory {directory!r}"

    def _path(self, key: str) -> Path:
        if not valid_key(key):  # (callers check already; a store never trusts a key)
            raise StoreError(f"{self.description}: invalid object key {key!r}")
        return self.root / key

    async def put(self, key: str, data: bytes, sha256: bytes) -> None:
        path = self._path(key)

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(f".{path.name}.tmp")
            with open(temporary, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)

        try:
            await trio.to_thread.run_sync(write)
        except OSError as exc:
            raise StoreError(f"{self.description}: cannot write {key}: {exc.strerror or exc}") from None

    async def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return await trio.to_thread.run_sync(path.read_bytes)
        except FileNotFoundError:
            raise ObjectMissing(f"{self.description}: no object {key}") from None
        except OSError as exc:
            raise StoreError(f"{self.description}: cannot read {key}: {exc.strerror or exc}") from None

    async def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            await trio.to_thread.run_sync(lambda: path.unlink(missing_ok=True))
        except OSError as exc:
            raise StoreError(f"{self.description}: cannot delete {key}: {exc.strerror or exc}") from None

    async def aclose(self) -> None:
        return None
