"""The console's topic pages: the backing cluster's topics, and one topic's records (the latest N,
from an offset or from a time), read with the gateway's own client
(:class:`~kanal.api.topic_reader.TopicReader`) and never whole: each page reads at most
:data:`MAX_RECORDS` records and :data:`PARTITION_BYTES` per partition and round.

Values are shown by the plugins' decoders (``value_decoder``), else as JSON, text or hex
(:mod:`kanal.admin.console.records_view`); plugins' columns (``record_column``) say what they know
of each record (a data-quality policy's mark).
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from quart import Response, request

from kanal.admin.console.app import Console
from kanal.admin.console.records_view import Shown, show_bytes, show_decoded
from kanal.api.console import RecordNote, ShownRecord
from kanal.api.errors import UpstreamError
from kanal.api.services import KafkaClient
from kanal.api.topic_reader import EARLIEST, LATEST, Partition, TopicReader

__all__ = ["MAX_RECORDS", "Browse", "add_topic_pages", "browse"]

MAX_RECORDS: Final = 500
DEFAULT_RECORDS: Final = 20
PARTITION_BYTES: Final = 1024 * 1024
_ROUNDS: Final = 8  # fetches per partition and page, at most
#: A Fetch's wait: the records are there (the broker answers at once), but some brokers answer a
#: Fetch that may not wait at all with no partitions.
_WAIT: Final = 0.1
TOPICS_PER_PAGE: Final = 100


@dataclass
class Browse:
    """What one topic page read."""

    records: list[ShownRecord] = field(default_factory=list)
    starts: dict[int, int] = field(default_factory=dict)  # per partition: the log start offset
    ends: dict[int, int] = field(default_factory=dict)  # per partition: the end (next) offset


def _records_of(topic: str, partition: int, data: Any, since: int, count: int, after_ms: int) -> list[ShownRecord]:
    """Up to ``count`` records at or after offset ``since`` and time ``after_ms``; batches before
    them are skipped on their headers, without decoding (a broker answers a Fetch with whole
    batches, megabytes of them, starting before the offset asked)."""
    out: list[ShownRecord] = []
    for batch in data.batches:
        if batch.is_control or batch.next_offset <= since or batch.max_timestamp < after_ms:
            continue
        for r in batch.records():
            offset = batch.offset_of(r)
            timestamp = batch.timestamp_of(r)
            if offset >= since and timestamp >= after_ms:
                headers = tuple((str(k), v) for k, v in r.headers)
                out.append(ShownRecord(topic, partition, offset, timestamp, r.key, r.value, headers))
                if len(out) >= count:
                    return out
    return out


async def browse(
    reader: TopicReader, topic: str, partitions: list[int], mode: str, count: int, offset: int = 0, at_ms: int = 0
) -> Browse:
    """Reads ``count`` records of ``partitions``: the latest (``mode`` "latest", newest first), or
    the first ones from ``offset`` or from the time ``at_ms`` (oldest first)."""
    tps: list[Partition] = [(topic, p) for p in partitions]
    starts = await reader.list_offsets(tps, EARLIEST)
    ends = await reader.list_offsets(tps, LATEST)
    if mode == "time":
        found = await reader.list_offsets(tps, at_ms)
        positions = {tp: found[tp] for tp in tps if found.get(tp, -1) >= 0}  # (-1: nothing that late)
    elif mode == "offset":
        positions = {tp: max(offset, starts.get(tp, 0)) for tp in tps if tp in ends}
    else:
        positions = {tp: max(starts.get(tp, 0), ends[tp] - count) for tp in tps if tp in ends}
    # (the end may lag behind what a Fetch shows on some brokers: a partition is read even when
    # its position is at the end ListOffsets gave, and its Fetch's high watermark is believed)
    wanted = dict(positions)
    collected: dict[Partition, list[ShownRecord]] = {tp: [] for tp in wanted}
    for _ in range(_ROUNDS):
        if not wanted:
            break
        answers = await reader.fetch(wanted, max_wait=_WAIT, partition_bytes=PARTITION_BYTES, isolation_level=0)
        progressed = {}
        for tp, (records, next_offset) in answers.items():
            high = reader.watermarks.get(tp, (-1, -1, -1))[1]
            if high > ends[tp]:
                ends[tp] = high
                latest = max(starts.get(tp, 0), high - count)
                if mode == "latest" and latest > wanted[tp]:
                    collected[tp], progressed[tp] = [], latest  # read the real tail instead
                    continue
            room = count - len(collected[tp]) if mode != "latest" else count
            collected[tp].extend(_records_of(topic, tp[1], records, wanted[tp], room, at_ms if mode == "time" else 0))
            if len(collected[tp]) < count and wanted[tp] < next_offset < max(ends[tp], high):
                progressed[tp] = next_offset
        wanted = progressed
    merged = [r for rs in collected.values() for r in rs]
    if mode == "latest":
        merged.sort(key=lambda r: (r.timestamp, r.offset), reverse=True)
    else:
        merged.sort(key=lambda r: (r.timestamp, r.partition, r.offset))
    return Browse(
        records=merged[:count],
        starts={p: o for (_, p), o in starts.items()},
        ends={p: o for (_, p), o in ends.items()},
    )


def _when(ms: int) -> str:
    when = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def _int(value: str | None, default: int, low: int, high: int) -> int:
    try:
        return min(max(int(value or default), low), high)
    except ValueError:
        return default


def _time_ms(text: str) -> int | None:
    """An ISO date-time (a browser's datetime-local, read as UTC) or epoch milliseconds."""
    text = text.strip()
    if not text:
        return None
    if text.isdigit():
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


def _message(console: Console, status: int, title: str, message: str) -> Response:
    return console.render("console/message.html", status, title=title, message=message)


def add_topic_pages(
    console: Console,
    client: Callable[[], KafkaClient],
    columns: list[tuple[str, Callable[[ShownRecord], RecordNote | None]]],
    decoders: list[tuple[str, Callable[[ShownRecord], Awaitable[Any]]]],
) -> None:
    """Registers ``/console/topics`` and ``/console/topics/<name>``."""

    async def shown_value(record: ShownRecord) -> Shown:
        for name, decode in decoders:
            try:
                decoded = await decode(record)
            except Exception as exc:  # a decoder's failure is shown, not raised
                return Shown(name, f"{name} could not decode it: {exc}")
            if decoded is not None:
                return show_decoded(name, decoded)
        return show_bytes(record.value)

    @console.page("topics", "Topics")
    async def topics_page() -> Response:
        """The backing cluster's topics, filtered by name, a page at a time."""
        query = request.args.get("q", "").strip()
        page = _int(request.args.get("page"), 1, 1, 1_000_000)
        try:
            topics = await TopicReader(client()).topics()
        except UpstreamError as exc:
            return console.render(
                "console/message.html", 503, title="Topics", message=f"The cluster does not answer: {exc}"
            )
        names = sorted(n for n in topics if query.lower() in n.lower())
        shown = names[(page - 1) * TOPICS_PER_PAGE : page * TOPICS_PER_PAGE]
        return console.render(
            "console/topics.html",
            title="Topics",
            query=query,
            page=page,
            pages=max(1, -(-len(names) // TOPICS_PER_PAGE)),
            total=len(names),
            rows=[(n, len(topics[n])) for n in shown],
        )

    @console.page("topics/<name>")
    async def topic_page(name: str) -> Response:
        """One topic's records: the latest N, from an offset or from a time; one or all partitions."""
        reader = TopicReader(client())
        try:
            error, partitions = await reader.partitions(name)
        except UpstreamError as exc:
            return console.render(
                "console/message.html", 503, title=name, message=f"The cluster does not answer: {exc}"
            )
        if error:
            return console.render(
                "console/message.html", 404, title=name, message=f"No topic {name!r} (error {error})."
            )
        args = request.args
        mode = args.get("mode", "latest") if args.get("mode") in ("latest", "offset", "time") else "latest"
        count = _int(args.get("count"), DEFAULT_RECORDS, 1, MAX_RECORDS)
        chosen = args.get("partition", "all")
        selected = [int(chosen)] if chosen.isdigit() and int(chosen) in partitions else partitions
        offset = _int(args.get("offset"), 0, 0, 2**62)
        at_text = args.get("time", "")
        at_ms = _time_ms(at_text)
        problem = None
        if mode == "time" and at_ms is None:
            problem, mode = f"Not a time: {at_text!r} (an ISO date-time, UTC, or epoch milliseconds).", "latest"
        found = await browse(reader, name, selected, mode, count, offset, at_ms or 0)
        rows = []
        for record in found.records:
            notes = [(title, note(record)) for title, note in columns]
            rows.append(
                {
                    "record": record,
                    "when": _when(record.timestamp),
                    "key": show_bytes(record.key),
                    "value": await shown_value(record),
                    "headers": [(k, show_bytes(v).text) for k, v in record.headers],
                    "notes": notes,
                }
            )
        last = found.records[-1].offset if found.records and mode != "latest" else None
        return console.render(
            "console/topic.html",
            title=f"Topic {name}",
            name=name,
            partitions=partitions,
            chosen=chosen if chosen in {str(p) for p in partitions} else "all",
            mode=mode,
            count=count,
            offset=offset,
            time=at_text,
            problem=problem,
            rows=rows,
            columns=[title for title, _ in columns],
            starts=found.starts,
            ends=found.ends,
            next_offset=None if last is None or len(selected) != 1 else last + 1,
        )
