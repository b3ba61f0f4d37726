"""The gateway KMS's keys topic, followed by every gateway node, and the key deletion events.

The gateway KMS (:mod:`kanal_encryption.kms.gateway`) makes one key encryption key (KEK) per key id
and keeps it, wrapped by a master key, in a compacted topic of the backing cluster
(``_kanal_<GATEWAY_CLUSTER_ID>_encryption_keys``, or ``GATEWAY_ENCRYPTION_KEYS_TOPIC``). A record's
key names the key id and a uuid of the KEK::

    {"keyId": "gateway-kms://<key id>", "uuid": "<uuid4>"}

and its value holds the KEK wrapped by the master key::

    {"keyId": "gateway-kms://<key id>", "uuid": "...", "algorithm": "AES256_GCM",
     "masterKeyId": "connection://VAULT/<master keyId>", "wrappedKey": "<base64>", "createdAt": <ms>}

Two nodes may make a KEK for the same new key id at once: both are kept (one record each), and
every node encrypts with the first in the topic (the lowest offset), so they converge; data either
encrypted stays readable. Deleting a key id writes a tombstone for each of its records: compaction
then removes the wrapped KEKs from the topic, and what they encrypted can never be read again
(crypto shredding). A key id used again after its deletion gets a new KEK.

Every node follows the topic in the background (:meth:`KeyStore.run`) into an in-memory map; a node
reads to the end of the topic before it makes a KEK (so it does not make a second one of its own)
and before it says that a KEK does not exist. One :class:`KeyStore` per gateway, shared by every
interceptor (:func:`keystore_of`), started on first use: a gateway whose interceptors have no
``gateway`` block creates no topic.

:class:`KeyEvents` tells every interceptor of the gateway that a key reference is gone (a gateway
key id deleted here or on another node, or an external KMS answering that a key does not exist), so
they drop the data keys they cached for it.
"""

from __future__ import annotations

import base64
import binascii
import inspect
import json
import logging
import time
import uuid as uuidlib
import weakref
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import trio

from kanal.api import GatewayServices, LogError, StateLog

from .base import KmsError

__all__ = [
    "GATEWAY_KMS",
    "TOPIC_SETTING",
    "KeyEvents",
    "KeyStore",
    "StoredKey",
    "key_events",
    "keys_topic",
    "keystore_of",
]

log = logging.getLogger("kanal_encryption")

#: The scheme of the gateway KMS's key references in envelopes: ``gateway-kms://<key id>``.
GATEWAY_KMS: Final = "gateway-kms://"
TOPIC_SETTING: Final = "GATEWAY_ENCRYPTION_KEYS_TOPIC"
_STORE: Final = "kanal_encryption.keystore"
_EVENTS: Final = "kanal_encryption.key_events"
#: How long a caller waits for the keys topic before its KMS call fails (retriably).
SYNC_TIMEOUT: Final = 10.0

Listener = Callable[[str], None]


class KeyEvents:
    """Key references that are gone (``gateway-kms://<id>``, ``connection://NAME/<id>``, a URI):
    every listener hears each of them, on this gateway. A listener that is a bound method is held
    weakly (an interceptor never closed does not stay alive for it)."""

    def __init__(self) -> None:
        self._listeners: dict[int, Callable[[], Listener | None]] = {}
        self._next = 0

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Calls ``listener(key_ref)`` for every key gone from now on; returns the way to stop."""
        self._next += 1
        token = self._next
        if inspect.ismethod(listener):
            self._listeners[token] = weakref.WeakMethod(listener)
        else:
            self._listeners[token] = lambda: listener

        def stop() -> None:
            self._listeners.pop(token, None)

        return stop

    def publish(self, key_ref: str) -> None:
        for token, get in list(self._listeners.items()):
            listener = get()
            if listener is None:
                self._listeners.pop(token, None)
                continue
            try:
                listener(key_ref)
            except Exception:  # (one listener's bug must not keep the others from forgetting)
                log.exception("a listener of deleted keys failed on %s", key_ref)

    def __len__(self) -> int:
        return len(self._listeners)


def key_events(services: GatewayServices) -> KeyEvents:
    """The gateway's :class:`KeyEvents` (in ``services.shared``)."""
    events = services.shared.get(_EVENTS)
    if not isinstance(events, KeyEvents):
        events = services.shared[_EVENTS] = KeyEvents()
    return events


@dataclass(frozen=True, slots=True)
class StoredKey:
    """One KEK of a key id, as the keys topic holds it (wrapped by the master key)."""

    key_id: str
    uuid: str
    algorithm: str
    master: str  # the reference of the master key that wrapped it
    wrapped: bytes
    created_ms: int
    offset: int


def record_key(key_id: str, uuid: str) -> bytes:
    return json.dumps({"keyId": GATEWAY_KMS + key_id, "uuid": uuid}, sort_keys=True, separators=(",", ":")).encode()


def _encode(entry: StoredKey) -> bytes:
    value = {
        "keyId": GATEWAY_KMS + entry.key_id,
        "uuid": entry.uuid,
        "algorithm": entry.algorithm,
        "masterKeyId": entry.master,
        "wrappedKey": base64.b64encode(entry.wrapped).decode("ascii"),
        "createdAt": entry.created_ms,
    }
    return json.dumps(value, separators=(",", ":")).encode()


def _key_of(data: bytes) -> tuple[str, str]:
    parsed = json.loads(data)
    ref, uuid = parsed["keyId"], parsed["uuid"]
    if not isinstance(ref, str) or not ref.startswith(GATEWAY_KMS) or not isinstance(uuid, str):
        raise ValueError("not a gateway KMS key")
    return ref[len(GATEWAY_KMS) :], uuid


def _decode(key_id: str, uuid: str, data: bytes, offset: int) -> StoredKey:
    parsed: dict[str, Any] = json.loads(data)
    return StoredKey(
        key_id=key_id,
        uuid=uuid,
        algorithm=str(parsed.get("algorithm", "AES256_GCM")),
        master=str(parsed.get("masterKeyId", "")),
        wrapped=base64.b64decode(parsed["wrappedKey"], validate=True),
        created_ms=int(parsed.get("createdAt", 0)),
        offset=offset,
    )


#: Makes a new KEK for a key id: (key id, its uuid) -> (the KEK wrapped by the master, the master's ref).
Maker = Callable[[str, str], Awaitable[tuple[bytes, str]]]


class KeyStore:
    """The keys topic as this node has read it (see the module's docstring)."""

    def __init__(self, reader: StateLog, writer: StateLog, events: KeyEvents, *, poll: float = 0.5) -> None:
        self.topic = reader.topic
        self.events = events
        self._reader = reader
        self._writer = writer
        self._poll = poll
        # key id -> uuid -> KEK, in the order of the topic (the first is the key id's current KEK)
        self._keys: dict[str, dict[str, StoredKey]] = {}
        self._next = 0  # the offset the follower reads next
        self._progress = trio.Event()  # set (and replaced) each time the follower has read
        self._ready = trio.Event()  # the topic exists
        self._creating: dict[str, tuple[trio.Lock, list[int]]] = {}
        self.error: str | None = None  # the follower's last failure, while it lasts

    # -- the follower

    async def run(self) -> None:
        """Follows the topic until cancelled (creating it first), retrying after failures."""
        delay = 0.2
        while not self._ready.is_set():
            try:
                await self._writer.ensure_topic()
                self._ready.set()
            except LogError as exc:
                self._failed(exc)
                await trio.sleep(delay)
                delay = min(delay * 2, 5.0)
        try:
            while True:
                try:
                    records, next_offset = await self._reader.read(self._next, self._poll)
                except LogError as exc:
                    self._failed(exc)
                    await trio.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                delay, self.error = 0.2, None
                for record in records:
                    self._apply(record.offset, record.key, record.value)
                self._next = max(self._next, next_offset)
                progress, self._progress = self._progress, trio.Event()
                progress.set()
        finally:
            with trio.CancelScope(shield=True):
                await self._reader.aclose()
                await self._writer.aclose()

    def _failed(self, exc: Exception) -> None:
        if self.error is None:
            log.warning("gateway KMS: cannot read the keys topic %s: %s", self.topic, exc)
        self.error = str(exc)

    def _apply(self, offset: int, key: bytes, value: bytes | None) -> None:
        try:
            key_id, uuid = _key_of(key)
            entry = None if value is None else _decode(key_id, uuid, value, offset)
        except (ValueError, KeyError, TypeError, binascii.Error):
            log.warning("gateway KMS: skipping a malformed record at offset %d of %s", offset, self.topic)
            return
        if entry is not None:
            self._keys.setdefault(key_id, {}).setdefault(uuid, entry)
            return
        kept = self._keys.get(key_id)
        if kept is None or kept.pop(uuid, None) is None:
            return
        if not kept:
            del self._keys[key_id]
        self.events.publish(GATEWAY_KMS + key_id)

    async def sync(self, timeout: float = SYNC_TIMEOUT) -> None:
        """Returns once this node has read the topic to its current end; KmsError (retriable) when
        it cannot within ``timeout`` seconds."""
        with trio.move_on_after(timeout):
            await self._ready.wait()
            end = await self._end_offset()
            await self.caught_up(end)
            return
        raise KmsError(
            f"gateway KMS: the keys topic {self.topic} cannot be read" + (f" ({self.error})" if self.error else ""),
            retriable=True,
        )

    async def caught_up(self, offset: int) -> None:
        """Returns once the follower has read the records before ``offset``."""
        while self._next < offset:
            await self._progress.wait()

    async def _end_offset(self) -> int:
        try:
            return await self._writer.end_offset()
        except LogError as exc:
            raise KmsError(f"gateway KMS: the keys topic {self.topic}: {exc}", retriable=True) from exc

    # -- reading

    def entry(self, key_id: str, uuid: str) -> StoredKey | None:
        """The KEK ``uuid`` of ``key_id``, if this node knows it (and it was not deleted)."""
        kept = self._keys.get(key_id)
        return None if kept is None else kept.get(uuid)

    def live(self, entry: StoredKey) -> bool:
        """Whether ``entry`` is still in the topic (not deleted since it was read)."""
        return self.entry(entry.key_id, entry.uuid) is entry

    def current(self, key_id: str) -> StoredKey | None:
        """The KEK new data of ``key_id`` is encrypted with (the first in the topic), if any."""
        kept = self._keys.get(key_id)
        return None if not kept else next(iter(kept.values()))

    def __iter__(self) -> Iterator[StoredKey]:
        for kept in list(self._keys.values()):
            yield from list(kept.values())

    def key_ids(self) -> list[str]:
        return sorted(self._keys)

    def entries(self, key_id: str) -> list[StoredKey]:
        return list(self._keys.get(key_id, {}).values())

    # -- writing

    async def current_or_new(self, key_id: str, make: Maker, algorithm: str = "AES256_GCM") -> StoredKey:
        """The current KEK of ``key_id``, made (``make``) and stored when it has none: after reading
        the topic to its end, one task of this node at a time per key id."""
        found = self.current(key_id)
        if found is not None:
            return found
        async with self._creation_lock(key_id):
            found = self.current(key_id)
            if found is not None:
                return found
            await self.sync()
            found = self.current(key_id)
            if found is not None:
                return found
            uuid = str(uuidlib.uuid4())
            wrapped, master = await make(key_id, uuid)
            entry = StoredKey(key_id, uuid, algorithm, master, wrapped, int(time.time() * 1000), -1)
            offset = await self._append([(record_key(key_id, uuid), _encode(entry))])
            with trio.move_on_after(SYNC_TIMEOUT):
                await self.caught_up(offset + 1)
            found = self.current(key_id)
            if found is None:
                raise KmsError(f"gateway KMS: the new key of {key_id!r} was not read back", retriable=True)
            return found

    async def delete(self, key_id: str) -> int:
        """Deletes every KEK of ``key_id`` (tombstones), once read on this node; returns how many
        (0: the key id is unknown). Raises KmsError when the topic cannot be read or written."""
        await self.sync()
        deleted = 0
        while True:  # a KEK another node made while these tombstones were written goes too
            entries = self.entries(key_id)
            if not entries:
                return deleted
            offset = await self._append([(record_key(key_id, e.uuid), None) for e in entries])
            deleted += len(entries)
            with trio.move_on_after(SYNC_TIMEOUT):
                await self.caught_up(offset + 1)
            if self._next <= offset:
                raise KmsError(f"gateway KMS: the deletion of {key_id!r} was not read back", retriable=True)
            if not any(e.offset < offset for e in self.entries(key_id)):
                return deleted

    async def _append(self, items: list[tuple[bytes, bytes | None]]) -> int:
        try:
            return await self._writer.append_many(items)
        except LogError as exc:
            raise KmsError(f"gateway KMS: cannot write to the keys topic {self.topic}: {exc}", retriable=True) from exc

    def _creation_lock(self, key_id: str) -> _Held:
        found = self._creating.get(key_id)
        if found is None:
            found = self._creating[key_id] = (trio.Lock(), [0])
        return _Held(self._creating, key_id, *found)


class _Held:
    """A per-key-id lock, dropped from its dict when no task holds or waits for it."""

    def __init__(self, owner: dict[str, tuple[trio.Lock, list[int]]], key: str, lock: trio.Lock, users: list[int]):
        self._owner, self._key, self._lock, self._users = owner, key, lock, users

    async def __aenter__(self) -> None:
        self._users[0] += 1
        try:
            await self._lock.acquire()
        except BaseException:
            self._release_use()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()
        self._release_use()

    def _release_use(self) -> None:
        self._users[0] -= 1
        if self._users[0] == 0:
            self._owner.pop(self._key, None)


def keys_topic(services: GatewayServices) -> str:
    configured = services.settings(TOPIC_SETTING).get(TOPIC_SETTING, "").strip()
    return configured or f"_kanal_{services.cluster_id}_encryption_keys"


def keystore_of(services: GatewayServices) -> KeyStore:
    """The gateway's :class:`KeyStore`, made and started (its follower) on first use."""
    store = services.shared.get(_STORE)
    if isinstance(store, KeyStore):
        return store
    topic = keys_topic(services)
    # two logs: the follower's long polls never delay a write
    store = KeyStore(services.state_log(topic), services.state_log(topic), key_events(services))
    services.shared[_STORE] = store
    services.start_soon(store.run, name="gateway KMS keys topic follower")
    return store
