"""The basic provider: the credentials file, its reload states, the verified-credential cache, timing rules."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import trio
from kanal_registry_proxy import auth_basic
from kanal_registry_proxy.auth_basic import (
    CACHE_SIZE,
    BasicAuthenticator,
    CredentialsError,
    hash_password,
    parse_credentials,
)
from kanal_registry_proxy.metrics import ProxyMetrics


def header(user: str, password: str | bytes) -> str:
    raw = password if isinstance(password, bytes) else password.encode()
    return "Basic " + base64.b64encode(user.encode() + b":" + raw).decode()


def write(path: Path, users: dict[str, str], rounds: int = 4) -> None:
    path.write_text(
        json.dumps({"users": [{"username": u, "password_hash": hash_password(p, rounds)} for u, p in users.items()]})
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def counted_bcrypt(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Records each bcrypt check (the hash it was checked against)."""
    calls: list[bytes] = []
    real = bcrypt.checkpw

    def checkpw(password: bytes, hashed: bytes) -> bool:
        calls.append(hashed)
        return real(password, hashed)

    monkeypatch.setattr(auth_basic.bcrypt, "checkpw", checkpw)
    return calls


def reloads(metrics: ProxyMetrics, outcome: str) -> float:
    value = metrics.registry.get_sample_value("basic_auth_credentials_reload_total", {"outcome": outcome})
    return value or 0.0


def test_file_validation() -> None:
    good = hash_password("x", 4)
    assert set(parse_credentials(json.dumps({"users": [{"username": "a", "password_hash": good}]}).encode(), False))
    with pytest.raises(CredentialsError, match="users"):
        parse_credentials(b"[]", False)
    with pytest.raises(CredentialsError, match="duplicate user 'a'"):
        parse_credentials(
            json.dumps(
                {"users": [{"username": "a", "password_hash": good}, {"username": "a", "password_hash": good}]}
            ).encode(),
            False,
        )
    with pytest.raises(CredentialsError, match="not a valid bcrypt hash"):
        parse_credentials(json.dumps({"users": [{"username": "a", "password_hash": good[:-3]}]}).encode(), False)
    with pytest.raises(CredentialsError, match="without ':'"):
        parse_credentials(json.dumps({"users": [{"username": "a:b", "password_hash": good}]}).encode(), False)
    plain = json.dumps({"users": [{"username": "a", "password": "secret"}]}).encode()
    with pytest.raises(CredentialsError, match="BASIC_AUTH_ALLOW_PLAINTEXT"):
        parse_credentials(plain, False)
    assert parse_credentials(plain, True)["a"].plaintext


def test_reload_states(tmp_path: Path) -> None:
    path = tmp_path / "creds.json"
    write(path, {"alice": "a1", "bob": "b1"})
    metrics = ProxyMetrics()
    auth = BasicAuthenticator(str(path), metrics=metrics)
    auth.load()
    assert auth.reload() == "unchanged"
    # the file changes and validates: the new set is active
    write(path, {"alice": "a2", "bob": "b1", "carol": "c1"})
    assert auth.reload() == "success"
    assert set(auth.users) == {"alice", "bob", "carol"}
    assert reloads(metrics, "success") == 1
    # the file no longer parses: never applied, the last good set stays
    path.write_text('{"users": [')
    assert auth.reload() == "failure"
    assert set(auth.users) == {"alice", "bob", "carol"}
    assert reloads(metrics, "failure") == 1
    assert auth.reload() == "unchanged"  # the same broken content is not counted twice
    # an invalid hash, a duplicate user, a removed file: refused the same way
    path.write_text(json.dumps({"users": [{"username": "x", "password_hash": "plain"}]}))
    assert auth.reload() == "failure"
    path.unlink()
    assert auth.reload() == "failure"
    assert set(auth.users) == {"alice", "bob", "carol"}
    assert reloads(metrics, "failure") == 3


def test_removed_user_is_revoked_at_the_next_reload_whatever_the_cache(tmp_path: Path) -> None:
    path = tmp_path / "creds.json"
    write(path, {"alice": "a1", "bob": "b1"})
    auth = BasicAuthenticator(str(path))
    auth.load()

    async def main() -> None:
        assert await auth.authenticate(header("bob", "b1")) == "bob"
        assert await auth.authenticate(header("bob", "b1")) == "bob"  # now cached
        write(path, {"alice": "a1"})
        assert auth.reload() == "success"
        assert await auth.authenticate(header("bob", "b1")) is None  # revoked despite the cache
        assert await auth.authenticate(header("alice", "a1")) == "alice"

    trio.run(main)


def test_a_changed_password_invalidates_the_cached_pair(tmp_path: Path) -> None:
    path = tmp_path / "creds.json"
    write(path, {"alice": "old"})
    auth = BasicAuthenticator(str(path))
    auth.load()

    async def main() -> None:
        assert await auth.authenticate(header("alice", "old")) == "alice"
        write(path, {"alice": "new"})
        auth.reload()
        assert await auth.authenticate(header("alice", "old")) is None
        assert await auth.authenticate(header("alice", "new")) == "alice"

    trio.run(main)


# Not made of bcrypt's alphabet (./A-Za-z0-9): a random hash cannot contain it by chance.
PASSWORD = "a1-secret!"


def test_cache_keeps_successes_only_for_two_minutes_without_the_password(
    tmp_path: Path, counted_bcrypt: list[bytes]
) -> None:
    path = tmp_path / "creds.json"
    write(path, {"alice": PASSWORD})
    clock = Clock()
    metrics = ProxyMetrics()
    auth = BasicAuthenticator(str(path), metrics=metrics, clock=clock)
    auth.load()

    async def main() -> None:
        assert await auth.authenticate(header("alice", PASSWORD)) == "alice"
        assert await auth.authenticate(header("alice", PASSWORD)) == "alice"
        assert len(counted_bcrypt) == 1  # the second one came from the cache
        # failures are never cached: each wrong password pays the full bcrypt cost
        for _ in range(3):
            assert await auth.authenticate(header("alice", "wrong")) is None
        assert len(counted_bcrypt) == 4
        clock.now += 119
        assert await auth.authenticate(header("alice", PASSWORD)) == "alice"
        assert len(counted_bcrypt) == 4
        clock.now += 2  # two minutes after the check: checked again
        assert await auth.authenticate(header("alice", PASSWORD)) == "alice"
        assert len(counted_bcrypt) == 5

    trio.run(main)
    # the password is not stored anywhere in the cache
    for key, entry in auth._cache.items():
        assert PASSWORD.encode() not in key
        assert PASSWORD not in repr(entry)
    assert metrics.registry.get_sample_value("srp_cache_requests_total", {"cache": "credentials", "result": "hit"}) == 2


def test_cache_holds_at_most_1024_entries(tmp_path: Path) -> None:
    path = tmp_path / "creds.json"
    path.write_text(json.dumps({"users": [{"username": "u", "password": "p"}]}))
    auth = BasicAuthenticator(str(path), allow_plaintext=True)
    auth.load()
    user = auth.users["u"]
    for i in range(CACHE_SIZE + 50):
        auth._remember(auth._key_of("u", f"p{i}".encode()), user)
    assert len(auth._cache) == CACHE_SIZE


def test_unknown_user_pays_the_bcrypt_cost_and_long_passwords_are_a_plain_401(
    tmp_path: Path, counted_bcrypt: list[bytes]
) -> None:
    path = tmp_path / "creds.json"
    write(path, {"alice": "a1"}, rounds=5)
    auth = BasicAuthenticator(str(path))
    auth.load()

    async def main() -> None:
        assert await auth.authenticate(header("mallory", "whatever")) is None
        assert len(counted_bcrypt) == 1  # against a dummy hash of the file's cost
        assert counted_bcrypt[0].startswith(b"$2b$05$")
        assert await auth.authenticate(header("alice", b"x" * 73)) is None
        assert len(counted_bcrypt) == 1  # over 72 bytes: refused before bcrypt
        assert await auth.authenticate(header("alice", b"x" * 72)) is None
        assert len(counted_bcrypt) == 2
        assert await auth.authenticate(None) is None
        assert await auth.authenticate("Bearer abc") is None
        assert await auth.authenticate("Basic !!!") is None

    trio.run(main)


def test_plaintext_passwords_when_allowed(tmp_path: Path) -> None:
    path = tmp_path / "creds.json"
    path.write_text(json.dumps({"users": [{"username": "dev", "password": "dev-pass"}]}))
    auth = BasicAuthenticator(str(path), allow_plaintext=True)
    auth.load()

    async def main() -> None:
        assert await auth.authenticate(header("dev", "dev-pass")) == "dev"
        assert await auth.authenticate(header("dev", "nope")) is None

    trio.run(main)


def test_concurrent_checks_of_one_pair_share_one_bcrypt_run(tmp_path: Path, counted_bcrypt: list[bytes]) -> None:
    path = tmp_path / "creds.json"
    write(path, {"alice": "a1"}, rounds=6)
    auth = BasicAuthenticator(str(path))
    auth.load()
    results: list[Any] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(lambda: _collect(auth, results))

    trio.run(main)
    assert results == ["alice"] * 8
    assert len(counted_bcrypt) == 1


async def _collect(auth: BasicAuthenticator, results: list[Any]) -> None:
    results.append(await auth.authenticate(header("alice", "a1")))


def test_reload_loop_applies_changes(tmp_path: Path) -> None:
    path = tmp_path / "creds.json"
    write(path, {"alice": "a1"})
    auth = BasicAuthenticator(str(path), reload_interval=0.05)
    auth.load()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(auth.run)
            write(path, {"alice": "a1", "bob": "b1"})
            with trio.fail_after(5):
                while "bob" not in auth.users:
                    await trio.sleep(0.02)
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_pair_in_use_is_renewed_in_the_background_before_it_expires(
    tmp_path: Path, counted_bcrypt: list[bytes]
) -> None:
    path = tmp_path / "creds.json"
    write(path, {"alice": "a1"})
    clock = Clock()
    metrics = ProxyMetrics()
    auth = BasicAuthenticator(str(path), metrics=metrics, clock=clock)
    auth.load()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(auth.run)
            assert await auth.authenticate(header("alice", "a1")) == "alice"
            clock.now += 60  # not yet in the last 30 s of the two minutes: no renewal
            assert await auth.authenticate(header("alice", "a1")) == "alice"
            await trio.testing.wait_all_tasks_blocked()
            assert len(counted_bcrypt) == 1
            clock.now += 45  # 105 s: answered from the cache, and checked again in the background
            assert await auth.authenticate(header("alice", "a1")) == "alice"
            assert await auth.authenticate(header("alice", "a1")) == "alice"  # one renewal at a time
            with trio.fail_after(10):
                while auth._refreshing:
                    await trio.sleep(0.01)
            assert len(counted_bcrypt) == 2
            clock.now += 100  # 205 s: past the first expiry, within the renewed one
            assert await auth.authenticate(header("alice", "a1")) == "alice"
            assert len(counted_bcrypt) == 2
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert metrics.registry.get_sample_value("srp_cache_requests_total", {"cache": "credentials", "result": "hit"}) == 4


def test_a_renewal_that_fails_forgets_the_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "creds.json"
    write(path, {"alice": "a1"})
    clock = Clock()
    auth = BasicAuthenticator(str(path), clock=clock)
    auth.load()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(auth.run)
            assert await auth.authenticate(header("alice", "a1")) == "alice"
            monkeypatch.setattr(auth_basic.bcrypt, "checkpw", lambda password, hashed: False)
            clock.now += 100
            assert await auth.authenticate(header("alice", "a1")) == "alice"  # still cached meanwhile
            with trio.fail_after(10):
                while auth._refreshing:
                    await trio.sleep(0.01)
            assert not auth._cache
            assert await auth.authenticate(header("alice", "a1")) is None  # checked in the foreground
            nursery.cancel_scope.cancel()

    trio.run(main)
