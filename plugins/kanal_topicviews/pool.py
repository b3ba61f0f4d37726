"""A helper process that runs half of the SQL of large read-aheads, on another core.

The gateway runs in one thread: the SQL of every view runs on one core. For a consumer that is
behind (see :mod:`kanal_topicviews.readahead`), each read-ahead chunk (megabytes of records) is split
at a batch boundary: the helper process transforms the second part (:data:`LOCAL_SHARE` stays) while
the gateway transforms the first, and the two outputs are joined. The helper is started (``spawn``)
the first time a large chunk needs it and lives as long as the gateway (it exits when its pipe
closes). Views that decode through a schema registry, and chunks smaller than :data:`MIN_SPLIT`
bytes, stay in the gateway. The chunk's part goes through memory both processes map (on Linux; the
pipe elsewhere); the pipe carries the job and the answer. The gateway's part is transformed in place
(``Transformer.fetch`` with ``stop``), not copied out of the chunk first.

The split keeps the semantics of :meth:`Transformer.fetch` exactly: the halves are cut between whole
batches, so every batch is handled as a whole by one side; when the first half fails (FAIL_FETCH)
the second is discarded, and when the second fails its delivered records are appended to the first
half's. ``GATEWAY_FEATURE_FLAGS_TOPIC_VIEWS_HELPER_PROCESS=false`` turns the helper off.
"""

from __future__ import annotations

import json
import logging
import mmap
import multiprocessing
import os
import struct
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any, Final

import trio

from .transform import FetchFailed, Transformer

__all__ = ["MIN_SPLIT", "HelperPool", "split_point"]

log = logging.getLogger("kanal_topicviews")

MIN_SPLIT: Final = 512 * 1024
#: The part of a chunk the gateway keeps: it also receives, decodes and sends the chunk. Timed per
#: chunk on the benchmark, the helper's part took about 1.5 times as long as the gateway's with 0.4,
#: and the two end about together (the gateway then reads the next chunk) with 0.45-0.47.
LOCAL_SHARE: Final = 0.45
_LEN: Final = struct.Struct(">qi")
#: Chunks go to the helper through shared memory (an anonymous memfd mapped by both processes, grown
#: in steps of :data:`_MAP_STEP`): through the pipe, a few MB cost the helper about 3 ms to receive
#: (buffers allocated per read) and the gateway as long to send.
_SHARED_MEMORY: Final = hasattr(os, "memfd_create")
_MAP_STEP: Final = 1 << 20


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
        self._shared: mmap.mmap | None = None

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

    def _send(self, conn: Connection, job: list[Any], part: memoryview) -> None:
        """Hands ``part`` to the helper: through the shared memory (grown, and its new handle sent,
        when ``part`` does not fit), else on the pipe."""
        size = len(part)
        if not _SHARED_MEMORY:
            conn.send_bytes(json.dumps([*job, -1, 0]).encode())
            conn.send_bytes(part)
            return
        grown = None
        if self._shared is None or len(self._shared) < size:
            capacity = -(-(size + size // 4) // _MAP_STEP) * _MAP_STEP
            fd = os.memfd_create("kanal-topic-views", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, capacity)
                grown = mmap.mmap(fd, capacity)
                grown[:size] = part  # written before the helper hears of it
                conn.send_bytes(json.dumps([*job, size, capacity]).encode())
                send_handle(conn, fd, self._process.pid)
            except BaseException:
                if grown is not None:
                    grown.close()
                raise
            finally:
                os.close(fd)
            if self._shared is not None:
                self._shared.close()
            self._shared = grown
            return
        self._shared[:size] = part
        conn.send_bytes(json.dumps([*job, size, 0]).encode())

    async def fetch(self, transformer: Transformer, statement: str, drop: bool, data: bytes, partition: int,
                    fetch_offset: int) -> bytes:  # fmt: skip
        """``transformer.fetch(data, partition, fetch_offset)``, with the second part done by the helper.
        Raises :class:`FetchFailed` as the transformer would."""
        cut = split_point(data, LOCAL_SHARE) if len(data) >= MIN_SPLIT and not self._broken else None
        if cut is None:
            return transformer.fetch(data, partition, fetch_offset)
        async with self._lock:
            try:
                conn = await self._start()
                self._send(conn, [statement, drop, partition, fetch_offset], memoryview(data)[cut:])
            except (OSError, EOFError, ValueError) as exc:
                self._fail(exc)
                return transformer.fetch(data, partition, fetch_offset)
            first: bytes | Exception
            try:
                first = transformer.fetch(data, partition, fetch_offset, cut)
            except Exception as exc:  # FetchFailed; anything else once the helper's answer is read
                first = exc  # (left unread, it would be taken for the answer to the next chunk)
            try:
                reply = await trio.to_thread.run_sync(conn.recv_bytes)
            except (OSError, EOFError) as exc:
                self._fail(exc)
                if isinstance(first, Exception):
                    raise first from None
                return _head(first, data, cut) + transformer.fetch(data[cut:], partition, fetch_offset)
        if isinstance(first, Exception):
            raise first
        if reply[:1] == b"=":  # the second part unchanged
            return data if first is data else first + data[cut:]
        if reply[:1] == b"0":
            return _head(first, data, cut) + reply[1:]
        if reply[:1] == b"2":
            raise RuntimeError(f"topic views helper: {reply[1:].decode(errors='replace')}")
        offset, reason, has_records = json.loads(reply[1 : reply.index(b"\n")])
        records = reply[reply.index(b"\n") + 1 :] if has_records else b""
        raise FetchFailed(offset, reason, _head(first, data, cut) + records)

    def _fail(self, exc: BaseException) -> None:
        log.warning("topic views: the helper process is gone (%s); the SQL of views runs in the gateway only", exc)
        self._broken = True
        self.close(wait=False)

    def close(self, wait: bool = True) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._shared is not None:
            self._shared.close()
            self._shared = None
        if self._process is not None and wait:
            self._process.join(2)
            if self._process.is_alive():
                self._process.terminate()
            self._process = None


def _head(first: bytes, data: bytes, cut: int) -> bytes:
    """The gateway's part of the answer (``first is data``: unchanged, see ``Transformer.fetch``)."""
    return data[:cut] if first is data else first


def _serve(conn: Connection) -> None:
    """The helper process: transform what the gateway sends until the pipe closes."""
    from .views import compiled

    transformers: dict[tuple[str, bool], Transformer] = {}
    shared: mmap.mmap | None = None
    while True:
        try:
            statement, drop, partition, fetch_offset, size, capacity = json.loads(conn.recv_bytes())
            if capacity:
                fd = recv_handle(conn)
                try:
                    grown = mmap.mmap(fd, capacity)
                finally:
                    os.close(fd)
                if shared is not None:
                    shared.close()
                shared = grown
            if size < 0:
                data = conn.recv_bytes()
            elif shared is not None:
                data = shared[:size]
            else:  # cannot happen: the first chunk in shared memory brings its handle
                return
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
        # Freed before the next chunk arrives: its buffer then reuses this memory.
        data = out = b""
