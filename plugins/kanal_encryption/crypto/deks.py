"""Data encryption keys: made, wrapped by a KMS, reused for a while, and unwrapped for decryption.

Encryption keeps one current DEK per (KMS, key id, algorithm, key reference): 16 or 32 bytes of
``os.urandom``, wrapped once by ``kms.wrap``, then reused until ``key_ttl_ms`` has passed since it
was made or ``max_records`` seals have been reserved on it (5,000,000 by default: key wear stays
far below AES-GCM's bounds, and a rotated KEK reaches new data within the TTL), and then replaced.
``key_ttl_ms=0`` turns reuse off: every :meth:`DekManager.sealer` call wraps a DEK of its own.

Decryption caches unwrapped DEKs by (KMS, key id, EDEK), LRU-bounded, each for ``key_ttl_ms`` after
it was unwrapped (after write, not after access, so a shredded key stops decrypting within the
TTL). A :class:`KmsKeyNotFound` is remembered for ``not_found_ttl_ms`` (the key for wraps, the EDEK
for unwraps), so a shredded key costs one KMS call per 30 s, not one per record. The DEKs this
manager makes are also put in the decryption cache (their EDEK is known to unwrap to them).

:meth:`DekManager.forget` drops what it holds of one key id (its KMS key was deleted: crypto
shredding), so the next seal wraps a new DEK and the next open asks the KMS. An unwrap answered
:class:`KmsKeyNotFound` forgets the key id too (a current DEK wrapped by a deleted key would make
new records unreadable) and tells ``on_key_gone``, which can forget it in other managers.

Each side has a synchronous call for the hot path (``sealer_now``, ``opener_now``: a cache hit or
None, no await) and an async one that may call the KMS; concurrent callers missing the same key
share one KMS call (a trio Event per call in flight). All of it runs in one trio thread.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Final

import trio

from ..kms.base import Kms, KmsError, KmsKeyNotFound
from .ciphers import Algorithm
from .envelope import MAX_FIELD, Opener, Sealer

__all__ = ["DekManager", "DekStats", "KmsObserver"]

#: Called after each KMS call: (operation "wrap" or "unwrap", the KMS's kind, seconds, succeeded).
KmsObserver = Callable[[str, str, float, bool], None]

DEFAULT_KEY_TTL_MS: Final = 3_600_000
DEFAULT_MAX_RECORDS: Final = 5_000_000
DEFAULT_NOT_FOUND_TTL_MS: Final = 30_000


@dataclass(slots=True)
class DekStats:
    """Counters for metrics (monotonic; the plugin publishes them)."""

    #: KMS wrap calls made, those that failed, and their total duration.
    wraps: int = 0
    wrap_failures: int = 0
    wrap_seconds: float = 0.0
    #: KMS unwrap calls made, those that failed, and their total duration.
    unwraps: int = 0
    unwrap_failures: int = 0
    unwrap_seconds: float = 0.0
    #: Sealer requests served by a current DEK, and those that needed a new one.
    sealer_hits: int = 0
    sealer_misses: int = 0
    #: Opener requests served from the cache, and those that needed an unwrap.
    opener_hits: int = 0
    opener_misses: int = 0
    #: Requests answered by a remembered KmsKeyNotFound (no KMS call).
    not_found_hits: int = 0
    #: DEKs retired because key_ttl_ms passed, or because max_records seals were reserved.
    deks_expired: int = 0
    deks_exhausted: int = 0
    #: Unwrapped DEKs dropped from the full LRU cache.
    openers_evicted: int = 0


class _Dek:
    """A current DEK (kept with its KMS, which pins the ``id`` in the cache key)."""

    __slots__ = ("expires", "kms", "reserved", "sealer")

    def __init__(self, kms: Kms, sealer: Sealer, expires: float) -> None:
        self.kms = kms
        self.sealer = sealer
        self.expires = expires
        self.reserved = 0


class _Unwrapped:
    __slots__ = ("expires", "kms", "opener")

    def __init__(self, kms: Kms, opener: Opener, expires: float) -> None:
        self.kms = kms
        self.opener = opener
        self.expires = expires


class _Flight:
    """One KMS call in flight, which callers missing the same key wait for."""

    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.error: BaseException | None = None
        self.result: Opener | None = None


class DekManager:
    """The DEKs of one plugin instance, over any number of KMSs (see the module's docstring).

    ``clock`` (monotonic seconds) measures TTLs and KMS latency; ``observe`` sees every KMS call
    (for a latency histogram)."""

    def __init__(
        self,
        *,
        key_ttl_ms: int = DEFAULT_KEY_TTL_MS,
        max_records: int = DEFAULT_MAX_RECORDS,
        max_deks: int = 10_000,
        max_openers: int = 1_000,
        not_found_ttl_ms: int = DEFAULT_NOT_FOUND_TTL_MS,
        clock: Callable[[], float] = time.monotonic,
        observe: KmsObserver | None = None,
        on_key_gone: Callable[[Kms, str], None] | None = None,
    ) -> None:
        if key_ttl_ms < 0 or not_found_ttl_ms < 0:
            raise ValueError("key_ttl_ms and not_found_ttl_ms must be >= 0")
        if max_records < 1 or max_deks < 1 or max_openers < 1:
            raise ValueError("max_records, max_deks and max_openers must be >= 1")
        self.key_ttl = key_ttl_ms / 1000
        self.max_records = max_records
        self.max_deks = max_deks
        self.max_openers = max_openers
        self.not_found_ttl = not_found_ttl_ms / 1000
        self.stats = DekStats()
        self._clock = clock
        self._observe = observe
        self._on_key_gone = on_key_gone
        self._deks: OrderedDict[Hashable, _Dek] = OrderedDict()
        self._openers: OrderedDict[Hashable, _Unwrapped] = OrderedDict()
        # A remembered KmsKeyNotFound: key -> (expires, message, the KMS pinning its id).
        self._missing: OrderedDict[Hashable, tuple[float, str, Kms]] = OrderedDict()
        self._wrapping: dict[Hashable, _Flight] = {}
        self._unwrapping: dict[Hashable, _Flight] = {}

    # -- encryption

    def sealer_now(
        self, kms: Kms, key_id: str, algorithm: Algorithm, records: int = 1, *, key_ref: str
    ) -> Sealer | None:
        """The current DEK's sealer with ``records`` seals reserved on it, or None when there is
        none (or it has expired, or has too few seals left): then await :meth:`sealer`.
        Raises the remembered KmsKeyNotFound of ``key_id``."""
        sealer = self._reserve((id(kms), key_id, algorithm, key_ref), records)
        if sealer is not None:
            self.stats.sealer_hits += 1
            return sealer
        self._check_missing((id(kms), key_id))
        return None

    async def sealer(self, kms: Kms, key_id: str, algorithm: Algorithm, records: int = 1, *, key_ref: str) -> Sealer:
        """The current DEK's sealer with ``records`` seals reserved, making and wrapping a new DEK
        when needed (concurrent callers share one wrap). ``key_ref`` is written in each envelope:
        it must let a decrypter find ``kms`` and ``key_id`` again. A single reservation larger than
        ``max_records`` gets a fresh DEK to itself. Raises KmsError (KmsKeyNotFound, remembered)."""
        if records < 1:
            raise ValueError(f"records must be >= 1, not {records}")
        _check_key_ref(key_ref)
        key = (id(kms), key_id, algorithm, key_ref)
        sealer = self._reserve(key, records)
        if sealer is not None:
            self.stats.sealer_hits += 1
            return sealer
        self.stats.sealer_misses += 1
        while True:
            self._check_missing((id(kms), key_id))
            if self.key_ttl <= 0:
                return (await self._new_dek(kms, key_id, algorithm, key_ref)).sealer
            flight = self._wrapping.get(key)
            if flight is None:
                flight = self._wrapping[key] = _Flight()
                try:
                    dek = await self._new_dek(kms, key_id, algorithm, key_ref)
                    dek.reserved = records
                    self._deks[key] = dek
                    self._deks.move_to_end(key)
                    while len(self._deks) > self.max_deks:
                        self._deks.popitem(last=False)
                    return dek.sealer
                except Exception as exc:
                    flight.error = exc
                    raise
                finally:
                    del self._wrapping[key]
                    flight.done.set()
            await flight.done.wait()
            if flight.error is not None:
                _raise_shared(flight.error)
            sealer = self._reserve(key, records)  # the DEK that flight made, unless it is used up
            if sealer is not None:
                return sealer

    def _reserve(self, key: Hashable, records: int) -> Sealer | None:
        dek = self._deks.get(key)
        if dek is None:
            return None
        if self._clock() >= dek.expires:
            del self._deks[key]
            self.stats.deks_expired += 1
            return None
        if dek.reserved + records > self.max_records:
            del self._deks[key]
            self.stats.deks_exhausted += 1
            return None
        dek.reserved += records
        self._deks.move_to_end(key)
        return dek.sealer

    async def _new_dek(self, kms: Kms, key_id: str, algorithm: Algorithm, key_ref: str) -> _Dek:
        dek = os.urandom(algorithm.key_size)
        edek = await self._call("wrap", kms, kms.wrap, key_id, dek, (id(kms), key_id))
        if not isinstance(edek, bytes) or not 0 < len(edek) <= MAX_FIELD:
            raise KmsError(f"{kms.kind} wrap of {key_id!r} returned no EDEK of 1 to {MAX_FIELD} bytes", retriable=False)
        now = self._clock()
        if self.key_ttl > 0:  # this EDEK decrypts with this DEK: spare the unwrap
            self._remember_opener((id(kms), key_id, edek), _Unwrapped(kms, Opener(dek), now + self.key_ttl))
        return _Dek(kms, Sealer(algorithm, dek, key_ref, edek), now + self.key_ttl)

    # -- decryption

    def opener_now(self, kms: Kms, key_id: str, edek: bytes) -> Opener | None:
        """The cached opener of the DEK that ``edek`` wraps, or None: then await :meth:`opener`.
        Raises the remembered KmsKeyNotFound of this EDEK."""
        key = (id(kms), key_id, edek)
        opener = self._cached_opener(key)
        if opener is not None:
            self.stats.opener_hits += 1
            return opener
        self._check_missing(key)
        return None

    async def opener(self, kms: Kms, key_id: str, edek: bytes) -> Opener:
        """The opener of the DEK that ``edek`` wraps, unwrapping it when it is not cached
        (concurrent callers share one unwrap). Raises KmsError (KmsKeyNotFound, remembered)."""
        edek = bytes(edek)
        key = (id(kms), key_id, edek)
        opener = self._cached_opener(key)
        if opener is not None:
            self.stats.opener_hits += 1
            return opener
        self.stats.opener_misses += 1
        while True:
            self._check_missing(key)
            flight = self._unwrapping.get(key)
            if flight is None:
                flight = self._unwrapping[key] = _Flight()
                try:
                    dek = await self._call("unwrap", kms, kms.unwrap, key_id, edek, key)
                    if not isinstance(dek, bytes) or len(dek) not in (16, 32):
                        message = f"{kms.kind} unwrap of {key_id!r} returned no 16- or 32-byte DEK"
                        raise KmsError(message, retriable=False)
                    opener = flight.result = Opener(dek)
                    if self.key_ttl > 0:
                        self._remember_opener(key, _Unwrapped(kms, opener, self._clock() + self.key_ttl))
                    return opener
                except Exception as exc:
                    flight.error = exc
                    if isinstance(exc, KmsKeyNotFound):
                        self._gone(kms, key_id)
                    raise
                finally:
                    del self._unwrapping[key]
                    flight.done.set()
            await flight.done.wait()
            if flight.result is not None:
                return flight.result
            if flight.error is not None:
                _raise_shared(flight.error)
            opener = self._cached_opener(key)  # that caller was cancelled: try again
            if opener is not None:
                return opener

    def _cached_opener(self, key: Hashable) -> Opener | None:
        found = self._openers.get(key)
        if found is None:
            return None
        if self._clock() >= found.expires:
            del self._openers[key]
            return None
        self._openers.move_to_end(key)
        return found.opener

    def _remember_opener(self, key: Hashable, entry: _Unwrapped) -> None:
        self._openers[key] = entry
        self._openers.move_to_end(key)
        while len(self._openers) > self.max_openers:
            self._openers.popitem(last=False)
            self.stats.openers_evicted += 1

    # -- both

    @property
    def cached_deks(self) -> int:
        """Current encryption DEKs held (some may have expired, unnoticed yet)."""
        return len(self._deks)

    @property
    def cached_openers(self) -> int:
        """Unwrapped DEKs held."""
        return len(self._openers)

    def clear(self) -> None:
        """Forgets every DEK and remembered KmsKeyNotFound (calls in flight finish as they are)."""
        self._deks.clear()
        self._openers.clear()
        self._missing.clear()

    def forget(self, kms: Kms, key_id: str) -> int:
        """Forgets the current DEKs and the unwrapped DEKs of ``key_id`` of ``kms``, and a remembered
        KmsKeyNotFound of its wraps (the key was deleted, or made anew): the next seal makes and
        wraps a new DEK, the next open asks the KMS. Calls in flight finish as they are. Returns
        how many DEKs it dropped."""
        kms_id = id(kms)
        dropped = 0
        for cache in (self._deks, self._openers):
            stale = [k for k in cache if isinstance(k, tuple) and k[0] == kms_id and k[1] == key_id]
            for k in stale:
                del cache[k]
            dropped += len(stale)
        self._missing.pop((kms_id, key_id), None)
        return dropped

    def _gone(self, kms: Kms, key_id: str) -> None:
        """An unwrap found the key gone: forget it here, and tell ``on_key_gone``."""
        self.forget(kms, key_id)
        if self._on_key_gone is not None:
            self._on_key_gone(kms, key_id)

    def _check_missing(self, key: Hashable) -> None:
        if not self._missing:
            return
        found = self._missing.get(key)
        if found is None:
            return
        if self._clock() >= found[0]:
            del self._missing[key]
            return
        self.stats.not_found_hits += 1
        raise KmsKeyNotFound(found[1])

    async def _call(
        self,
        operation: str,
        kms: Kms,
        fn: Callable[[str, bytes], Awaitable[bytes]],
        key_id: str,
        data: bytes,
        missing_key: Hashable,
    ) -> bytes:
        """One KMS call, counted and timed; a KmsKeyNotFound is remembered, and any other
        exception but a KmsError becomes a retriable KmsError."""
        start = self._clock()
        ok = False
        try:
            result = await fn(key_id, data)
            ok = True
            return result
        except KmsKeyNotFound as exc:
            if self.not_found_ttl > 0:
                self._missing[missing_key] = (self._clock() + self.not_found_ttl, str(exc), kms)
                self._missing.move_to_end(missing_key)
                while len(self._missing) > self.max_openers:
                    self._missing.popitem(last=False)
            raise
        except KmsError:
            raise
        except Exception as exc:
            raise KmsError(f"{kms.kind} {operation} of {key_id!r} failed: {exc!r}", retriable=True) from exc
        finally:
            seconds = self._clock() - start
            stats = self.stats
            if operation == "wrap":
                stats.wraps += 1
                stats.wrap_seconds += seconds
                stats.wrap_failures += not ok
            else:
                stats.unwraps += 1
                stats.unwrap_seconds += seconds
                stats.unwrap_failures += not ok
            if self._observe is not None:
                self._observe(operation, kms.kind, seconds, ok)


def _check_key_ref(key_ref: str) -> None:
    if not 0 < len(key_ref.encode()) <= MAX_FIELD:
        raise ValueError(f"a key reference must have 1 to {MAX_FIELD} UTF-8 bytes")


def _raise_shared(error: BaseException) -> None:
    """Raises, in a caller that waited for another's KMS call, that call's error (a copy of a
    KmsError, so each task's traceback stays its own)."""
    if isinstance(error, KmsKeyNotFound):
        raise KmsKeyNotFound(str(error)) from error
    if isinstance(error, KmsError):
        raise KmsError(str(error), retriable=error.retriable) from error
    raise error
