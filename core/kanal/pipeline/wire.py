"""Built-in interceptors on the wire bytes: the hot requests of ACLs and virtual clusters, undecoded.

Decoding a Produce request with kio, running it through the dispatcher and encoding it again costs
far more than what the ACL enforcer and the virtual cluster's names do with it: check a few names,
add a prefix. So those built-ins also handle their hot requests (Produce, Fetch) on the frame: the
connection reads the names once (:mod:`kanal.protocol.name_spans`), each stage decides on them, and
a rename is a splice that copies the record bytes as they are. A stage that cannot decide on the
bytes alone (a denial to answer, a name it must refuse, an id it has not seen named) says so, and
the request takes the decoded path through every hook, which gives the exact answer.

Only built-ins have stages: the core knows what their hooks would do and the tests hold the two
paths to the same result. A configured interceptor that hooks the request puts it on the decoded
path, built-ins included, so the onion's order is never bent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar, Protocol, runtime_checkable

from kanal.api.context import Connection
from kanal.protocol.api import ApiKey
from kanal.protocol.headers import RequestHeader
from kanal.protocol.name_spans import RequestNames, fetch_response_ids, request_names
from kanal.protocol.scan import IdMap

__all__ = ["ResponseFix", "TopicIdFix", "WirePath", "WireRequest", "WireStage", "id_map", "streams"]

#: Turns the broker's whole response frame into the client's (a stage's response side).
ResponseFix = Callable[[bytearray], bytearray]


class TopicIdFix:
    """A response fix that only maps a Fetch v13+ response's topic ids. Ids keep their length, so
    the fix can also be applied while a large response streams (:func:`streams`, :func:`id_map`) instead of
    holding it whole."""

    __slots__ = ("map_id", "version")

    def __init__(self, version: int, map_id: IdMap) -> None:
        self.version = version
        self.map_id = map_id

    def __call__(self, frame: bytearray) -> bytearray:
        found = fetch_response_ids(frame, self.version)
        if not found:
            return frame
        out = bytearray(frame)  # (a copy: the caller may need the frame as it came)
        map_id = self.map_id
        for at in found:
            out[at : at + 16] = map_id(bytes(out[at : at + 16]))
        return out


def streams(fixes: Sequence[ResponseFix]) -> bool:
    """Whether a response with these fixes may be forwarded while it arrives (they only map ids)."""
    return all(isinstance(fix, TopicIdFix) for fix in fixes)


def id_map(fixes: Sequence[ResponseFix]) -> IdMap | None:
    """The one id map that stands for a streamable response's fixes (None: no fixes)."""
    maps = [fix.map_id for fix in fixes if isinstance(fix, TopicIdFix)]
    if len(maps) <= 1:
        return maps[0] if maps else None

    def composed(topic_id: bytes) -> bytes:
        for map_id in maps:
            topic_id = map_id(topic_id)
        return topic_id

    return composed


class WireRequest:
    """One request as its stages see it: the frame, its names, and what its response needs."""

    __slots__ = ("_frame", "_names", "fixes", "header", "info")

    def __init__(self, info: Connection, header: RequestHeader, frame: bytearray) -> None:
        self.info = info
        self.header = header
        self._frame = frame
        #: The response's fixes, in the order they were added (applied last added first: innermost).
        self.fixes: list[ResponseFix] = []
        self._names: RequestNames | None = None

    @property
    def frame(self) -> bytearray:
        return self._frame

    @frame.setter
    def frame(self, frame: bytearray) -> None:
        self._frame = frame
        self._names = None

    @property
    def names(self) -> RequestNames:
        """The names in the frame as it is now (read on first use). Raises InvalidHeader."""
        if self._names is None:
            self._names = request_names(self._frame, self.header)
        return self._names


@runtime_checkable
class WireStage(Protocol):
    """A built-in interceptor that can handle the requests of :attr:`wire_api_keys` on their bytes."""

    wire_api_keys: ClassVar[frozenset[int]]

    def wire_request(self, request: WireRequest) -> bool:
        """Handles the request on its bytes: may replace ``request.frame`` (after every stage before
        it agreed) and add a response fix. False: it cannot; the request as the client sent it is
        then decoded, and what the stages did to it is dropped. The outcome must depend on nothing
        but the request's names and what changes the pipeline's version (for the ACLs:
        :meth:`~kanal.pipeline.chain.Pipeline.decisions_changed`), as :class:`WirePath` remembers it."""
        ...


class _Outcome:
    """The last Produce a connection's stages let through, when it named one topic."""

    __slots__ = ("api_version", "body", "end", "fixes", "prefix", "renamed", "stages", "version")

    def __init__(
        self,
        stages: Sequence[WireStage],
        version: int,
        header: RequestHeader,
        prefix: bytes,
        renamed: bytes,
        fixes: list[ResponseFix],
    ) -> None:
        self.stages = stages
        self.version = version
        self.api_version = header.api_version
        self.body = header.body_offset
        self.end = header.body_offset + len(prefix)
        self.prefix = prefix
        self.renamed = renamed
        self.fixes = fixes


class WirePath:
    """Runs one connection's wire stages, remembering the outcome of the last one-topic Produce.

    A producer sends the same transactional id and topic in request after request, so the frame's
    bytes from the body's start to the end of its only topic name repeat exactly (the topic count is
    among them). When they do, for the same chain and pipeline version, the outcome is the same:
    the request is spliced from memory, without a walk or a decision.
    That is what brings the stages' cost near nothing on the request-rate benchmark.
    """

    __slots__ = ("_last", "info")

    def __init__(self, info: Connection) -> None:
        self.info = info
        self._last: _Outcome | None = None

    def run(
        self, stages: Sequence[WireStage], version: int, header: RequestHeader, frame: bytearray
    ) -> tuple[bytearray, list[ResponseFix]] | None:
        """The frame to forward and the response's fixes (applied in order), or None when a stage
        cannot handle the request on its bytes (decode it). ``version``: the pipeline's. Raises
        InvalidHeader."""
        last = self._last
        if (
            last is not None
            and last.stages is stages
            and last.version == version
            and last.api_version == header.api_version
            and last.body == header.body_offset
            and frame[last.body : last.end] == last.prefix
        ):
            return frame[: last.body] + last.renamed + frame[last.end :], last.fixes
        request = WireRequest(self.info, header, frame)
        names = request.names if header.api_key == ApiKey.PRODUCE else None
        for stage in stages:
            if not stage.wire_request(request):
                return None
        out, fixes = request.frame, request.fixes[::-1]
        if names is not None and len(names.topics) == 1 and not names.topic_ids:
            self._remember(stages, version, header, frame, out, names.topics[0].end, fixes)
        return out, fixes

    def _remember(
        self,
        stages: Sequence[WireStage],
        version: int,
        header: RequestHeader,
        frame: bytearray,
        out: bytearray,
        end: int,
        fixes: list[ResponseFix],
    ) -> None:
        """Keeps the outcome if the stages changed nothing past the name (so the prefix alone decides)."""
        moved = end + len(out) - len(frame)
        if out[: header.body_offset] == frame[: header.body_offset] and out[moved:] == frame[end:]:
            renamed = bytes(out[header.body_offset : moved])
            self._last = _Outcome(stages, version, header, bytes(frame[header.body_offset : end]), renamed, fixes)
