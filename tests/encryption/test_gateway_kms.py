"""The gateway KMS (crypto shredding) over an in-memory keys topic shared by two "nodes": keys made
once per key id and kept wrapped by the master, races between nodes, deletion on every node, the
DEK caches forgetting deleted keys, and the locator's ``gateway`` block. No sleeps: tasks wait for
conditions."""

from __future__ import annotations

import json
import uuid as uuidlib
from collections.abc import Awaitable, Callable, Sequence

import pytest
import trio
import trio.testing
from kanal_encryption.config import GatewayBlock
from kanal_encryption.crypto import Algorithm, DekManager, parse
from kanal_encryption.keys import Locator
from kanal_encryption.kms.base import KmsError, KmsKeyNotFound
from kanal_encryption.kms.connections import parse_kms_connections
from kanal_encryption.kms.factory import KmsPool
from kanal_encryption.kms.gateway import GatewayKms
from kanal_encryption.kms.keystore import GATEWAY_KMS, KeyEvents, KeyStore, record_key
from kanal_encryption.kms.memory import InMemoryKms

from kanal.api import InterceptorConfigError, LogRecord

AES = Algorithm.AES256_GCM


class Topic:
    """One partition of a compacted topic, in memory (no compaction: tombstones stay)."""

    def __init__(self) -> None:
        self.records: list[LogRecord] = []
        self.grew = trio.Event()
        self.hold = False  # while True, readers see nothing new (a lagging node)


class FakeLog:
    def __init__(self, topic: Topic, name: str = "_kanal_test_encryption_keys", lagging: bool = False) -> None:
        self.topic = name
        self._topic = topic
        self.lagging = lagging  # this log's reads see nothing new while the topic is held

    async def ensure_topic(self) -> None:
        return None

    async def append(self, key: bytes, value: bytes | None) -> int:
        return await self.append_many([(key, value)])

    async def append_many(self, items: Sequence[tuple[bytes, bytes | None]]) -> int:
        for key, value in items:
            self._topic.records.append(LogRecord(len(self._topic.records), key, value, 0))
        grew, self._topic.grew = self._topic.grew, trio.Event()
        grew.set()
        return len(self._topic.records) - 1

    async def end_offset(self) -> int:
        return len(self._topic.records)

    async def read(self, offset: int, max_wait: float = 0.5) -> tuple[list[LogRecord], int]:
        with trio.move_on_after(max_wait):
            while offset >= len(self._topic.records) or (self.lagging and self._topic.hold):
                await self._topic.grew.wait()
        if self.lagging and self._topic.hold:
            return [], offset
        records = self._topic.records[offset:]
        return records, offset + len(records)

    async def aclose(self) -> None:
        return None


class CountingKms(InMemoryKms):
    """The master key: an in-memory KMS (its own keys) that counts its calls."""

    def __init__(self) -> None:
        super().__init__({})
        self.calls: list[str] = []

    async def wrap(self, key_id: str, dek: bytes) -> bytes:
        self.calls.append("wrap")
        return await super().wrap(key_id, dek)

    async def unwrap(self, key_id: str, edek: bytes) -> bytes:
        self.calls.append("unwrap")
        return await super().unwrap(key_id, edek)


class Node:
    def __init__(self, topic: Topic, master: CountingKms, lagging: bool = False) -> None:
        self.events = KeyEvents()
        self.store = KeyStore(FakeLog(topic, lagging=lagging), FakeLog(topic), self.events, poll=5.0)
        self.kms = GatewayKms(self.store, master, "master", master_ref="connection://VAULT/master")
        self.gone: list[str] = []
        self.events.listen(self.gone.append)


def run(test: Callable[[Topic, CountingKms, trio.Nursery], Awaitable[None]]) -> None:
    async def main() -> None:
        topic, master = Topic(), CountingKms()
        async with trio.open_nursery() as nursery:
            await test(topic, master, nursery)
            nursery.cancel_scope.cancel()

    trio.run(main)


def started(nursery: trio.Nursery, *nodes: Node) -> None:
    for node in nodes:
        nursery.start_soon(node.store.run)


async def until(condition: Callable[[], bool]) -> None:
    with trio.fail_after(5):
        while not condition():
            await trio.sleep(0.01)  # (a polling wait for a condition, bounded by fail_after)


def test_one_kek_per_key_id_wrapped_by_the_master_and_stored_in_the_topic() -> None:
    async def test(topic: Topic, master: CountingKms, nursery: trio.Nursery) -> None:
        node = Node(topic, master)
        started(nursery, node)
        deks = [bytes([i]) * 32 for i in range(3)]
        edeks = [await node.kms.wrap("user-alice.smith", dek) for dek in deks]
        assert master.calls == ["wrap"]  # one KEK for the key id, made once
        assert len(topic.records) == 1
        record = topic.records[0]
        assert json.loads(record.key) == {
            "keyId": "gateway-kms://user-alice.smith",
            "uuid": json.loads(record.value or b"")["uuid"],
        }
        value = json.loads(record.value or b"")
        assert value["algorithm"] == "AES256_GCM" and value["masterKeyId"] == "connection://VAULT/master"
        assert {e[1:17] for e in edeks} == {edeks[0][1:17]}  # every EDEK names the same KEK
        assert [await node.kms.unwrap("user-alice.smith", e) for e in edeks] == deks
        with pytest.raises(KmsError):  # a key id's EDEK is bound to it
            await node.kms.unwrap("user-bob", edeks[0])
        await node.kms.wrap("user-bob", b"b" * 16)
        assert len(topic.records) == 2 and master.calls == ["wrap", "wrap"]

    run(test)


def test_another_node_reads_keys_from_the_topic_through_the_master() -> None:
    async def test(topic: Topic, master: CountingKms, nursery: trio.Nursery) -> None:
        a, b = Node(topic, master), Node(topic, master)
        started(nursery, a, b)
        edek = await a.kms.wrap("tenant-1", b"k" * 32)
        assert await b.kms.unwrap("tenant-1", edek) == b"k" * 32  # (b reads the topic to its end first)
        assert master.calls == ["wrap", "unwrap"]
        assert await b.kms.unwrap("tenant-1", edek) == b"k" * 32
        assert master.calls == ["wrap", "unwrap"]  # the KEK is cached
        assert await b.kms.wrap("tenant-1", b"x" * 32)  # the same KEK: nothing new in the topic
        assert len(topic.records) == 1

    run(test)


def test_two_nodes_racing_keep_both_keys_and_converge_on_the_first() -> None:
    async def test(topic: Topic, master: CountingKms, nursery: trio.Nursery) -> None:
        a, b = Node(topic, master), Node(topic, master)
        started(nursery, a, b)
        # b cannot see a's key before making its own: both make one
        gate = trio.Event()
        made = a.kms._make

        async def slow_make(key_id: str, uuid: str) -> tuple[bytes, str]:
            await gate.wait()
            return await made(key_id, uuid)

        a.kms._make = slow_make  # type: ignore[method-assign]
        results: dict[str, bytes] = {}

        async def wrap_on(name: str, node: Node) -> None:
            results[name] = await node.kms.wrap("user-1", name.encode() * 16)

        nursery.start_soon(wrap_on, "a", a)
        await trio.testing.wait_all_tasks_blocked()
        await wrap_on("b", b)  # b's key is first in the topic
        gate.set()
        await until(lambda: "a" in results)
        assert len(topic.records) == 2
        uuids = [json.loads(r.value or b"")["uuid"] for r in topic.records]
        first = uuidlib.UUID(uuids[0]).bytes
        assert results["b"][1:17] == results["a"][1:17] == first  # a uses b's key, first in the topic
        for node in (a, b):
            assert await node.kms.unwrap("user-1", results["a"]) == b"a" * 16
            assert await node.kms.unwrap("user-1", results["b"]) == b"b" * 16
            current = node.store.current("user-1")
            assert current is not None and current.uuid == uuids[0]

    run(test)


def test_one_node_makes_one_key_for_concurrent_first_uses() -> None:
    async def test(topic: Topic, master: CountingKms, nursery: trio.Nursery) -> None:
        node = Node(topic, master)
        started(nursery, node)
        async with trio.open_nursery() as inner:
            for i in range(5):
                inner.start_soon(node.kms.wrap, "user-7", bytes([i]) * 16)
        assert len(topic.records) == 1 and master.calls == ["wrap"]

    run(test)


def test_deletion_shreds_on_every_node_and_a_new_use_gets_a_fresh_key() -> None:
    async def test(topic: Topic, master: CountingKms, nursery: trio.Nursery) -> None:
        a, b = Node(topic, master), Node(topic, master)
        started(nursery, a, b)
        old = await a.kms.wrap("user-alice", b"o" * 32)
        other = await a.kms.wrap("user-bob", b"p" * 32)
        assert await b.kms.unwrap("user-alice", old) == b"o" * 32

        assert await a.store.delete("user-alice") == 1
        assert a.gone == ["gateway-kms://user-alice"]  # at once on the deleting node
        with pytest.raises(KmsKeyNotFound, match="deleted"):
            await a.kms.unwrap("user-alice", old)
        await until(lambda: b.gone == ["gateway-kms://user-alice"])  # the other node's follower
        with pytest.raises(KmsKeyNotFound):
            await b.kms.unwrap("user-alice", old)  # (its cached KEK is not used)
        assert await b.kms.unwrap("user-bob", other) == b"p" * 32
        assert topic.records[-1].value is None  # a tombstone

        new = await b.kms.wrap("user-alice", b"n" * 32)
        assert new[1:17] != old[1:17]
        assert await a.kms.unwrap("user-alice", new) == b"n" * 32
        with pytest.raises(KmsKeyNotFound):
            await a.kms.unwrap("user-alice", old)  # for ever
        assert await a.store.delete("nobody") == 0

    run(test)


def test_deletion_removes_every_key_of_the_key_id() -> None:
    async def test(topic: Topic, master: CountingKms, nursery: trio.Nursery) -> None:
        node = Node(topic, master)
        started(nursery, node)
        # two keys of one key id in the topic (a race between nodes)
        await node.kms.wrap("user-2", b"a" * 16)
        first = topic.records[0]
        value = json.loads(first.value or b"")
        value["uuid"] = "00000000-0000-4000-8000-000000000001"
        await FakeLog(topic).append(record_key("user-2", value["uuid"]), json.dumps(value).encode())
        await node.store.sync()
        assert len(node.store.entries("user-2")) == 2
        assert await node.store.delete("user-2") == 2
        assert node.store.entries("user-2") == [] and node.gone == ["gateway-kms://user-2"] * 2

    run(test)


def test_a_lagging_node_reads_to_the_end_before_saying_not_found() -> None:
    async def test(topic: Topic, master: CountingKms, nursery: trio.Nursery) -> None:
        a = Node(topic, master)
        b = Node(topic, master, lagging=True)
        started(nursery, a, b)
        await b.store.sync()
        topic.hold = True
        edek = await a.kms.wrap("user-3", b"z" * 32)
        with trio.move_on_after(0.05) as scope:
            await b.kms.unwrap("user-3", edek)
        assert scope.cancelled_caught  # b waits for its follower instead of answering "not found"
        topic.hold = False
        grew, topic.grew = topic.grew, trio.Event()
        grew.set()
        assert await b.kms.unwrap("user-3", edek) == b"z" * 32

    run(test)


def test_the_dek_manager_forgets_a_deleted_key_id() -> None:
    async def test(topic: Topic, master: CountingKms, nursery: trio.Nursery) -> None:
        node = Node(topic, master)
        started(nursery, node)
        deks = DekManager()
        node.events.listen(lambda ref: deks.forget(node.kms, ref[len(GATEWAY_KMS) :]))
        ref = "gateway-kms://user-4"
        sealer = await deks.sealer(node.kms, "user-4", AES, key_ref=ref)
        envelope = parse(sealer.seal(b"secret", b"aad", 1))
        assert envelope is not None
        kept = await deks.sealer(node.kms, "user-5", AES, key_ref="gateway-kms://user-5")
        assert deks.opener_now(node.kms, "user-4", envelope.edek) is not None
        assert deks.sealer_now(node.kms, "user-4", AES, key_ref=ref) is not None

        await node.store.delete("user-4")
        assert deks.sealer_now(node.kms, "user-4", AES, key_ref=ref) is None  # a new DEK next
        assert deks.opener_now(node.kms, "user-4", envelope.edek) is None
        with pytest.raises(KmsKeyNotFound):
            await deks.opener(node.kms, "user-4", envelope.edek)
        assert deks.sealer_now(node.kms, "user-5", AES, key_ref="gateway-kms://user-5") is kept  # untouched
        fresh = await deks.sealer(node.kms, "user-4", AES, key_ref=ref)
        reopened = parse(fresh.seal(b"new", b"aad", 1))
        assert reopened is not None and reopened.edek[1:17] != envelope.edek[1:17]
        opener = await DekManager().opener(node.kms, "user-4", reopened.edek)
        assert opener.open(reopened, b"aad") == b"new"

    run(test)


def test_an_unwrap_finding_the_key_gone_drops_the_current_dek_and_tells() -> None:
    async def main() -> None:
        kms = InMemoryKms({})
        told: list[tuple[str, str]] = []
        deks = DekManager(on_key_gone=lambda k, key_id: told.append((k.kind, key_id)))
        sealer = await deks.sealer(kms, "orders", AES, key_ref="connection://VAULT/orders")
        envelope = parse(sealer.seal(b"v", b"", 1))
        assert envelope is not None
        kms.delete_key("orders")  # shredded in the external KMS
        other = DekManager()
        with pytest.raises(KmsKeyNotFound):
            await other.opener(kms, "orders", envelope.edek)
        assert deks.sealer_now(kms, "orders", AES, key_ref="connection://VAULT/orders") is not None  # (not told)
        deks._openers.clear()
        with pytest.raises(KmsKeyNotFound):
            await deks.opener(kms, "orders", envelope.edek)
        assert told == [("in-memory-kms", "orders")]
        assert deks.sealer_now(kms, "orders", AES, key_ref="connection://VAULT/orders") is None
        fresh = await deks.sealer(kms, "orders", AES, key_ref="connection://VAULT/orders")  # a new key in the KMS
        assert fresh.edek != sealer.edek

    trio.run(main)


def test_key_events_hold_bound_methods_weakly() -> None:
    events = KeyEvents()
    heard: list[str] = []

    class Listener:
        def hear(self, ref: str) -> None:
            heard.append(ref)

    listener = Listener()
    events.listen(listener.hear)
    stop = events.listen(heard.append)
    events.publish("gateway-kms://a")
    assert heard == ["gateway-kms://a"] * 2
    del listener
    stop()
    events.publish("gateway-kms://b")
    assert heard == ["gateway-kms://a"] * 2 and len(events) == 0


CONNECTIONS = parse_kms_connections(
    {
        "GATEWAY_EXTERNAL_CONNECTION_VAULT_TYPE": "VAULT",
        "GATEWAY_EXTERNAL_CONNECTION_VAULT_CONFIG_URI": "http://127.0.0.1:1",
        "GATEWAY_EXTERNAL_CONNECTION_VAULT_CONFIG_TOKEN": "t",
    },
    {},
)


def test_the_locator_resolves_bare_key_ids_to_the_gateway_kms() -> None:
    store = KeyStore(FakeLog(Topic()), FakeLog(Topic()), KeyEvents())
    locator = Locator(CONNECTIONS, KmsPool(), "VAULT", None, GatewayBlock("master", 10), lambda: store)
    assert locator.check("user-{{record.key}}", None, "f") == "user-{{record.key}}"
    where = locator.locate("user-alice.smith@example.com")
    assert isinstance(where.kms, GatewayKms) and where.kms.master_ref == "connection://VAULT/master"
    assert (where.key_id, where.key_ref) == (
        "user-alice.smith@example.com",
        "gateway-kms://user-alice.smith@example.com",
    )
    assert where.kms.max_keys == 10
    assert locator.find("gateway-kms://user-x") == (where.kms, "user-x")
    assert locator.reach("gateway-kms://user-x") == (where.kms, "user-x")
    master, key_id = locator.find("connection://VAULT/cards")  # a connection's key still reads
    assert key_id == "cards" and master is where.kms.master
    assert locator.ref_of(master, "cards") == "connection://VAULT/cards"
    with pytest.raises(InterceptorConfigError, match="keyId"):
        locator.check(None, "vault-kms://h/transit/keys/k", "f")
    with pytest.raises(InterceptorConfigError, match="control"):
        locator.locate("bad\nkey")


def test_the_locator_refuses_a_gateway_block_it_cannot_use() -> None:
    store = KeyStore(FakeLog(Topic()), FakeLog(Topic()), KeyEvents())
    with pytest.raises(InterceptorConfigError, match="kmsConnectionName"):
        Locator(CONNECTIONS, KmsPool(), None, None, GatewayBlock("master"), lambda: store)
    with pytest.raises(InterceptorConfigError, match="masterKeyId"):
        Locator(CONNECTIONS, KmsPool(), "VAULT", None, GatewayBlock("{{record.key}}"), lambda: store)
    with pytest.raises(InterceptorConfigError, match="maxKeys"):
        Locator(CONNECTIONS, KmsPool(), "VAULT", None, GatewayBlock("master", 0), lambda: store)
    plain = Locator(CONNECTIONS, KmsPool(), "VAULT", None)
    with pytest.raises(InterceptorConfigError, match="gateway block"):
        plain.find("gateway-kms://user-x")  # a decrypter without the block cannot read gateway keys
    assert plain.reach("gateway-kms://user-x") is None
