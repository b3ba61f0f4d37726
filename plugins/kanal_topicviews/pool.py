"""A helper process that runs half of the SQL of large read-aheads, on another core.

The gateway runs in one thread: the SQL of every view runs on one core. For a consumer that is
behind (see :mod:`kanal_topicviews.readahead`), each read-ahead chunk (megabytes of records) is split
at a batch boundary: the helper process transforms the second part (:data:`LOCAL_SHARE` stays) while
the gateway transforms the first, and the two outputs are joined. The helper is started (``spawn``)
the first time a large chunk needs it and lives as long as the gateway (it exits when its pipe
closes). Views that decode through a schema registry, and chunks smaller than :data:`MIN_SPLIT`
bytes, stay in the gateway. The process, and how the chunk's part reaches it, is
`kanal.api.HelperProcess`; should the helper fail, the gateway transforms that part itself.
The gateway's part is transformed in place (``Transformer.fetch`` with ``stop``), not copied out of the
chunk first.

The split keeps the semantics of :meth:`Transformer.fetch` exactly: the halves are cut between whole
batches, so every batch is handled as a whole by one side; when the first half fails (FAIL_FETCH)
the second is discarded, and when the second fails its delivered records are appended to the first
half's. ``GATEWAY_FEATURE_FLAGS_TOPIC_VIEWS_HELPER_PROCESS=false`` turns the helper off.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Callable
from typing import Any, Final

from kanal.api import HelperProcess

from .transform import FetchFailed, Transformer

__all__ = ["MIN_SPLIT", "HelperPool", "split_point"]

MIN_SPLIT: Final = 512 * 1024
#: The part of a chunk the gateway keeps: it also receives, decodes and sends the chunk. Timed per
#: chunk on the benchmark, the helper's part took about 1.5 times as long as the gateway's with 0.4,
#: and the two end about together (the gateway then reads the next chunk) with 0.45-0.47.
LOCAL_SHARE: Final = 0.45
_LEN: Final = struct.Struct(">qi")


def split_point(data: bytes, share: float = 0.5) -> int | None:
    """The batch boundary nearest to ``share`` of ``data`` (None when there is no boundary inside it)."""
    n = len(data)
    target = n * share
    pos = 0
    best = None
    while n - pos >= 12:
        length = _LEN.unpack_from(data, pos)[1]
        end = pos + 12 + length
        if length < 0 or end > n:
            break
        if 0 < end < n and (best is None or abs(end - target) < abs(best - target)):
            best = end
        pos = end
    return best


class HelperPool:
    """The helper process of topic views (``kanal.api.HelperProcess``), and the split."""

    def __init__(self, start_soon: Callable[..., None] | None = None) -> None:
        # start_soon: the gateway's (services.start_soon), so the process starts as one of its tasks
        self._helper = HelperProcess("kanal-topic-views-helper", _transform, start_soon)

    @property
    def usable(self) -> bool:
        return self._helper.usable

    @property
    def started(self) -> bool:
        """Whether the helper process is ready (it starts with the first large chunk)."""
        return self._helper.started

    async def ready(self) -> bool:
        """Starts the helper process if need be and waits until it is ready."""
        return await self._helper.ready()

    async def fetch(self, transformer: Transformer, statement: str, drop: bool, data: bytes, partition: int,
                    fetch_offset: int) -> bytes:  # fmt: skip
        """``transformer.fetch(data, partition, fetch_offset)``, with the second part done by the helper.
        Raises :class:`FetchFailed` as the transformer would."""
        helper = self._helper
        cut = split_point(data, LOCAL_SHARE) if len(data) >= MIN_SPLIT and helper.usable else None
        if cut is None or not helper.started:
            if cut is not None:
                helper.start()  # in the background: this chunk, and those until it is ready, stay here
            return transformer.fetch(data, partition, fetch_offset)
        job = [statement, drop, partition, fetch_offset]
        first, reply = await helper.run(
            job, memoryview(data)[cut:], lambda: transformer.fetch(data, partition, fetch_offset, cut)
        )
        if reply is None:  # the helper could not: the second part here
            reply = _answer(transformer, data[cut:], partition, fetch_offset)
        if reply[:1] == b"=":  # the second part unchanged
            return data if first is data else first + data[cut:]
        if reply[:1] == b"0":
            return _head(first, data, cut) + reply[1:]
        offset, reason, has_records = json.loads(reply[1 : reply.index(b"\n")])
        records = reply[reply.index(b"\n") + 1 :] if has_records else b""
        raise FetchFailed(offset, reason, _head(first, data, cut) + records)

    def close(self) -> None:
        self._helper.close()


def _head(first: bytes, data: bytes, cut: int) -> bytes:
    """The gateway's part of the answer (``first is data``: unchanged, see ``Transformer.fetch``)."""
    return data[:cut] if first is data else first


def _transform(job: list[Any], data: bytes) -> bytes:
    """The helper's job: ``data`` through the view's SQL."""
    statement, drop, partition, fetch_offset = job
    return _answer(_transformer(statement, drop), data, partition, fetch_offset)


@functools.lru_cache(maxsize=256)
def _transformer(statement: str, drop: bool) -> Transformer:
    """A view's transformer, compiled once per process."""
    from .views import compiled

    return Transformer(compiled(statement), drop)


def _answer(transformer: Transformer, data: bytes, partition: int, fetch_offset: int) -> bytes:
    """``transformer.fetch`` as the helper answers: ``=`` when unchanged, ``0`` + the records, or ``1`` +
    JSON ``[offset, reason, has records]``, a newline and the records delivered (FAIL_FETCH)."""
    try:
        out = transformer.fetch(data, partition, fetch_offset)
    except FetchFailed as failed:
        meta = [failed.offset, failed.reason, failed.records is not None]
        return b"1" + json.dumps(meta).encode() + b"\n" + (failed.records or b"")
    return b"=" if out is data else b"0" + out
