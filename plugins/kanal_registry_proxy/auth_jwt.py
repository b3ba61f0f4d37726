"""The jwt provider: ``Authorization: Bearer <JWT>`` checked against a JWKS or a static key.

Checked on every token: the signature (an asymmetric algorithm of ``AUTH_JWT_ALGORITHMS``, with the
key the token's ``kid`` names in the JWKS at ``AUTH_JWT_JWKS_URL``, or the key in
``AUTH_JWT_PUBLIC_KEY``), ``iss`` equal to ``AUTH_JWT_ISSUER``, ``aud`` holding one of
``AUTH_JWT_AUDIENCE``, ``exp`` in the future (and ``nbf``/``iat`` when present), all within
``AUTH_JWT_LEEWAY``. The principal is the claim ``AUTH_JWT_PRINCIPAL_CLAIM`` (``sub`` by default; a
dotted path reaches nested claims, e.g. ``realm.account``); it must be a non-empty string.

The JWKS is fetched at startup and every ``AUTH_JWT_JWKS_REFRESH_INTERVAL``; a token naming an
unknown ``kid`` triggers a refresh (at most one every 30 s), so rotated keys are picked up at once.
Verified tokens are cached (1,024 entries, two minutes at most, never beyond their ``exp``).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import jwt
import orjson
import trio

from kanal_registry_proxy.metrics import ProxyMetrics
from kanal_registry_proxy.settings import JwtSettings
from kanal_registry_proxy.upstream import HttpClient, UpstreamError

log = logging.getLogger(__name__)

CACHE_SIZE = 1024
CACHE_TTL = 120.0
MIN_REFRESH_GAP = 30.0


def claim(claims: dict[str, Any], path: str) -> Any:
    value: Any = claims.get(path)
    if value is None and "." in path:
        value = claims
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
    return value


class JwtAuthenticator:
    provider = "jwt"
    challenge = 'Bearer realm="kanal-registry-proxy"'

    def __init__(
        self, settings: JwtSettings, metrics: ProxyMetrics | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self._keys: dict[str | None, Any] = {}
        if settings.public_key is not None:
            self._keys[None] = settings.public_key
        self._cache: OrderedDict[bytes, tuple[str, float]] = OrderedDict()
        self._last_fetch = -1e9
        self.min_refresh_gap = MIN_REFRESH_GAP
        self._fetch_lock = trio.Lock()
        self._client: HttpClient | None = None
        self._jwks_target = b"/"
        if settings.jwks_url is not None:
            parts = urlsplit(settings.jwks_url)
            tls = None
            if parts.scheme == "https":
                import ssl

                tls = ssl.create_default_context()
            host = parts.hostname or "localhost"
            self._client = HttpClient(
                host, parts.port or (443 if tls else 80), tls=tls, timeout=10.0, max_connections=2
            )
            self._jwks_target = ((parts.path or "/") + (f"?{parts.query}" if parts.query else "")).encode()

    async def refresh(self) -> bool:
        """Fetches the JWKS; True when it was read."""
        if self._client is None:
            return True
        async with self._fetch_lock:
            self._last_fetch = time.monotonic()
            try:
                response = await self._client.request("GET", self._jwks_target, [(b"Accept", b"application/json")])
                if response.status != 200:
                    raise UpstreamError(f"HTTP {response.status}")
                document = orjson.loads(response.body)
                keys: dict[str | None, Any] = {}
                for item in document.get("keys", []):
                    if item.get("use", "sig") != "sig":
                        continue
                    try:
                        key = jwt.PyJWK.from_dict(item)
                    except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError):
                        continue
                    keys[item.get("kid")] = key.key
            except (UpstreamError, orjson.JSONDecodeError, AttributeError) as exc:
                log.error("cannot read the JWKS at %s: %s", self.settings.jwks_url, exc)
                return False
            if not keys:
                log.error("the JWKS at %s holds no usable signing key", self.settings.jwks_url)
                return False
            self._keys = keys
            return True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self._client is None:
            task_status.started()
            await trio.sleep_forever()
        await self.refresh()
        task_status.started()
        try:
            while True:
                await trio.sleep(self.settings.jwks_refresh_interval)
                await self.refresh()
        finally:
            await self._client.aclose()

    def _key_for(self, kid: str | None) -> Any:
        if None in self._keys and self.settings.public_key is not None:
            return self._keys[None]
        if kid in self._keys:
            return self._keys[kid]
        if kid is None and len(self._keys) == 1:
            return next(iter(self._keys.values()))
        return None

    async def authenticate(self, header: str | None) -> str | None:
        if not header:
            self._count("malformed")
            return None
        scheme, _, token = header.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            self._count("malformed")
            return None
        digest = hashlib.sha256(token.encode()).digest()
        now = self.clock()
        cached = self._cache.get(digest)
        if cached is not None:
            if cached[1] > now:
                self._hit(True)
                self._count("success")
                return cached[0]
            del self._cache[digest]
        self._hit(False)
        principal, expires = await self._verify(token)
        if principal is None:
            self._count("failure")
            return None
        self._cache[digest] = (principal, min(expires, now + CACHE_TTL))
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        self._count("success")
        return principal

    async def _verify(self, token: str) -> tuple[str | None, float]:
        settings = self.settings
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            return None, 0.0
        kid = header.get("kid")
        if header.get("alg") not in settings.algorithms:
            log.info("token refused: algorithm %r is not accepted", header.get("alg"))
            return None, 0.0
        key = self._key_for(kid)
        if key is None and self._client is not None and time.monotonic() - self._last_fetch >= self.min_refresh_gap:
            await self.refresh()  # a rotated key
            key = self._key_for(kid)
        if key is None:
            log.info("token refused: no key with kid %r", kid)
            return None, 0.0
        try:
            claims = jwt.decode(
                token,
                key=key,
                algorithms=list(settings.algorithms),
                audience=list(settings.audience),
                issuer=settings.issuer,
                leeway=settings.leeway,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWTError as exc:
            log.info("token refused: %s", exc)
            return None, 0.0
        principal = claim(claims, settings.principal_claim)
        if not isinstance(principal, str) or not principal:
            log.info("token refused: no string claim %r", settings.principal_claim)
            return None, 0.0
        return principal, float(claims["exp"]) + settings.leeway

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.authenticated(self.provider, outcome)

    def _hit(self, hit: bool) -> None:
        if self.metrics is not None:
            self.metrics.cache_lookup("jwt", hit)
