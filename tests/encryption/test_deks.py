"""The DEK manager's cache logic, over a small in-test KMS and a fake clock (no sleeps)."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing
from kanal_encryption.crypto import Algorithm, DekManager, Opener, Sealer, parse
from kanal_encryption.kms.base import Kms, KmsError, KmsKeyNotFound

AES = Algorithm.AES128_GCM
REF = "conn:TEST/orders"


class Clock:
    """Monotonic seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeKms:
    """Wraps a DEK by remembering it under a fresh EDEK; a key not in ``keys`` is not found."""

    kind = "fake"

    def __init__(self, clock: Clock | None = None, *keys: str) -> None:
        self.keys = set(keys or ("orders",))
        self.stored: dict[bytes, tuple[str, bytes]] = {}
        self.calls: list[tuple[str, str]] = []
        self.gate: trio.Event | None = None  # when set, calls wait for it
        self.latency = 0.0  # seconds each call advances the clock
        self.fail: Exception | None = None
        self.clock = clock

    async def _enter(self, operation: str, key_id: str) -> None:
        self.calls.append((operation, key_id))
        if self.gate is not None:
            await self.gate.wait()
        if self.clock is not None:
            self.clock.now += self.latency
        if self.fail is not None:
            raise self.fail
        if key_id not in self.keys:
            raise KmsKeyNotFound(f"no key {key_id!r}")

    async def wrap(self, key_id: str, dek: bytes) -> bytes:
        await self._enter("wrap", key_id)
        edek = b"edek-" + os.urandom(8).hex().encode()
        self.stored[edek] = (key_id, dek)
        return edek

    async def unwrap(self, key_id: str, edek: bytes) -> bytes:
        await self._enter("unwrap", key_id)
        found = self.stored.get(edek)
        if found is None or found[0] != key_id:
            raise KmsError("cannot unwrap", retriable=False)
        return found[1]

    async def check(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    def count(self, operation: str) -> int:
        return sum(1 for op, _ in self.calls if op == operation)


def run(test: Callable[[], Awaitable[None]]) -> None:
    trio.run(test)


def test_fake_kms_is_a_kms() -> None:
    assert isinstance(FakeKms(), Kms)


def test_reuses_the_dek_within_the_ttl() -> None:
    async def main() -> None:
        clock, kms = Clock(), FakeKms()
        deks = DekManager(clock=clock, key_ttl_ms=60_000)
        assert deks.sealer_now(kms, "orders", AES, key_ref=REF) is None
        first = await deks.sealer(kms, "orders", AES, 10, key_ref=REF)
        clock.now += 59.9
        assert deks.sealer_now(kms, "orders", AES, 10, key_ref=REF) is first
        assert await deks.sealer(kms, "orders", AES, key_ref=REF) is first
        assert kms.count("wrap") == 1
        assert (deks.stats.sealer_hits, deks.stats.sealer_misses, deks.stats.wraps) == (2, 1, 1)
        assert deks.cached_deks == 1

    run(main)


def test_rotates_after_the_ttl() -> None:
    async def main() -> None:
        clock, kms = Clock(), FakeKms()
        deks = DekManager(clock=clock, key_ttl_ms=60_000)
        first = await deks.sealer(kms, "orders", AES, key_ref=REF)
        clock.now += 60.0
        assert deks.sealer_now(kms, "orders", AES, key_ref=REF) is None
        second = await deks.sealer(kms, "orders", AES, key_ref=REF)
        assert second is not first and second.edek != first.edek
        assert kms.count("wrap") == 2 and deks.stats.deks_expired == 1

    run(main)


def test_rotates_after_max_records() -> None:
    async def main() -> None:
        kms = FakeKms()
        deks = DekManager(clock=Clock(), max_records=10)
        first = await deks.sealer(kms, "orders", AES, 6, key_ref=REF)
        assert deks.sealer_now(kms, "orders", AES, 4, key_ref=REF) is first  # 10 reserved: the limit
        assert deks.sealer_now(kms, "orders", AES, 1, key_ref=REF) is None
        second = await deks.sealer(kms, "orders", AES, 1, key_ref=REF)
        assert second is not first and deks.stats.deks_exhausted == 1
        big = await deks.sealer(kms, "orders", AES, 25, key_ref=REF)  # larger than the limit: its own DEK
        assert big is not second and kms.count("wrap") == 3
        assert deks.sealer_now(kms, "orders", AES, 1, key_ref=REF) is None

    run(main)


def test_ttl_zero_wraps_a_dek_per_call() -> None:
    async def main() -> None:
        kms = FakeKms()
        deks = DekManager(clock=Clock(), key_ttl_ms=0)
        one = await deks.sealer(kms, "orders", AES, key_ref=REF)
        two = await deks.sealer(kms, "orders", AES, key_ref=REF)
        assert one is not two and kms.count("wrap") == 2
        assert deks.sealer_now(kms, "orders", AES, key_ref=REF) is None
        assert deks.cached_deks == 0 and deks.cached_openers == 0

    run(main)


def test_one_dek_per_kms_key_algorithm_and_reference() -> None:
    async def main() -> None:
        kms, other = FakeKms(None, "orders", "users"), FakeKms()
        deks = DekManager(clock=Clock())
        made = {
            await deks.sealer(kms, "orders", AES, key_ref=REF),
            await deks.sealer(kms, "users", AES, key_ref=REF),
            await deks.sealer(kms, "orders", Algorithm.XCHACHA20_POLY1305, key_ref=REF),
            await deks.sealer(kms, "orders", AES, key_ref="conn:OTHER/orders"),
            await deks.sealer(other, "orders", AES, key_ref=REF),
        }
        assert len(made) == 5
        xchacha = await deks.sealer(kms, "orders", Algorithm.XCHACHA20_POLY1305, key_ref=REF)
        assert xchacha.algorithm is Algorithm.XCHACHA20_POLY1305 and xchacha.key_ref == REF

    run(main)


def test_lru_bounds_current_deks() -> None:
    async def main() -> None:
        kms = FakeKms(None, "a", "b", "c")
        deks = DekManager(clock=Clock(), max_deks=2)
        a = await deks.sealer(kms, "a", AES, key_ref="a")
        await deks.sealer(kms, "b", AES, key_ref="b")
        assert deks.sealer_now(kms, "a", AES, key_ref="a") is a  # a is now the most recent
        await deks.sealer(kms, "c", AES, key_ref="c")
        assert deks.cached_deks == 2
        assert deks.sealer_now(kms, "b", AES, key_ref="b") is None
        assert deks.sealer_now(kms, "a", AES, key_ref="a") is a

    run(main)


def test_concurrent_misses_share_one_wrap() -> None:
    async def main() -> None:
        kms = FakeKms()
        kms.gate = trio.Event()
        deks = DekManager(clock=Clock())
        got: list[Sealer] = []

        async def ask() -> None:
            got.append(await deks.sealer(kms, "orders", AES, 3, key_ref=REF))

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(ask)
            await trio.testing.wait_all_tasks_blocked()
            assert kms.count("wrap") == 1
            kms.gate.set()
        assert len(got) == 5 and len(set(got)) == 1
        assert kms.count("wrap") == 1
        assert (deks.stats.sealer_misses, deks.stats.wraps) == (5, 1)

    run(main)


def test_waiters_beyond_max_records_lead_the_next_wrap() -> None:
    async def main() -> None:
        kms = FakeKms()
        kms.gate = trio.Event()
        deks = DekManager(clock=Clock(), max_records=4)
        got: list[Sealer] = []

        async def ask() -> None:
            got.append(await deks.sealer(kms, "orders", AES, 2, key_ref=REF))

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(ask)
            await trio.testing.wait_all_tasks_blocked()
            kms.gate.set()
        assert len(got) == 4 and len(set(got)) == 2
        assert kms.count("wrap") == 2

    run(main)


def test_a_cancelled_wrap_lets_a_waiter_try_again() -> None:
    async def main() -> None:
        kms = FakeKms()
        kms.gate = trio.Event()
        deks = DekManager(clock=Clock())
        leader_scope = trio.CancelScope()
        got: list[Sealer] = []

        async def leader() -> None:
            with leader_scope:
                await deks.sealer(kms, "orders", AES, key_ref=REF)

        async def waiter() -> None:
            got.append(await deks.sealer(kms, "orders", AES, key_ref=REF))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(leader)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            assert kms.count("wrap") == 1
            leader_scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert kms.count("wrap") == 2  # the waiter led a call of its own
            kms.gate.set()
        assert leader_scope.cancelled_caught
        assert len(got) == 1
        assert deks.sealer_now(kms, "orders", AES, key_ref=REF) is got[0]
        assert deks.stats.wrap_failures == 1  # the cancelled call

    run(main)


def test_concurrent_unwraps_share_one_call() -> None:
    async def main() -> None:
        kms = FakeKms()
        sealing = DekManager(clock=Clock())
        sealer = await sealing.sealer(kms, "orders", AES, key_ref=REF)
        envelope = parse(sealer.seal(b"value", b"aad"))
        assert envelope is not None
        deks = DekManager(clock=Clock())  # another gateway: nothing cached
        kms.gate = trio.Event()
        got: list[Opener] = []

        async def ask() -> None:
            got.append(await deks.opener(kms, "orders", envelope.edek))

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(ask)
            await trio.testing.wait_all_tasks_blocked()
            kms.gate.set()
        assert len(set(got)) == 1 and kms.count("unwrap") == 1
        assert got[0].open(envelope, b"aad") == b"value"
        assert deks.opener_now(kms, "orders", envelope.edek) is got[0]
        assert (deks.stats.opener_misses, deks.stats.opener_hits, deks.stats.unwraps) == (4, 1, 1)

    run(main)


def test_ttl_zero_shares_in_flight_unwraps_but_caches_nothing() -> None:
    async def main() -> None:
        kms = FakeKms()
        edek = (await DekManager(clock=Clock()).sealer(kms, "orders", AES, key_ref=REF)).edek
        deks = DekManager(clock=Clock(), key_ttl_ms=0)
        kms.gate = trio.Event()
        got: list[Opener] = []

        async def ask() -> None:
            got.append(await deks.opener(kms, "orders", edek))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask)
            nursery.start_soon(ask)
            await trio.testing.wait_all_tasks_blocked()
            kms.gate.set()
        assert len(set(got)) == 1 and kms.count("unwrap") == 1
        assert deks.opener_now(kms, "orders", edek) is None
        await deks.opener(kms, "orders", edek)
        assert kms.count("unwrap") == 2

    run(main)


def test_unwrapped_deks_expire_after_the_ttl_and_are_lru_bounded() -> None:
    async def main() -> None:
        clock, kms = Clock(), FakeKms()
        maker = DekManager(clock=clock, key_ttl_ms=0)
        edeks = [(await maker.sealer(kms, "orders", AES, key_ref=REF)).edek for _ in range(3)]
        deks = DekManager(clock=clock, key_ttl_ms=10_000, max_openers=2)
        first = await deks.opener(kms, "orders", edeks[0])
        clock.now += 9.9
        assert deks.opener_now(kms, "orders", edeks[0]) is first
        clock.now += 0.1
        assert deks.opener_now(kms, "orders", edeks[0]) is None
        await deks.opener(kms, "orders", edeks[0])
        assert kms.count("unwrap") == 2
        await deks.opener(kms, "orders", edeks[1])
        await deks.opener(kms, "orders", edeks[2])
        assert deks.cached_openers == 2 and deks.stats.openers_evicted == 1
        assert deks.opener_now(kms, "orders", edeks[0]) is None

    run(main)


def test_own_deks_decrypt_without_an_unwrap() -> None:
    async def main() -> None:
        kms = FakeKms()
        deks = DekManager(clock=Clock())
        sealer = await deks.sealer(kms, "orders", Algorithm.CHACHA20_POLY1305, key_ref=REF)
        envelope = parse(sealer.seal(b"value", b"aad", 1))
        assert envelope is not None and envelope.key_ref == REF
        opener = deks.opener_now(kms, "orders", envelope.edek)
        assert opener is not None and opener.open(envelope, b"aad") == b"value"
        assert kms.count("unwrap") == 0

    run(main)


def test_key_not_found_on_unwrap_is_remembered() -> None:
    async def main() -> None:
        clock, kms = Clock(), FakeKms()
        edek = (await DekManager(clock=clock).sealer(kms, "orders", AES, key_ref=REF)).edek
        kms.keys.discard("orders")  # shredded
        deks = DekManager(clock=clock)
        with pytest.raises(KmsKeyNotFound, match="no key 'orders'"):
            await deks.opener(kms, "orders", edek)
        with pytest.raises(KmsKeyNotFound, match="no key 'orders'"):
            deks.opener_now(kms, "orders", edek)
        with pytest.raises(KmsKeyNotFound):
            await deks.opener(kms, "orders", edek)
        assert kms.count("unwrap") == 1
        assert (deks.stats.not_found_hits, deks.stats.unwrap_failures) == (2, 1)
        clock.now += 30.0
        assert deks.opener_now(kms, "orders", edek) is None
        with pytest.raises(KmsKeyNotFound):
            await deks.opener(kms, "orders", edek)
        assert kms.count("unwrap") == 2

    run(main)


def test_key_not_found_on_wrap_is_remembered() -> None:
    async def main() -> None:
        clock, kms = Clock(), FakeKms()
        deks = DekManager(clock=clock, not_found_ttl_ms=5_000)
        for _ in range(3):
            with pytest.raises(KmsKeyNotFound):
                await deks.sealer(kms, "missing", AES, key_ref=REF)
        with pytest.raises(KmsKeyNotFound):
            deks.sealer_now(kms, "missing", AES, key_ref=REF)
        assert kms.count("wrap") == 1
        kms.keys.add("missing")
        clock.now += 5.0
        await deks.sealer(kms, "missing", AES, key_ref=REF)
        assert kms.count("wrap") == 2

    run(main)


def test_waiters_share_a_not_found() -> None:
    async def main() -> None:
        kms = FakeKms()
        kms.gate = trio.Event()
        deks = DekManager(clock=Clock())
        errors: list[BaseException] = []

        async def ask() -> None:
            try:
                await deks.sealer(kms, "missing", AES, key_ref=REF)
            except KmsError as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(ask)
            await trio.testing.wait_all_tasks_blocked()
            kms.gate.set()
        assert len(errors) == 3 and all(type(e) is KmsKeyNotFound for e in errors)
        assert len({id(e) for e in errors}) == 3
        assert kms.count("wrap") == 1

    run(main)


def test_other_errors_are_not_remembered() -> None:
    async def main() -> None:
        kms = FakeKms()
        deks = DekManager(clock=Clock())
        kms.fail = KmsError("unreachable", retriable=True)
        for _ in range(2):
            with pytest.raises(KmsError, match="unreachable") as caught:
                await deks.sealer(kms, "orders", AES, key_ref=REF)
            assert caught.value.retriable
        assert kms.count("wrap") == 2 and deks.stats.wrap_failures == 2
        kms.fail = None
        await deks.sealer(kms, "orders", AES, key_ref=REF)

    run(main)


def test_a_kms_raising_something_else_gives_a_retriable_kms_error() -> None:
    async def main() -> None:
        kms = FakeKms()
        kms.fail = ConnectionResetError("reset")
        deks = DekManager(clock=Clock())
        with pytest.raises(KmsError, match=r"fake wrap of 'orders' failed: ConnectionResetError\('reset'\)") as caught:
            await deks.sealer(kms, "orders", AES, key_ref=REF)
        assert caught.value.retriable and isinstance(caught.value.__cause__, ConnectionResetError)

    run(main)


def test_a_kms_answering_nonsense_is_refused() -> None:
    class Bad(FakeKms):
        async def wrap(self, key_id: str, dek: bytes) -> bytes:
            return b""

        async def unwrap(self, key_id: str, edek: bytes) -> bytes:
            return b"short"

    async def main() -> None:
        deks = DekManager(clock=Clock())
        with pytest.raises(KmsError, match="returned no EDEK"):
            await deks.sealer(Bad(), "orders", AES, key_ref=REF)
        with pytest.raises(KmsError, match="returned no 16- or 32-byte DEK"):
            await deks.opener(Bad(), "orders", b"edek")

    run(main)


def test_counts_kms_latency_and_tells_the_observer() -> None:
    async def main() -> None:
        clock = Clock()
        kms = FakeKms(clock)
        kms.latency = 0.25
        seen: list[tuple[str, str, float, bool]] = []
        deks = DekManager(clock=clock, observe=lambda *call: seen.append(call))
        sealer = await deks.sealer(kms, "orders", AES, key_ref=REF)
        await DekManager(clock=clock, observe=lambda *call: seen.append(call)).opener(kms, "orders", sealer.edek)
        with pytest.raises(KmsKeyNotFound):
            await deks.opener(kms, "gone", b"edek")
        assert seen == [("wrap", "fake", 0.25, True), ("unwrap", "fake", 0.25, True), ("unwrap", "fake", 0.25, False)]
        stats = deks.stats
        assert (stats.wraps, stats.wrap_seconds, stats.unwraps, stats.unwrap_failures) == (1, 0.25, 1, 1)

    run(main)


def test_clear_forgets_everything() -> None:
    async def main() -> None:
        kms = FakeKms()
        deks = DekManager(clock=Clock())
        sealer = await deks.sealer(kms, "orders", AES, key_ref=REF)
        with pytest.raises(KmsKeyNotFound):
            await deks.sealer(kms, "missing", AES, key_ref=REF)
        deks.clear()
        assert deks.sealer_now(kms, "orders", AES, key_ref=REF) is None
        assert deks.sealer_now(kms, "missing", AES, key_ref=REF) is None
        assert deks.opener_now(kms, "orders", sealer.edek) is None

    run(main)


@pytest.mark.parametrize(
    "kwargs",
    [{"key_ttl_ms": -1}, {"not_found_ttl_ms": -1}, {"max_records": 0}, {"max_deks": 0}, {"max_openers": 0}],
)
def test_refuses_nonsense_settings(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=">= "):
        DekManager(**kwargs)  # type: ignore[arg-type]


def test_refuses_bad_requests_before_calling_the_kms() -> None:
    async def main() -> None:
        kms = FakeKms()
        deks = DekManager(clock=Clock())
        with pytest.raises(ValueError, match="records must be >= 1"):
            await deks.sealer(kms, "orders", AES, 0, key_ref=REF)
        with pytest.raises(ValueError, match="key reference"):
            await deks.sealer(kms, "orders", AES, key_ref="")
        assert kms.calls == []

    run(main)
