"""The chain's semantics, in one place: which hooks run, in what order, and what their results do.

The onion (as in Kroxylicious's filter chain): request hooks run outermost first (1→n), response
hooks innermost first (n→1). A hook that answers (``Respond``/``Reject``) at position k stops the
request there: the answer travels back through the response hooks of positions k-1..1, exactly as
an upstream response would, so an outer interceptor (an audit log, a metrics plugin) sees every
answer its client gets. ``Close`` closes the connection. Record hooks run per topic-partition, in
the onion too: an interceptor's produce records hook sees the request as the interceptors before it
left it (after its own request hook, before those of the interceptors after it), and its fetch
records hook the response as the interceptors after it left it (before its own response hook), so
an interceptor in a virtual cluster sees the tenant's names both ways. Consecutive records hooks
share one pass over the partitions. Every hook has a deadline (``GATEWAY_HOOK_TIMEOUT_MS``): an
async hook is cancelled at it, a sync one that overran is caught when it returns; either closes the
connection with a log line naming the interceptor. An exception in a hook does the same.

Sans-I/O apart from awaiting hooks: the connection (``kanal.net.connection``) and the test harness
(``kanal.testing``) both drive it, so tests see the gateway's exact semantics.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from kanal.api.context import Connection, Notes, RecordsContext, RequestContext, ResponseContext
from kanal.api.results import Close, PartitionError, Reject, Respond
from kanal.api.services import TopicNames
from kanal.pipeline.chain import Entry, ResolvedChain
from kanal.protocol.api import ApiKey
from kanal.protocol.entities import build, has_field, nested
from kanal.protocol.error_responses import error_response
from kanal.protocol.fetch_records import RecordsEdit, fetch_records, splice_records
from kanal.protocol.messages import response_type
from kanal.protocol.records import RecordSet

__all__ = ["CloseConnection", "Dispatcher", "PartitionFailure", "RequestOutcome", "merge_partition_errors"]

# (stage, api key, interceptor name, seconds): lifecycle metrics
Observer = Callable[[str, int, str, float], None]


class CloseConnection(Exception):
    """The client connection must close: a hook said so, overran its deadline or raised."""


@dataclass(frozen=True, slots=True)
class PartitionFailure:
    """A partition a produce records hook failed: it is not forwarded, and its error is merged
    into the response the client gets."""

    topic: str
    topic_id: Any
    partition: int
    error: PartitionError
    position: int = 0  # of the interceptor that failed it: its error joins the response there


@dataclass(slots=True)
class RequestOutcome:
    """What the request hooks decided.

    ``request`` is what to forward (None when answered here); ``answer`` the response the client
    gets instead (already through the response hooks of the interceptors before the one that
    answered); ``notes`` go with the request to its response hooks.
    """

    request: Any
    answer: Any = None
    notes: Notes | None = None
    response_wanted: bool = False
    failures: list[PartitionFailure] = field(default_factory=list)


class Dispatcher:
    """Runs one resolved chain's hooks for one connection."""

    def __init__(
        self,
        chain: ResolvedChain,
        topic_names: TopicNames,
        deadline: float,
        observe: Observer | None = None,
    ) -> None:
        self.chain = chain
        self.topic_names = topic_names
        self.deadline = deadline
        self.observe = observe

    async def _call(self, entry: Entry, ctx: Any, stage: str, api_key: int) -> Any:
        began = time.perf_counter()
        try:
            result = entry.hook(ctx)
            if inspect.isawaitable(result):
                with trio.move_on_after(self.deadline) as scope:
                    result = await result
                if scope.cancelled_caught:
                    raise CloseConnection(f"interceptor {entry.name!r}: {stage} hook exceeded {self.deadline:g} s")
        except CloseConnection:
            raise
        except Exception as exc:
            raise CloseConnection(f"interceptor {entry.name!r}: {stage} hook failed: {exc!r}") from exc
        elapsed = time.perf_counter() - began
        if elapsed > self.deadline:
            raise CloseConnection(f"interceptor {entry.name!r}: {stage} hook took {elapsed:.3f} s")
        if self.observe is not None:
            self.observe(stage, api_key, entry.name, elapsed)
        return result

    # -- connections --------------------------------------------------------------------------

    async def opened(self, connection: Any) -> None:
        for entry in self.chain.opened:
            await self._call(entry, connection, "connection_opened", -1)

    async def closed(self, connection: Any) -> None:
        """Runs every ``kanal_connection_closed`` hook (innermost first); failures are reported
        after all ran."""
        failure: CloseConnection | None = None
        for entry in self.chain.closed:
            try:
                await self._call(entry, connection, "connection_closed", -1)
            except CloseConnection as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    # -- requests ------------------------------------------------------------------------------

    async def request(self, ctx: RequestContext, expects_response: bool) -> RequestOutcome:
        """Runs the request hooks (and Produce's records hooks) over ``ctx``."""
        api_key = ctx.api_key
        original = ctx.request
        entries = self.chain.requests_for(api_key)
        records = self.chain.produce_records if api_key == ApiKey.PRODUCE else []
        failures: list[PartitionFailure] = []
        result, position, emptied = None, len(self.chain.interceptors), False
        for entry in [*entries, None]:
            outer = [r for r in records if entry is None or r.position < entry.position]
            if outer:
                records = records[len(outer) :]
                kept = await self._produce_records(ctx, outer, failures)
                if kept is None:  # every partition failed: answered without going upstream
                    emptied = True
                    break
                ctx.request = kept
            if entry is None:
                break
            ctx._position = entry.position
            answer = await self._call(entry, ctx, "request", api_key)
            if answer is not None:
                result, position = answer, entry.position
                break
        outcome = RequestOutcome(ctx.request, notes=ctx._notes, response_wanted=ctx.response_wanted, failures=failures)
        if emptied:
            empty = build(response_type(api_key, ctx.api_version))
            result = Respond(merge_partition_errors(empty, failures))
            position = len(self.chain.interceptors) if entry is None else entry.position
            outcome.failures = []
        if result is None:
            return outcome
        if isinstance(result, Close):
            raise CloseConnection(f"closed by interceptor: {result.reason}")
        if not isinstance(result, Respond | Reject):
            raise CloseConnection(f"a request hook answered {result!r}: expected None, Respond, Reject or Close")
        outcome.request = None
        if not expects_response:
            return outcome  # acks=0: nothing goes back
        if isinstance(result, Respond):
            body = result.response
        else:
            request = ctx.request if ctx.request is not None else original
            body = error_response(api_key, ctx.api_version, request, result.error_code, result.message)
        response = ResponseContext(
            ctx.connection,
            api_key,
            ctx.api_version,
            ctx.correlation_id,
            ctx.client_id,
            ctx.request,
            body,
            ctx.topic_names,
            ctx._notes,
            _sender=ctx._sender,
        )
        # the interceptors before the one that answered see its answer as a broker's, records too
        outcome.answer = await self.response(response, before=position)
        outcome.notes = response._notes
        return outcome

    async def _produce_records(
        self, ctx: RequestContext, entries: list[Entry], failures: list[PartitionFailure]
    ) -> Any:
        """Runs produce records hooks per partition; returns the request to forward (None when no
        partition is left)."""
        request = ctx.request
        topics = []
        changed = False
        for topic in request.topic_data:
            name = await self._topic_name(topic)
            partitions = []
            for part in topic.partition_data:
                records = RecordSet.parse(part.records)
                rctx = RecordsContext(
                    ctx.connection,
                    ctx.api_key,
                    ctx.api_version,
                    ctx.client_id,
                    name,
                    int(part.index),
                    records,
                    self.topic_names.stored(name),
                )
                outcome, failed_by = await self._failing(entries, rctx, "produce_records", ctx.api_key)
                if outcome is not None:
                    topic_id = getattr(topic, "topic_id", None)
                    failures.append(PartitionFailure(name, topic_id, int(part.index), outcome, failed_by))
                    changed = True
                    continue
                if records.changed():
                    part = replace(part, records=records.to_bytes())
                    changed = True
                partitions.append(part)
            if partitions:
                topics.append(replace(topic, partition_data=tuple(partitions)) if changed else topic)
        if not topics:
            return None
        return replace(request, topic_data=tuple(topics)) if changed else request

    async def records(
        self, entries: list[Entry], ctx: RecordsContext, stage: str, api_key: int
    ) -> PartitionError | None:
        """Runs records hooks over one partition until one fails it (the error, or None)."""
        return (await self._failing(entries, ctx, stage, api_key))[0]

    async def _failing(
        self, entries: list[Entry], ctx: RecordsContext, stage: str, api_key: int
    ) -> tuple[PartitionError | None, int]:
        """:meth:`records`, with the position of the interceptor that failed the partition."""
        for entry in entries:
            result = await self._call(entry, ctx, stage, api_key)
            if isinstance(result, PartitionError):
                return result, entry.position
            if result is not None:
                raise CloseConnection(f"interceptor {entry.name!r}: {stage} answered {result!r}")
        return None, 0

    async def _topic_name(self, topic: Any) -> str:
        """The name of a Produce or Fetch topic entry, which may carry only a topic id (v13+)."""
        name = getattr(topic, "name", None) or getattr(topic, "topic", None)
        if name:
            return str(name)
        return await self.topic_names.resolve(topic.topic_id)

    # -- responses -----------------------------------------------------------------------------

    async def response(
        self,
        ctx: ResponseContext,
        before: int | None = None,
        records: bool = True,
        failures: list[PartitionFailure] | None = None,
    ) -> Any:
        """Runs the response hooks over ``ctx`` (innermost first; with ``before``, only those of the
        interceptors before that position, records hooks included) and returns the body the client gets. Fetch records
        hooks run at their place when ``records``; the partitions produce records hooks failed
        (``failures``) join the response where the interceptor that failed them is."""
        api_key = ctx.api_key
        pending = self.chain.fetch_records if records and api_key == ApiKey.FETCH else []
        failed = sorted(failures or (), key=lambda f: -f.position)
        entries = self.chain.responses_for(api_key)
        if before is not None:
            entries = [entry for entry in entries if entry.position < before]
            pending = [entry for entry in pending if entry.position < before]
        for entry in entries:
            here = [f for f in failed if f.position >= entry.position]
            if here:
                failed = failed[len(here) :]
                ctx.response = merge_partition_errors(ctx.response, here)
            inner = [r for r in pending if r.position >= entry.position]
            if inner:
                pending = pending[len(inner) :]
                ctx.response = await self._fetch_records(ctx, inner)
            ctx._position = entry.position
            result = await self._call(entry, ctx, "response", api_key)
            if result is None:
                continue
            if isinstance(result, Close):
                raise CloseConnection(f"closed by interceptor: {result.reason}")
            if not isinstance(result, Respond):
                raise CloseConnection(f"a response hook answered {result!r}: expected None, Respond or Close")
            ctx.response = result.response  # and the interceptors further out see it
        if failed:
            ctx.response = merge_partition_errors(ctx.response, failed)
        if pending:
            ctx.response = await self._fetch_records(ctx, pending)
        return ctx.response

    async def _fetch_records(self, ctx: ResponseContext, entries: list[Entry]) -> Any:
        response = ctx.response
        topics = []
        changed = False
        for topic in response.responses:
            name = await self._topic_name(topic)
            partitions = []
            for part in topic.partitions:
                if part.records is None or part.error_code != 0:
                    partitions.append(part)
                    continue
                index = int(part.partition_index)
                new = await self._partition_records(
                    entries, ctx.connection, ctx.api_version, ctx.client_id, name, index, part.records
                )
                if new is not None:
                    part = replace(part, error_code=ErrorCode(new[0]), records=new[1])
                    changed = True
                partitions.append(part)
            topics.append(replace(topic, partitions=tuple(partitions)) if changed else topic)
        return replace(response, responses=tuple(topics)) if changed else response

    async def fetch_records_in_frame(
        self, connection: Connection, api_version: int, client_id: str | None, frame: bytearray
    ) -> bytearray | None:
        """Runs the fetch records hooks over the record sets of a Fetch v12+ response frame, when no
        response hook needs the decoded body: the frame with the changed record sets and failed
        partitions spliced in, or None when nothing changed. Raises InvalidHeader for a frame that
        does not parse (the caller then decodes it)."""
        entries = self.chain.fetch_records
        edits = []
        for topic in fetch_records(frame, api_version):
            name = topic.name
            if name is None:
                assert topic.topic_id is not None
                name = await self.topic_names.resolve(topic.topic_id)
            for part in topic.partitions:
                if part.start < 0 or part.error_code != 0:
                    continue
                data = bytes(memoryview(frame)[part.start : part.end])  # one copy, not two
                new = await self._partition_records(
                    entries, connection, api_version, client_id, name, part.partition, data
                )
                if new is not None:
                    edits.append(RecordsEdit(part, new[1], new[0]))
        return splice_records(frame, edits) if edits else None

    async def _partition_records(
        self,
        entries: list[Entry],
        connection: Connection,
        api_version: int,
        client_id: str | None,
        topic: str,
        partition: int,
        data: bytes,
    ) -> tuple[int, bytes] | None:
        """Runs the fetch records hooks over one partition's record set: None when it stays as it
        is, else the partition's error code and its record set (empty, not null, when a hook failed
        it: librdkafka reads a null record set as a broken frame and fetches again)."""
        records = RecordSet.parse(data)
        rctx = RecordsContext(
            connection, ApiKey.FETCH, api_version, client_id, topic, partition, records, self.topic_names.stored(topic)
        )
        outcome = await self.records(entries, rctx, "fetch_records", ApiKey.FETCH)
        if outcome is not None:
            return outcome.error_code, b""
        if records.changed():
            return 0, records.to_bytes() or b""
        return None


def merge_partition_errors(response: Any, failures: list[PartitionFailure]) -> Any:
    """Adds the partitions that records hooks failed to a Produce response."""
    if not failures:
        return response
    topic_cls = nested(type(response), "responses")
    part_cls = nested(topic_cls, "partition_responses")
    by_name = has_field(topic_cls, "name")
    topics = {t.name if by_name else t.topic_id: t for t in response.responses}
    for failure in failures:
        extra: dict[str, Any] = {"log_start_offset": -1} if has_field(part_cls, "log_start_offset") else {}
        if has_field(part_cls, "error_message"):
            extra["error_message"] = failure.error.message
        entry = build(
            part_cls, index=failure.partition, error_code=ErrorCode(failure.error.error_code), base_offset=-1, **extra
        )
        key = failure.topic if by_name else failure.topic_id
        topic = topics.get(key)
        if topic is None:
            topics[key] = build(topic_cls, **{"name" if by_name else "topic_id": key}, partition_responses=(entry,))
        else:
            topics[key] = replace(topic, partition_responses=(*topic.partition_responses, entry))
    return replace(response, responses=tuple(topics.values()))
