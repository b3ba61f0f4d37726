"""The basic provider: HTTP Basic credentials checked against the bcrypt hashes of a JSON file.

The file (``BASIC_AUTH_LOCATION``)::

    {"users": [
        {"username": "orders-app", "password_hash": "$2b$12$..."},
        {"username": "local-dev", "password": "only with BASIC_AUTH_ALLOW_PLAINTEXT=true"}
    ]}

Startup refuses a missing or malformed file, a duplicate user, an invalid hash, and a plaintext
password unless ``BASIC_AUTH_ALLOW_PLAINTEXT`` is true. The file is read again every
``BASIC_AUTH_RELOAD_INTERVAL``; a changed file that validates replaces the credential set, a broken
one is never applied (the last good set stays); each outcome is counted in
``basic_auth_credentials_reload_total{outcome="success"|"failure"}``.

Verified (username, password) pairs are cached two minutes, at most 1,024 of them, successes only,
keyed by a MAC of the pair (keyed BLAKE2b) under a per-process random key (the password itself is
never stored). A cached pair used in the last 30 s of its two minutes is checked again in the
background (a thread of its own at the lowest CPU priority) and, when still valid, cached for two
more minutes: a pair in steady use never makes its requests wait for bcrypt, where an expiry would
hold every request of that pair for a whole bcrypt run (a few hundred milliseconds at cost 12). A
cached pair counts only while the active set still holds that user with the same hash, so a user
removed from the file is revoked at the next reload whatever the cache holds. A wrong password
always pays the full bcrypt cost, an unknown user pays it too (against a dummy hash of the highest
cost in the file), and a password over 72 bytes is a plain 401.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import bcrypt
import orjson
import trio

from kanal_registry_proxy.background import run_at_low_priority
from kanal_registry_proxy.metrics import ProxyMetrics

log = logging.getLogger(__name__)

MAX_PASSWORD_BYTES = 72
CACHE_TTL = 120.0
REFRESH_AHEAD = 30.0  # a pair used this close to its expiry is checked again in the background
CACHE_SIZE = 1024
_BCRYPT = re.compile(rb"^\$2[abxy]?\$(\d\d)\$[./A-Za-z0-9]{53}$")


class CredentialsError(ValueError):
    """The credentials file is missing or invalid."""


@dataclass(frozen=True, slots=True)
class UserEntry:
    username: str
    secret: bytes  # a bcrypt hash, or the plaintext password when plaintext
    plaintext: bool = False

    @property
    def cost(self) -> int:
        match = _BCRYPT.match(self.secret)
        return int(match.group(1)) if match else 0


def parse_credentials(data: bytes, allow_plaintext: bool) -> dict[str, UserEntry]:
    """The users of a credentials file's contents, or CredentialsError saying what is wrong."""
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise CredentialsError(f"not valid JSON: {exc}") from None
    users = document.get("users") if isinstance(document, dict) else None
    if not isinstance(users, list):
        raise CredentialsError('expected an object with a "users" list')
    found: dict[str, UserEntry] = {}
    for index, item in enumerate(users):
        where = f"users[{index}]"
        if not isinstance(item, dict):
            raise CredentialsError(f"{where}: expected an object")
        unknown = set(item) - {"username", "password_hash", "password"}
        if unknown:
            raise CredentialsError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        username = item.get("username")
        if not isinstance(username, str) or not username or ":" in username:
            raise CredentialsError(f"{where}: username must be a non-empty string without ':'")
        if username in found:
            raise CredentialsError(f"{where}: duplicate user {username!r}")
        hashed, plain = item.get("password_hash"), item.get("password")
        if (hashed is None) == (plain is None):
            raise CredentialsError(f"{where} ({username}): give exactly one of password_hash and password")
        if hashed is not None:
            match = _BCRYPT.match(hashed.encode()) if isinstance(hashed, str) else None
            if match is None or not isinstance(hashed, str):
                raise CredentialsError(f"{where} ({username}): password_hash is not a valid bcrypt hash")
            cost = int(match.group(1))
            if not 4 <= cost <= 31:
                raise CredentialsError(f"{where} ({username}): bcrypt cost {cost} is outside 4-31")
            found[username] = UserEntry(username, hashed.encode())
        else:
            if not allow_plaintext:
                raise CredentialsError(
                    f"{where} ({username}): plaintext passwords are rejected unless BASIC_AUTH_ALLOW_PLAINTEXT=true"
                )
            if not isinstance(plain, str) or not plain:
                raise CredentialsError(f"{where} ({username}): password must be a non-empty string")
            if len(plain.encode()) > MAX_PASSWORD_BYTES:
                raise CredentialsError(f"{where} ({username}): password longer than {MAX_PASSWORD_BYTES} bytes")
            found[username] = UserEntry(username, plain.encode(), plaintext=True)
    return found


def read_credentials(path: str, allow_plaintext: bool) -> tuple[dict[str, UserEntry], bytes]:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise CredentialsError(f"cannot read {path}: {exc.strerror or exc}") from None
    return parse_credentials(data, allow_plaintext), hashlib.sha256(data).digest()


def parse_basic_header(header: str | None) -> tuple[str, bytes] | None:
    """(username, password bytes) of an ``Authorization: Basic`` header, or None."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic" or not value:
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


@dataclass(slots=True)
class _Verified:
    username: str
    secret: bytes
    expires: float


class BasicAuthenticator:
    """Checks Basic credentials; reloads its file in :meth:`run`."""

    provider = "basic"
    challenge = 'Basic realm="kanal-registry-proxy"'

    def __init__(
        self,
        path: str,
        reload_interval: float = 30.0,
        allow_plaintext: bool = False,
        metrics: ProxyMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_concurrent_checks: int = 4,
    ) -> None:
        self.path = path
        self.reload_interval = reload_interval
        self.allow_plaintext = allow_plaintext
        self.metrics = metrics
        self.clock = clock
        self.users: dict[str, UserEntry] = {}
        self._digest: bytes | None = None  # of the file content last seen (applied or refused)
        self._cache: OrderedDict[bytes, _Verified] = OrderedDict()
        self._key = os.urandom(32)
        self._dummy: dict[int, bytes] = {}
        self._dummy_cost = 4
        self._inflight: dict[bytes, trio.Event] = {}
        self._limiter = trio.CapacityLimiter(max_concurrent_checks)
        self._refreshing: set[bytes] = set()
        self._background: trio.Nursery | None = None  # while run() runs: where renewals go

    # -- the credential set -----------------------------------------------------------------

    def load(self) -> None:
        """The startup load: raises CredentialsError for a missing or invalid file."""
        users, digest = read_credentials(self.path, self.allow_plaintext)
        self._apply(users, digest)

    def _apply(self, users: dict[str, UserEntry], digest: bytes) -> None:
        self.users = users
        self._digest = digest
        costs = [u.cost for u in users.values() if not u.plaintext]
        self._dummy_cost = max(costs) if costs else 4
        if self._dummy_cost not in self._dummy:
            self._dummy[self._dummy_cost] = bcrypt.hashpw(os.urandom(16), bcrypt.gensalt(self._dummy_cost))
        if self.metrics is not None:
            self.metrics.credentials_users.set(len(users))

    def reload(self) -> str:
        """Reads the file again: ``success`` (a changed file applied), ``failure`` (a changed file
        refused, the last good set kept) or ``unchanged``."""
        try:
            with open(self.path, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            data = b""
            digest = b"missing"
            problem: str | None = f"cannot read {self.path}: {exc.strerror or exc}"
        else:
            digest = hashlib.sha256(data).digest()
            problem = None
        if digest == self._digest:
            return "unchanged"
        self._digest = digest
        users: dict[str, UserEntry] | None = None
        if problem is None:
            try:
                users = parse_credentials(data, self.allow_plaintext)
            except CredentialsError as exc:
                problem = str(exc)
        if users is None:
            log.error(
                "credentials file %s not applied, the last good set (%d users) stays active: %s",
                self.path,
                len(self.users),
                problem,
                extra={"event": "basic_auth_reload", "outcome": "failure"},
            )
            outcome = "failure"
        else:
            removed = sorted(set(self.users) - set(users))
            self._apply(users, digest)
            log.info(
                "credentials file %s reloaded: %d users%s",
                self.path,
                len(users),
                f", revoked {', '.join(removed)}" if removed else "",
                extra={"event": "basic_auth_reload", "outcome": "success", "revoked": removed},
            )
            outcome = "success"
        if self.metrics is not None:
            self.metrics.credentials_reload.labels(outcome).inc()
        return outcome

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Reloads the file every interval; while it runs, cached pairs are renewed in the background."""
        async with trio.open_nursery() as nursery:
            self._background = nursery
            task_status.started()
            try:
                while True:
                    await trio.sleep(self.reload_interval)
                    self.reload()
            finally:
                self._background = None

    # -- checking credentials -----------------------------------------------------------------

    def _key_of(self, username: str, password: bytes) -> bytes:
        # keyed BLAKE2b: a MAC like HMAC-SHA256, at a third of its cost per request
        return hashlib.blake2b(username.encode() + b"\x00" + password, key=self._key, digest_size=32).digest()

    def _cached(self, key: bytes) -> _Verified | None:
        entry = self._cache.get(key)
        if entry is None:
            return None
        user = self.users.get(entry.username)
        if entry.expires <= self.clock() or user is None or user.secret != entry.secret:
            del self._cache[key]  # expired, revoked or changed
            return None
        return entry

    def _remember(self, key: bytes, user: UserEntry) -> None:
        self._cache[key] = _Verified(user.username, user.secret, self.clock() + CACHE_TTL)
        self._cache.move_to_end(key)
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)

    async def authenticate(self, header: str | None) -> str | None:
        """The principal (username) for valid credentials, else None."""
        credentials = parse_basic_header(header)
        if credentials is None:
            self._count("malformed")
            return None
        username, password = credentials
        if len(password) > MAX_PASSWORD_BYTES:
            self._count("failure")
            return None
        key = self._key_of(username, password)
        entry = self._cached(key)
        if entry is not None:
            self._cache_hit(True)
            self._count("success")
            if (
                entry.expires - self.clock() < REFRESH_AHEAD
                and self._background is not None
                and key not in self._refreshing
            ):
                self._refreshing.add(key)
                self._background.start_soon(self._renew, key, username, password)
            return entry.username
        self._cache_hit(False)
        while key in self._inflight:  # the same pair is being checked: share its bcrypt run
            await self._inflight[key].wait()
            entry = self._cached(key)
            if entry is not None:
                self._count("success")
                return entry.username
        done = self._inflight[key] = trio.Event()
        try:
            ok, user = await self._check(username, password)
        finally:
            del self._inflight[key]
            done.set()
        if ok and user is not None:
            self._remember(key, user)
            self._count("success")
            return user.username
        self._count("failure")
        return None

    async def _renew(self, key: bytes, username: str, password: bytes) -> None:
        """Checks a cached pair again before it expires; cached for another two minutes when still
        valid, forgotten otherwise. Requests keep using the cached pair meanwhile."""
        try:
            user = self.users.get(username)
            if user is None:
                ok = False
            elif user.plaintext:
                ok = hmac.compare_digest(password, user.secret)
            else:
                secret = user.secret
                ok = await run_at_low_priority(lambda: _checkpw(password, secret))
            current = self.users.get(username)  # the set may have been reloaded meanwhile
            if ok and user is not None and current is not None and current.secret == user.secret:
                self._remember(key, current)
            else:
                self._cache.pop(key, None)
        finally:
            self._refreshing.discard(key)

    async def _check(self, username: str, password: bytes) -> tuple[bool, UserEntry | None]:
        user = self.users.get(username)
        if user is None:  # same cost as a wrong password
            await trio.to_thread.run_sync(
                bcrypt.checkpw, password, self._dummy[self._dummy_cost], limiter=self._limiter
            )
            return False, None
        if user.plaintext:
            return hmac.compare_digest(password, user.secret), user
        try:
            ok = await trio.to_thread.run_sync(bcrypt.checkpw, password, user.secret, limiter=self._limiter)
        except ValueError:
            return False, None
        # the set may have been reloaded meanwhile: only a user still there with that hash counts
        current = self.users.get(username)
        return ok and current is not None and current.secret == user.secret, current

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.authenticated(self.provider, outcome)

    def _cache_hit(self, hit: bool) -> None:
        if self.metrics is not None:
            self.metrics.cache_lookup("credentials", hit)


def _checkpw(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:
        return False


def hash_password(password: str, rounds: int = 12) -> str:
    """A bcrypt hash for the credentials file."""
    raw = password.encode()
    if len(raw) > MAX_PASSWORD_BYTES:
        raise ValueError(f"passwords are at most {MAX_PASSWORD_BYTES} bytes (bcrypt)")
    return bcrypt.hashpw(raw, bcrypt.gensalt(rounds)).decode()
