"""A helper process that runs half of the SQL of large read-aheads, on another core.

The gateway runs in one thread: the SQL of every view runs on one core. For a consumer that is
behind (see :mod:`kanal_topicviews.readahead`), each read-ahead chunk (megabytes of records) is split
at a batch boundary: the helper process transforms the second part (:data:`LOCAL_SHARE` stays) while
the gateway transforms the first, and the two outputs are joined. The helper is started (``spawn``)
the first time a large chunk needs it and lives as long as the gateway (it exits when its pipe
closes). Views that decode through a schema registry, and chunks smaller than :data:`MIN_SPLIT`
bytes, stay in the gateway.

The split keeps the semantics of :meth:`Transformer.fetch` exactly: the halves are cut between whole
batches, so every batch is handled as a whole by one side; when the first half fails (FAIL_FETCH)
the second is discarded, and when the second fails its delivered records are appended to the first
half's. ``GATEWAY_FEATURE_FLAGS_TOPIC_VIEWS_HELPER_PROCESS=false`` turns the helper off.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import struct
from multiprocessing.connection import Connection
from typing import Any, Final

import trio

from .transform import FetchFailed, Transformer

__all__ = ["MIN_SPLIT", "HelperPool", "split_point"]

log = logging.getLogger("kanal_topicviews")

MIN_SPLIT: Final = 512 * 1024
#: The part of a chunk the gateway keeps: it also receives, decodes and sends the chunk.
LOCAL_SHARE: Final = 0.4
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
    """One helper process, one job at a time: a chunk that finds the helper busy waits for it (the
    gateway meanwhile serves other requests), so the split stays :data:`LOCAL_SHARE`."""

    def __init__(self) -> None:
        self._conn: Connection | None = None
        self._process: Any = None
        self._lock = trio.Lock()
        self._broken = False

    @property
    def usable(self) -> bool:
        return not self._broken

    @property
    def started(self) -> bool:
        """Whether the helper process runs (it starts with the first large chunk)."""
        return self._conn is not None

    async def _start(self) -> Connection:
        if self._conn is None:
            context = multiprocessing.get_context("spawn")
            parent, child = context.Pipe()
            process = context.Process(target=_serve, args=(child,), name="kanal-topic-views-helper", daemon=True)
            await trio.to_thread.run_sync(process.start)
            child.close()
            self._conn, self._process = parent, process
            log.info("topic views: helper process %d started", process.pid)
        return self._conn

    async def fetch(self, transformer: Transformer, statement: str, drop: bool, data: bytes, partition: int,
                    fetch_offset: int) -> bytes:  # fmt: skip
        """``transformer.fetch(data, partition, fetch_offset)``, with the second half done by the helper.
        Raises :class:`FetchFailed` as the transformer would."""
        cut = split_point(data, LOCAL_SHARE) if len(data) >= MIN_SPLIT and not self._broken else None
        if cut is None:
            return transformer.fetch(data, partition, fetch_offset)
        async with self._lock:
            try:
                conn = await self._start()
                header = json.dumps([statement, drop, partition, fetch_offset]).encode()
                conn.send_bytes(header)  # the helper reads at once: a few ms for megabytes
                conn.send_bytes(memoryview(data)[cut:])
            except (OSError, EOFError, ValueError) as exc:
                self._fail(exc)
                return transformer.fetch(data, partition, fetch_offset)
            first: bytes | FetchFailed
            head = data[:cut]
            try:
                first = transformer.fetch(head, partition, fetch_offset)
            except FetchFailed as failed:
                first = failed
            try:
                reply = await trio.to_thread.run_sync(conn.recv_bytes)
            except (OSError, EOFError) as exc:
                self._fail(exc)
                if isinstance(first, FetchFailed):
                    raise first from None
                return first + transformer.fetch(data[cut:], partition, fetch_offset)
        if isinstance(first, FetchFailed):
            raise first
        if reply[:1] == b"=":  # the second half unchanged
            return data if first is head else first + data[cut:]
        if reply[:1] == b"0":
            return first + reply[1:]
        if reply[:1] == b"2":
            raise RuntimeError(f"topic views helper: {reply[1:].decode(errors='replace')}")
        offset, reason, has_records = json.loads(reply[1 : reply.index(b"\n")])
        records = reply[reply.index(b"\n") + 1 :] if has_records else b""
        raise FetchFailed(offset, reason, first + records)

    def _fail(self, exc: BaseException) -> None:
        log.warning("topic views: the helper process is gone (%s); the SQL of views runs in the gateway only", exc)
        self._broken = True
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._process is not None:
            self._process.join(2)
            if self._process.is_alive():
                self._process.terminate()
            self._process = None


def _serve(conn: Connection) -> None:
    """The helper process: transform what the gateway sends until the pipe closes."""
    from .views import compiled

    transformers: dict[tuple[str, bool], Transformer] = {}
    while True:
        try:
            statement, drop, partition, fetch_offset = json.loads(conn.recv_bytes())
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            transformer = transformers.get((statement, drop))
            if transformer is None:
                if len(transformers) > 256:
                    transformers.clear()
                transformer = transformers[(statement, drop)] = Transformer(compiled(statement), drop)
            try:
                out = transformer.fetch(data, partition, fetch_offset)
                conn.send_bytes(b"=" if out is data else b"0" + out)
            except FetchFailed as failed:
                meta = [failed.offset, failed.reason, failed.records is not None]
                conn.send_bytes(b"1" + json.dumps(meta).encode() + b"\n" + (failed.records or b""))
        except (EOFError, OSError):
            return
        except Exception as exc:  # report, keep serving
            conn.send_bytes(b"2" + repr(exc).encode())
