"""The JSONL capture format: one JSON object per Kafka frame, in the order the recorder saw them.

Fields (see ``conformance/captures`` and docs/conformance.md):

========================  =========================================================================
``conn``                  connection number (1, 2, ...) in order of accept
``seq``                   frame number within that connection
``dir``                   ``c2s`` / ``s2c`` (client and broker, no gateway in between), or, in a
                          capture taken by the gateway, ``c2g`` / ``g2c`` (client side) and ``g2u`` /
                          ``u2g`` (upstream side)
``t``                     Unix time in seconds when the frame was seen
``api_key``               of the request; on responses copied from the request they answer
``api_version``           idem
``correlation_id``        from the request header, or the response header
``frame``                 base64 of the frame payload, without the 4-byte length prefix
``node``                  optional: the broker id of the gateway port the client connected to
``redacted``              optional: what was redacted in this frame (``sasl``, ``records``)
========================  =========================================================================
"""

from __future__ import annotations

import base64
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import orjson

from kanal.protocol.headers import InvalidHeader, peek_request, response_correlation_id

C2S, S2C = "c2s", "s2c"
C2G, G2U, U2G, G2C = "c2g", "g2u", "u2g", "g2c"
DIRECTIONS = (C2S, S2C, C2G, G2U, U2G, G2C)
REQUEST_DIRECTIONS = frozenset({C2S, C2G, G2U})
#: The direction of the responses that answer requests of a direction.
RESPONSE_OF = {C2S: S2C, C2G: G2C, G2U: U2G}


class CaptureFormatError(ValueError):
    """A capture file that does not follow the frame format; the message names file and line."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One captured frame. ``data`` is the payload without the length prefix."""

    conn: int
    seq: int
    dir: str
    t: float
    api_key: int | None
    api_version: int | None
    correlation_id: int | None
    data: bytes
    node: int | None = None
    redacted: tuple[str, ...] = ()

    @property
    def is_request(self) -> bool:
        return self.dir in REQUEST_DIRECTIONS

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "conn": self.conn,
            "seq": self.seq,
            "dir": self.dir,
            "t": self.t,
            "api_key": self.api_key,
            "api_version": self.api_version,
            "correlation_id": self.correlation_id,
            "frame": base64.b64encode(self.data).decode("ascii"),
        }
        if self.node is not None:
            obj["node"] = self.node
        if self.redacted:
            obj["redacted"] = list(self.redacted)
        return obj

    @classmethod
    def from_json(cls, obj: Any, where: str = "") -> Frame:
        if not isinstance(obj, dict):
            raise CaptureFormatError(f"{where}: expected a JSON object per line")
        try:
            direction = obj["dir"]
            if direction not in DIRECTIONS:
                raise CaptureFormatError(f"{where}: dir must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
            return cls(
                conn=int(obj["conn"]),
                seq=int(obj["seq"]),
                dir=direction,
                t=float(obj.get("t", 0.0)),
                api_key=_opt_int(obj.get("api_key")),
                api_version=_opt_int(obj.get("api_version")),
                correlation_id=_opt_int(obj.get("correlation_id")),
                data=base64.b64decode(obj["frame"], validate=True),
                node=_opt_int(obj.get("node")),
                redacted=tuple(str(r) for r in obj.get("redacted", ())),
            )
        except KeyError as exc:
            raise CaptureFormatError(f"{where}: missing field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            if isinstance(exc, CaptureFormatError):
                raise
            raise CaptureFormatError(f"{where}: {exc}") from None


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def iter_frames(lines: Iterable[str | bytes], source: str = "<capture>") -> Iterator[Frame]:
    """Frames from JSONL lines; blank lines are skipped."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise CaptureFormatError(f"{source}:{number}: invalid JSON: {exc}") from None
        yield Frame.from_json(obj, f"{source}:{number}")


def read_frames(path: str | Path) -> list[Frame]:
    """Every frame of a JSONL capture file."""
    path = Path(path)
    with path.open("rb") as fh:
        return list(iter_frames(fh, str(path)))


def is_frame_capture(path: str | Path) -> bool:
    """Whether a file holds Kafka frames in this format (judged on its first line); the registry
    captures, also JSONL, hold HTTP exchanges and answer False."""
    try:
        with Path(path).open("rb") as fh:
            for line in fh:
                if line.strip():
                    obj = orjson.loads(line)
                    return isinstance(obj, dict) and {"conn", "dir", "frame"} <= obj.keys()
    except (OSError, orjson.JSONDecodeError):
        return False
    return False


def dump_frame(frame: Frame) -> bytes:
    """One JSONL line (with its newline)."""
    return orjson.dumps(frame.to_json()) + b"\n"


class FrameWriter:
    """Writes frames to a binary file object, one JSON object per line."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.count = 0

    def write(self, frame: Frame) -> None:
        self.out.write(dump_frame(frame))
        self.count += 1

    def flush(self) -> None:
        self.out.flush()


def write_frames(path: str | Path, frames: Iterable[Frame]) -> int:
    """Writes a whole capture file; returns the number of frames."""
    with Path(path).open("wb") as fh:
        writer = FrameWriter(fh)
        for frame in frames:
            writer.write(frame)
        return writer.count


# -- pairing -----------------------------------------------------------------------------------


@dataclass(slots=True)
class Exchange:
    """A captured request and the response that answered it (None: the capture has no answer, as
    for a Produce with acks=0 or a Fetch still pending when the client closed)."""

    request: Frame
    response: Frame | None = None


@dataclass(slots=True)
class ApiTracker:
    """Remembers the api key and version of requests by correlation id, per connection and side,
    so that responses (which carry only the correlation id) can be labelled."""

    _pending: dict[tuple[int, str], dict[int, deque[tuple[int, int]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(deque))
    )

    def request(self, conn: int, direction: str, data: bytes | bytearray) -> tuple[int | None, int | None, int | None]:
        """(api key, version, correlation id) of a request frame, remembered for its response."""
        try:
            key, version, corr = peek_request(data)
        except InvalidHeader:
            return None, None, None
        self._pending[(conn, direction)][corr].append((key, version))
        return key, version, corr

    def response(self, conn: int, direction: str, data: bytes | bytearray) -> tuple[int | None, int | None, int | None]:
        """(api key, version, correlation id) of a response frame of ``direction``."""
        try:
            corr = response_correlation_id(data)
        except InvalidHeader:
            return None, None, None
        request_dir = next((k for k, v in RESPONSE_OF.items() if v == direction), direction)
        queue = self._pending[(conn, request_dir)].get(corr)
        if not queue:
            return None, None, corr
        key, version = queue.popleft()
        return key, version, corr

    def forget(self, conn: int) -> None:
        for key in [k for k in self._pending if k[0] == conn]:
            del self._pending[key]


def label(frames: Iterable[Frame]) -> list[Frame]:
    """The frames with api key, version and correlation id taken from the frame bytes (requests)
    and from the request each response answers (responses)."""
    tracker = ApiTracker()
    out = []
    for frame in frames:
        if frame.is_request:
            key, version, corr = tracker.request(frame.conn, frame.dir, frame.data)
        else:
            key, version, corr = tracker.response(frame.conn, frame.dir, frame.data)
        out.append(replace(frame, api_key=key, api_version=version, correlation_id=corr))
    return out


def exchanges(frames: Iterable[Frame], request_dir: str) -> dict[int, list[Exchange]]:
    """Requests of ``request_dir`` with their responses, per connection, in request order.

    A response answers the oldest unanswered request of its connection with the same correlation
    id (responses come back in request order on a Kafka connection)."""
    response_dir = RESPONSE_OF[request_dir]
    result: dict[int, list[Exchange]] = defaultdict(list)
    waiting: dict[int, dict[int, deque[Exchange]]] = defaultdict(lambda: defaultdict(deque))
    for frame in frames:
        if frame.dir == request_dir:
            exchange = Exchange(frame)
            result[frame.conn].append(exchange)
            corr = frame.correlation_id if frame.correlation_id is not None else _request_corr(frame.data)
            waiting[frame.conn][corr].append(exchange)
        elif frame.dir == response_dir:
            corr = frame.correlation_id if frame.correlation_id is not None else _response_corr(frame.data)
            queue = waiting[frame.conn].get(corr)
            if queue:
                queue.popleft().response = frame
    return dict(result)


def _request_corr(data: bytes) -> int:
    try:
        return peek_request(data)[2]
    except InvalidHeader:
        return -1


def _response_corr(data: bytes) -> int:
    try:
        return response_correlation_id(data)
    except InvalidHeader:
        return -1


# -- a capture, structured for replay ------------------------------------------------------------


@dataclass
class Capture:
    """A capture seen as what a replay needs.

    ``client`` holds, per connection, the requests the client sent and the responses it received;
    ``upstream`` the exchanges with the broker, which the scripted broker answers from. For a
    capture between a client and a broker (``c2s``/``s2c``) both are the same exchanges; for one
    taken by a gateway they are its client side (``c2g``/``g2c``) and upstream side
    (``g2u``/``u2g``), so the expected responses are what that gateway answered.
    """

    frames: list[Frame]
    gateway_side: bool
    client: dict[int, list[Exchange]]
    upstream: dict[int, list[Exchange]]

    @classmethod
    def from_frames(cls, frames: Iterable[Frame], source: str = "<capture>") -> Capture:
        frames = list(frames)
        directions = {f.dir for f in frames}
        gateway_side = bool(directions & {C2G, G2U, U2G, G2C})
        if gateway_side and directions & {C2S, S2C}:
            raise CaptureFormatError(f"{source}: mixes client-broker (c2s/s2c) and gateway (c2g/g2u/u2g/g2c) frames")
        if gateway_side:
            return cls(frames, True, exchanges(frames, C2G), exchanges(frames, G2U))
        pairs = exchanges(frames, C2S)
        return cls(frames, False, pairs, pairs)

    @classmethod
    def read(cls, path: str | Path) -> Capture:
        return cls.from_frames(read_frames(path), str(path))

    @property
    def request_dir(self) -> str:
        return C2G if self.gateway_side else C2S

    @property
    def response_dir(self) -> str:
        return G2C if self.gateway_side else S2C

    @property
    def upstream_response_dir(self) -> str:
        return U2G if self.gateway_side else S2C

    def node_of(self, conn: int) -> int | None:
        """The broker id the client connected to, when the capture says."""
        return next((f.node for f in self.frames if f.conn == conn and f.node is not None), None)

    def upstream_responses(self) -> list[Frame]:
        return [f for f in self.frames if f.dir == self.upstream_response_dir]

    def expected_responses(self) -> list[Frame]:
        return [f for f in self.frames if f.dir == self.response_dir]
