"""The identity provider's signing keys for OAUTHBEARER logins (GATEWAY_OAUTH_JWKS_URL).

The JWKS document is fetched when the gateway starts, every GATEWAY_OAUTH_JWKS_REFRESH ms after
that, and at once when a client presents a token signed by a key the gateway does not have: the
provider may have rotated its keys, and waiting for the next scheduled fetch would refuse every
client that got a token since. Such on-demand fetches happen at most once every
:data:`ON_DEMAND_INTERVAL` seconds, so tokens with made-up key ids cannot make the gateway hammer
the provider. A fetch that fails keeps the keys the gateway has (none before the first success, and
then every OAUTHBEARER login is refused); it is logged, never fatal, and retried sooner than the
refresh interval until it succeeds.

``http(s)://`` URLs are fetched with httpx, verifying the server against the system's trust store
(``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` change it); ``file://`` URLs are read from disk.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit, urlunsplit
from urllib.request import url2pathname

import httpx
import orjson
import trio

from kanal.identity.oauth import JwksValidator, OAuthIdentity, OAuthRefusal, token_key_id

log = logging.getLogger(__name__)

ON_DEMAND_INTERVAL = 10.0  # seconds between two fetches caused by unknown key ids
FETCH_TIMEOUT = 10.0  # seconds a fetch may take
MAX_DOCUMENT_BYTES = 1 << 20  # a JWKS is a few kilobytes; more is not one
RETRY_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)  # after failed fetches, before the refresh interval applies

Fetch = Callable[[str], Awaitable[bytes]]
"""url -> the document's bytes; raises :class:`JwksError` (or OSError, httpx.HTTPError)."""


class JwksError(Exception):
    """A JWKS could not be fetched or is not one."""


def displayed(url: str) -> str:
    """The URL without user info, query or fragment (they may hold credentials), for logs."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


async def fetch_document(url: str) -> bytes:
    """The bytes at ``url`` (http, https or file), at most :data:`MAX_DOCUMENT_BYTES`."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise JwksError(f"a file:// URL names a local file, not one on {parts.netloc!r}")
        async with await trio.open_file(url2pathname(parts.path), "rb") as file:
            data = await file.read(MAX_DOCUMENT_BYTES + 1)
    elif parts.scheme in ("http", "https"):
        async with (
            httpx.AsyncClient(verify=ssl.create_default_context(), follow_redirects=True) as client,
            client.stream("GET", url, headers={"Accept": "application/json"}) as response,
        ):
            if response.status_code != 200:
                raise JwksError(f"HTTP {response.status_code}")
            chunks, size = [], 0
            async for chunk in response.aiter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_DOCUMENT_BYTES:
                    break
            data = b"".join(chunks)
    else:
        raise JwksError(f"unsupported URL scheme {parts.scheme!r} (expected http, https or file)")
    if len(data) > MAX_DOCUMENT_BYTES:
        raise JwksError(f"the document is larger than {MAX_DOCUMENT_BYTES} bytes")
    return data


class JwksKeys:
    """The current :class:`JwksValidator` of one JWKS URL, and the fetches that keep it current.

    ``template`` carries the checks (issuer, audiences, claims) with no keys; each successful fetch
    replaces :attr:`validator` with the template's settings and the new keys. :meth:`run` is the
    companion service that fetches on schedule; :meth:`ensure` is awaited before a token is checked.
    Fetches do not overlap: a caller arriving while one is under way waits for it.
    """

    def __init__(
        self,
        url: str,
        template: JwksValidator,
        refresh_seconds: float,
        *,
        fetch: Fetch = fetch_document,
        on_demand_interval: float = ON_DEMAND_INTERVAL,
        timeout: float = FETCH_TIMEOUT,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        # httpx logs every request at INFO with the whole URL, which may carry credentials; the
        # gateway's own lines say what it fetched, without them.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        self.url = url
        self.validator = template
        self.loaded = False
        """Whether a fetch has succeeded (before that no token is valid)."""
        self.fetches = 0
        """Fetches attempted, for tests and diagnostics."""
        self._refresh = refresh_seconds
        self._fetch = fetch
        self._on_demand_interval = on_demand_interval
        self._timeout = timeout
        self._clock = clock
        self._last_on_demand: float | None = None
        self._ok = False  # whether the last fetch succeeded
        self._running: trio.Event | None = None  # set when the fetch under way ends
        self._nursery: trio.Nursery | None = None

    def validate(self, token: str) -> OAuthIdentity | OAuthRefusal:
        """Checks ``token`` against the keys the gateway has now (no I/O)."""
        return self.validator.validate(token)

    async def ensure(self, token: str) -> None:
        """Makes sure the gateway has the key ``token`` names, fetching the JWKS when it does not
        (unless an on-demand fetch happened less than ``on_demand_interval`` seconds ago). A token
        that names no key (or is unreadable) fetches nothing: no document can tell which key it means."""
        kid = token_key_id(token)
        if kid is None or self.validator.knows(kid):
            return
        if self._running is not None:
            await self._running.wait()
            return
        now = self._clock()
        if self._last_on_demand is not None and now - self._last_on_demand < self._on_demand_interval:
            return
        self._last_on_demand = now
        log.info(
            "fetching the JWKS from %s: a token names key id %r, which the gateway lacks", displayed(self.url), kid[:80]
        )
        await self.refresh()

    async def refresh(self) -> bool:
        """Fetches the JWKS now (or waits for the fetch under way); whether the keys are current.

        While :meth:`run` serves, the fetch runs in its nursery, so a caller that is cancelled (a
        client that hangs up) does not cancel it for the others waiting.
        """
        running = self._running
        if running is None:
            running = self._running = trio.Event()
            if self._nursery is not None:
                self._nursery.start_soon(self._fetch_now, running)
            else:
                await self._fetch_now(running)
        await running.wait()
        return self._ok

    async def _fetch_now(self, done: trio.Event) -> None:
        self.fetches += 1
        try:
            with trio.fail_after(self._timeout):
                document = await self._fetch(self.url)
            validator = self.validator.with_jwks(orjson.loads(document))
        except trio.TooSlowError:
            self._failed(f"no answer within {self._timeout:g} s")
        except orjson.JSONDecodeError:
            self._failed("the document is not JSON")
        except (JwksError, OSError, httpx.HTTPError, ValueError, TypeError) as exc:
            self._failed(str(exc) or type(exc).__name__)
        else:
            first = not self.loaded
            if first or validator.key_ids != self.validator.key_ids:
                log.info(
                    "JWKS from %s: %d signing keys (%s)",
                    displayed(self.url),
                    len(validator.key_ids),
                    ", ".join(sorted(validator.key_ids)) or "no key ids",
                )
            self.validator, self.loaded, self._ok = validator, True, True
        finally:
            self._running = None
            done.set()

    def _failed(self, why: str) -> None:
        self._ok = False
        log.warning(
            "cannot fetch the JWKS from %s (GATEWAY_OAUTH_JWKS_URL): %s; %s",
            displayed(self.url),
            why,
            "keeping the keys fetched before" if self.loaded else "OAUTHBEARER logins are refused until it is fetched",
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The companion service: fetches now and on schedule until cancelled. Reports started at
        once: the gateway serves (other mechanisms) whether or not the provider answers."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            failures = 0
            try:
                while True:
                    if await self.refresh():
                        failures = 0
                        delay = self._refresh
                    else:
                        delay = min(self._refresh, RETRY_DELAYS[min(failures, len(RETRY_DELAYS) - 1)])
                        failures += 1
                    await trio.sleep(delay)
            finally:
                self._nursery = None


__all__ = ["JwksError", "JwksKeys", "displayed", "fetch_document"]
