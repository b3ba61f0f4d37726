"""The schema registry client the plugins share: async (trio), over kept-alive HTTP/1.1, cached.

One client reaches one registry through one or several URLs, tried in turn: a URL that cannot be
reached (refused, timed out, TLS failure) passes the call to the next, starting with the last one that
answered; any HTTP answer is the registry's. Basic auth (``user:password``), TLS (CA, client
certificate) and the timeout of one call are the client's.

Lookups, with the registry's REST API (Confluent's, which Karapace and others speak):

* :meth:`~SchemaRegistryClient.schema_by_id` (``GET /schemas/ids/{id}``),
  :meth:`~SchemaRegistryClient.schema_by_guid` (``GET /schemas/guids/{guid}``) and
  :meth:`~SchemaRegistryClient.subject_version` (``GET /subjects/{subject}/versions/{version}``) give a
  :class:`Schema`; :meth:`~SchemaRegistryClient.references` the schemas it references, recursively,
  each before the schemas that use it (the order a parser needs them in).
* :meth:`~SchemaRegistryClient.subjects_of_id` (``GET /schemas/ids/{id}/versions``),
  :meth:`~SchemaRegistryClient.ids_of_guid` (``GET /schemas/guids/{guid}/ids``) and
  :meth:`~SchemaRegistryClient.subjects_of_guid`: who holds a schema, for authorization.

Caches, all bounded. Found schemas never change (an id or GUID names one schema for good): a least
recently used cache of ``cache_size`` entries. An unknown id is remembered ``negative_ttl`` seconds, a
failure (unreachable, an HTTP error, an unreadable answer) ``failure_ttl`` seconds: meanwhile lookups
raise the same error without calling. Subject lists change as subjects are registered: a non-empty one
is kept ``subjects_ttl`` seconds (``refresh=True`` asks again), an empty one or an error is not kept.
The synchronous ``cached*`` methods read the caches only, for record loops that cannot await.

Errors: :class:`SchemaNotFound` (the registry does not know it), :class:`RegistryUnavailable` (it could
not answer: ``response`` holds its HTTP answer when there was one, ``timeout`` tells a timeout), and
:class:`UnreadableAnswer` (a :class:`RegistryUnavailable` whose answer could not be read).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import orjson

from kanal_schemas.cache import ExpiringCache, LruCache
from kanal_schemas.framing import SchemaRef, describe_ref
from kanal_schemas.http import Endpoint, HttpClient, HttpError, HttpResponse, TlsSettings

__all__ = [
    "AVRO",
    "JSON",
    "PROTOBUF",
    "Reference",
    "RegistryError",
    "RegistryUnavailable",
    "Schema",
    "SchemaNotFound",
    "SchemaRegistryClient",
    "Send",
    "Transport",
    "UnreadableAnswer",
]

AVRO = "AVRO"
JSON = "JSON"
PROTOBUF = "PROTOBUF"
ACCEPT = b"application/vnd.schemaregistry.v1+json, application/json"

T = TypeVar("T")

#: One call to the registry in place of the client's own: (method, target, route template) -> answer.
#: The registry proxy passes its traced, measured upstream call.
Send = Callable[[str, bytes, str], Awaitable[HttpResponse]]


class Transport(Protocol):
    """What the client needs of an HTTP client (:class:`~kanal_schemas.http.HttpClient` is one)."""

    async def request(
        self, method: str, target: bytes, headers: Sequence[tuple[bytes, bytes]] = (), body: bytes = b""
    ) -> HttpResponse: ...


class RegistryError(Exception):
    """A lookup that gave no schema; ``response`` is the registry's answer when it gave one."""

    def __init__(self, message: str, *, response: HttpResponse | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.response = response


class SchemaNotFound(RegistryError):
    """The registry does not know the id, GUID or subject version (HTTP 404)."""


class RegistryUnavailable(RegistryError):
    """The registry could not be reached, answered an error, or answered something unreadable."""

    def __init__(self, message: str, *, response: HttpResponse | None = None, timeout: bool = False) -> None:
        super().__init__(message, response=response)
        self.timeout = timeout

    @property
    def status(self) -> int | None:
        return self.response.status if self.response is not None else None


class UnreadableAnswer(RegistryUnavailable):
    """The registry answered 200 with something that is not what the route returns."""


@dataclass(frozen=True, slots=True)
class Reference:
    """A schema reference: the name the referencing schema uses, and the subject version it names."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True, slots=True, eq=False)
class Schema:
    """A schema as the registry gives it. ``id``/``guid``/``subject``/``version`` are set as far as the
    answer tells them. :meth:`memo` keeps what a plugin derives from it (a parsed reader) as long as
    the schema stays cached."""

    text: str
    schema_type: str = AVRO
    references: tuple[Reference, ...] = ()
    id: int | None = None
    guid: str | None = None
    subject: str | None = None
    version: int | None = None
    _memo: dict[str, Any] = field(default_factory=dict, repr=False)

    def memo(self, key: str, build: Callable[[Schema], T]) -> T:
        """``build(self)``, computed once per key."""
        try:
            value: T = self._memo[key]
        except KeyError:
            value = self._memo[key] = build(self)
        return value

    def memoized(self, key: str) -> Any:
        """What :meth:`memo` holds for ``key``, else None."""
        return self._memo.get(key)


def _schema(document: Any, what: str, response: HttpResponse, key: tuple[Any, ...] = ()) -> Schema:
    """The Schema of a registry answer (``key``: the lookup's, whose id or GUID the answer may omit);
    UnreadableAnswer when it holds none."""
    if not isinstance(document, dict) or not isinstance(document.get("schema"), str):
        raise UnreadableAnswer(f"the answer for {what} holds no schema", response=response)
    try:
        references = tuple(
            Reference(str(r["name"]), str(r["subject"]), int(r["version"])) for r in document.get("references") or ()
        )
        schema_id = document.get("id", key[1] if key[:1] == ("id",) else None)
        guid = document.get("guid", key[1] if key[:1] == ("guid",) else None)
        version = document.get("version")
        return Schema(
            text=document["schema"],
            schema_type=str(document.get("schemaType") or AVRO).upper(),
            references=references,
            id=int(schema_id) if schema_id is not None else None,
            guid=str(guid) if guid is not None else None,
            subject=str(document["subject"]) if document.get("subject") is not None else None,
            version=int(version) if version is not None else None,
        )
    except (KeyError, TypeError, ValueError):
        raise UnreadableAnswer(f"the answer for {what} has unreadable fields", response=response) from None


def _not_ok(response: HttpResponse, what: str) -> RegistryError:
    if response.status == 404:
        return SchemaNotFound(f"{what} is not in the schema registry", response=response)
    text = response.body[:200].decode("utf-8", "replace")
    return RegistryUnavailable(f"HTTP {response.status} for {what}: {text}", response=response)


class SchemaRegistryClient:
    """Lookups against one schema registry (see the module's docstring).

    ``urls``: the registry's base URLs (a comma-separated string or a sequence), tried in turn;
    credentials in a URL are used as ``user_info`` when it is not given. ``transports``: HTTP clients to
    call instead of URLs (the registry proxy's upstream client); the client then adds no credentials.
    """

    def __init__(
        self,
        urls: str | Sequence[str] = (),
        *,
        user_info: str | None = None,
        tls: TlsSettings | None = None,
        timeout: float = 5.0,
        max_connections: int = 10,
        transports: Sequence[Transport] = (),
        cache_size: int = 1000,
        negative_ttl: float = 5.0,
        failure_ttl: float = 1.0,
        subjects_ttl: float = 300.0,
        subjects_cache_size: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
        label: str = "schema registry",
    ) -> None:
        if isinstance(urls, str):
            urls = [u for u in urls.split(",") if u.strip()]
        endpoints = [Endpoint.parse(u) for u in urls]
        self.urls = tuple(u.strip().rstrip("/") for u in urls)
        if user_info is None:
            user_info = next((e.user_info for e in endpoints if e.user_info is not None), None)
        headers: list[tuple[bytes, bytes]] = []
        if user_info:
            headers.append((b"Authorization", b"Basic " + base64.b64encode(user_info.encode())))
        self._own: list[HttpClient] = [
            HttpClient.for_url(
                e, tls=tls, timeout=timeout, max_connections=max_connections, default_headers=headers, label=label
            )
            for e in endpoints
        ]
        self._transports: list[Transport] = [*self._own, *transports]
        if not self._transports:
            raise ValueError("a schema registry client needs a URL or a transport")
        self._names = [*self.urls, *(f"transport {n}" for n in range(len(transports)))]
        self._current = 0  # the transport that answered last
        self.timeout = timeout
        self.negative_ttl = negative_ttl
        self.failure_ttl = failure_ttl
        self.subjects_ttl = subjects_ttl
        self.clock = clock
        self._schemas: LruCache[tuple[Any, ...], Schema] = LruCache(cache_size)
        self._errors: ExpiringCache[tuple[Any, ...], RegistryError] = ExpiringCache(cache_size, clock)
        self._subjects: ExpiringCache[tuple[Any, ...], list[str]] = ExpiringCache(subjects_cache_size, clock)
        self._guid_ids: ExpiringCache[str, list[tuple[str, int]]] = ExpiringCache(subjects_cache_size, clock)
        self.lookups = 0  # calls made to the registry (tests and metrics)

    # -- calls ------------------------------------------------------------------------------------

    async def _request(self, method: str, target: bytes) -> HttpResponse:
        """One call, through the transports in turn from the one that answered last."""
        transports = self._transports
        failures: list[tuple[int, HttpError]] = []
        for step in range(len(transports)):
            index = (self._current + step) % len(transports)
            try:
                response = await transports[index].request(method, target, [(b"Accept", ACCEPT)])
            except HttpError as exc:
                failures.append((index, exc))
                continue
            self._current = index
            return response
        if len(failures) == 1:
            raise failures[0][1]
        raise HttpError(
            "; ".join(f"{self._names[i]}: {exc}" for i, exc in failures), timeout=all(e.timeout for _, e in failures)
        )

    async def _get(self, target: str, route: str, send: Send | None) -> HttpResponse:
        """GET ``target``; RegistryUnavailable when no transport answered."""
        self.lookups += 1
        try:
            if send is not None:
                return await send("GET", target.encode(), route)
            return await self._request("GET", target.encode())
        except HttpError as exc:
            raise RegistryUnavailable(str(exc), timeout=exc.timeout) from exc

    async def _lookup(self, key: tuple[Any, ...], target: str, route: str, what: str, send: Send | None) -> Schema:
        """A schema from the caches, else from the registry (and then cached, found or not)."""
        found = self._schemas.get(key)
        if found is not None:
            return found
        failed = self._errors.get(key)
        if failed is not None:
            raise failed.with_traceback(None)
        try:
            response = await self._get(target, route, send)
            if response.status != 200:
                raise _not_ok(response, what)
            try:
                document = orjson.loads(response.body)
            except orjson.JSONDecodeError:
                raise UnreadableAnswer("the answer is not JSON", response=response) from None
            schema = _schema(document, what, response, key)
        except RegistryError as exc:
            ttl = self.negative_ttl if isinstance(exc, SchemaNotFound) else self.failure_ttl
            if ttl > 0:
                self._errors.put(key, exc, ttl)
            raise
        self._schemas.put(key, schema)
        return schema

    # -- schemas ----------------------------------------------------------------------------------

    async def schema_by_id(self, schema_id: int, *, send: Send | None = None) -> Schema:
        """The schema of an id (``GET /schemas/ids/{id}``)."""
        return await self._lookup(
            ("id", schema_id), f"/schemas/ids/{schema_id}", "/schemas/ids/{id}", describe_ref(schema_id), send
        )

    async def schema_by_guid(self, guid: str, *, send: Send | None = None) -> Schema:
        """The schema of a GUID (``GET /schemas/guids/{guid}``)."""
        return await self._lookup(
            ("guid", guid), f"/schemas/guids/{quote(guid, safe='')}", "/schemas/guids/{guid}", describe_ref(guid), send
        )

    async def schema(self, ref: SchemaRef, *, send: Send | None = None) -> Schema:
        """The schema of an id (int) or a GUID (str)."""
        if isinstance(ref, int):
            return await self.schema_by_id(ref, send=send)
        return await self.schema_by_guid(ref, send=send)

    def cached(self, ref: SchemaRef) -> Schema | RegistryError | None:
        """What the caches hold for an id or GUID: the schema, the error a lookup would raise, or None
        (a lookup would call the registry). Synchronous, for record loops."""
        key = ("id", ref) if isinstance(ref, int) else ("guid", ref)
        found = self._schemas.get(key)
        if found is not None:
            return found
        return self._errors.get(key)

    async def subject_version(self, subject: str, version: int | str = "latest", *, send: Send | None = None) -> Schema:
        """A subject's version (a number, or ``latest``: not cached, it changes)."""
        target = f"/subjects/{quote(subject, safe='')}/versions/{version}"
        route = "/subjects/{subject}/versions/{version}"
        what = f"subject {subject} version {version}"
        if isinstance(version, int):
            return await self._lookup(("subject", subject, version), target, route, what, send)
        response = await self._get(target, route, send)
        if response.status != 200:
            raise _not_ok(response, what)
        try:
            document = orjson.loads(response.body)
        except orjson.JSONDecodeError:
            raise UnreadableAnswer("the answer is not JSON", response=response) from None
        return _schema(document, what, response)

    async def references(self, schema: Schema, *, send: Send | None = None) -> list[Schema]:
        """The schemas ``schema`` references, recursively and once each, every one before those that
        reference it."""
        out: list[Schema] = []
        seen: set[tuple[str, int]] = set()

        async def walk(references: Sequence[Reference]) -> None:
            for ref in references:
                key = (ref.subject, ref.version)
                if key in seen:
                    continue
                seen.add(key)
                referenced = await self.subject_version(ref.subject, ref.version, send=send)
                await walk(referenced.references)
                out.append(referenced)

        await walk(schema.references)
        return out

    # -- who holds a schema -----------------------------------------------------------------------

    def cached_subjects_of_id(
        self, schema_id: int, *, context: str | None = None, deleted: bool = False
    ) -> list[str] | None:
        """The cached subjects of an id (None: not cached)."""
        found = self._subjects.get(("id", schema_id, context or "", deleted))
        return list(found) if found is not None else None

    async def subjects_of_id(
        self,
        schema_id: int,
        *,
        context: str | None = None,
        deleted: bool = False,
        refresh: bool = False,
        send: Send | None = None,
    ) -> list[str]:
        """The subjects holding an id, sorted (``GET /schemas/ids/{id}/versions``; ``deleted``: also
        soft-deleted versions; ``context``: the ``subject`` parameter naming a context, ``:.ctx:``). An
        unknown id holds none."""
        key = ("id", schema_id, context or "", deleted)
        if not refresh:
            cached = self._subjects.get(key)
            if cached is not None:
                return list(cached)
        query = []
        if deleted:
            query.append("deleted=true")
        if context:
            query.append("subject=" + quote(context, safe=":"))
        target = f"/schemas/ids/{schema_id}/versions" + ("?" + "&".join(query) if query else "")
        response = await self._get(target, "/schemas/ids/{id}/versions", send)
        if response.status == 404:
            return []
        what = f"the subjects of {describe_ref(schema_id)}"
        if response.status != 200:
            raise _not_ok(response, what)
        try:
            items = orjson.loads(response.body)
            subjects = sorted({str(item["subject"]) for item in items})
        except (orjson.JSONDecodeError, TypeError, KeyError):
            raise UnreadableAnswer(f"the answer for {what} is unreadable", response=response) from None
        if subjects:
            self._subjects.put(key, subjects, self.subjects_ttl)
        return list(subjects)

    def cached_ids_of_guid(self, guid: str) -> list[tuple[str, int]] | None:
        """The cached (context, id) pairs of a GUID (None: not cached)."""
        found = self._guid_ids.get(guid)
        return list(found) if found is not None else None

    async def ids_of_guid(self, guid: str, *, refresh: bool = False, send: Send | None = None) -> list[tuple[str, int]]:
        """The (context, id) pairs of a GUID (``GET /schemas/guids/{guid}/ids``; ``.`` is the default
        context). SchemaNotFound for an unknown GUID, or a registry without GUIDs."""
        if not refresh:
            cached = self._guid_ids.get(guid)
            if cached is not None:
                return list(cached)
        response = await self._get(f"/schemas/guids/{quote(guid, safe='')}/ids", "/schemas/guids/{guid}/ids", send)
        what = describe_ref(guid)
        if response.status != 200:
            raise _not_ok(response, what)
        try:
            items = orjson.loads(response.body)
            pairs = [(str(item.get("context", ".")), int(item["id"])) for item in items]
        except (orjson.JSONDecodeError, TypeError, KeyError, ValueError, AttributeError):
            raise UnreadableAnswer(f"the answer for the ids of {what} is unreadable", response=response) from None
        if pairs:
            self._guid_ids.put(guid, pairs, self.subjects_ttl)
        return list(pairs)

    async def subjects_of_guid(
        self, guid: str, *, deleted: bool = False, refresh: bool = False, send: Send | None = None
    ) -> list[str]:
        """The subjects holding a GUID's ids, in every context, sorted."""
        subjects: set[str] = set()
        for context, schema_id in await self.ids_of_guid(guid, refresh=refresh, send=send):
            qualifier = None if context in (".", "") else f":{context}:"
            subjects.update(
                await self.subjects_of_id(schema_id, context=qualifier, deleted=deleted, refresh=refresh, send=send)
            )
        return sorted(subjects)

    # -- life -------------------------------------------------------------------------------------

    def forget(self) -> None:
        """Empties every cache (the registry was replaced, or a test wants fresh lookups)."""
        self._schemas = LruCache(self._schemas.size)
        self._errors = ExpiringCache(self._errors.size, self.clock)
        self._subjects = ExpiringCache(self._subjects.size, self.clock)
        self._guid_ids = ExpiringCache(self._guid_ids.size, self.clock)

    async def aclose(self) -> None:
        """Closes the connections of the client's own URLs (given transports stay open)."""
        for client in self._own:
            await client.aclose()
