"""Conformance cases and their replay through an in-process gateway against a scripted broker.

A *case* is a capture (JSONL frames) plus, optionally, a case file ``NAME.case.yaml`` next to
``NAME.jsonl`` (or anywhere, naming its capture) that gives the gateway config to replay with and
the documented differences to expect::

    description: what this case shows
    capture: ../captures/kafka/kafkapython.jsonl   # default: NAME.jsonl next to the case file
    config:            # a gateway config document, as for `kanal run --config` (gateway, kafka, interceptors)
      interceptors: [...]
    env: {GATEWAY_FEATURE_FLAGS_X: "true"}         # extra GATEWAY_*/KAFKA_* variables
    resources: [...]                               # admin-API manifests applied to the gateway first
                                                   # (see kanal.conformance.resources)
    plugins: [my_module:plugin]                    # plugin objects to register (module paths may be
                                                   # relative to the case file's folder)
    compare_upstream_requests: true                # also compare what the gateway sends upstream
    timeout: 5                                     # seconds to wait for any one response
    expect: [...]                                  # see kanal.conformance.diff

The replay, deterministic and without a broker:

1. A :class:`~kanal.conformance.scripted_broker.ScriptedBroker` starts on a free port, and a
   :class:`~kanal.gateway.Gateway` in front of it (ports from a free block, ``GATEWAY_MIN_BROKERID``
   the smallest captured broker id), with the case's config.
2. The capture's client-side frames are played in the captured global order by a single task: a
   request is sent on its connection (opened at its first frame, on the gateway port of the broker
   it went to), and where the capture shows a response the next response of that connection is read
   and compared. A connection is closed after its last captured frame, once the broker has received
   what the gateway had to forward on it.
3. Responses are compared as decoded messages, after the documented rewrites (broker addresses,
   throttle times) and the case's expectations; correlation ids must be the captured ones. With
   ``compare_upstream_requests``, each request the gateway forwarded is compared with the captured
   request it was matched to (correlation ids aside), and a captured request never forwarded fails.
4. Problems of the scripted broker (a request it has no answer for) and expectations that never
   applied (stale golden files) fail the case too.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import yaml

from kanal.api.context import Connection
from kanal.api.resources import Manifest
from kanal.config.settings import KnownSettings, build_settings
from kanal.conformance.diff import (
    RESPONSE,
    UPSTREAM_REQUEST,
    AddressBook,
    Difference,
    Expectation,
    ExpectationError,
    compare_trees,
    is_missing,
    message_label,
    parse_expectations,
    plain,
    render,
    to_tree,
)
from kanal.conformance.frames import Capture, CaptureFormatError, Exchange, Frame, is_frame_capture
from kanal.conformance.resources import ManifestError, apply_resources, check_manifests
from kanal.conformance.scripted_broker import ScriptedBroker, broker_addresses
from kanal.embedded.tansu import free_port_block
from kanal.gateway import Gateway
from kanal.net.connection import FrameTap
from kanal.pipeline.registry import PluginRegistry
from kanal.protocol.api import ApiKey, api_name, request_class, response_class
from kanal.protocol.api_versions import intersect
from kanal.protocol.framing import FrameReader
from kanal.protocol.headers import parse_request_header, response_correlation_id
from kanal.protocol.messages import decode_request_body, decode_response

log = logging.getLogger(__name__)

CASE_SUFFIX = ".case.yaml"
DEFAULT_TIMEOUT = 5.0
_CASE_KEYS = {
    "description",
    "capture",
    "config",
    "env",
    "resources",
    "plugins",
    "compare_upstream_requests",
    "timeout",
    "expect",
}


class CaseError(ValueError):
    """A case file or capture that cannot be replayed as written."""


@dataclass
class Case:
    """A capture and how to replay it."""

    name: str
    capture_path: Path
    case_path: Path | None = None
    description: str = ""
    config: Mapping[str, Any] | None = None
    env: dict[str, str] = field(default_factory=dict)
    #: Admin-API manifests applied to the replay's gateway before the replay (see
    #: :mod:`kanal.conformance.resources`).
    resources: list[Manifest] = field(default_factory=list)
    plugins: list[str] = field(default_factory=list)
    expectations: list[Expectation] = field(default_factory=list)
    compare_upstream_requests: bool = True
    timeout: float = DEFAULT_TIMEOUT

    @property
    def folder(self) -> Path:
        return (self.case_path or self.capture_path).parent


def load_case(path: str | Path, name: str | None = None) -> Case:
    """A case from a case file (``*.case.yaml``) or a bare capture (``*.jsonl``)."""
    path = Path(path)
    if not path.name.endswith(CASE_SUFFIX):
        sibling = path.with_name(path.name.removesuffix(".jsonl") + CASE_SUFFIX)
        if sibling.exists():
            return load_case(sibling, name)
        return Case(name or path.stem, path)
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise CaseError(f"{path}: {exc}") from None
    if not isinstance(doc, dict):
        raise CaseError(f"{path}: expected a mapping")
    unknown = set(doc) - _CASE_KEYS
    if unknown:
        raise CaseError(f"{path}: unknown key {sorted(unknown)[0]!r} (expected {', '.join(sorted(_CASE_KEYS))})")
    capture = path.parent / str(doc.get("capture") or path.name.removesuffix(CASE_SUFFIX) + ".jsonl")
    if not capture.exists():
        raise CaseError(f"{path}: capture {capture} does not exist")
    env = doc.get("env") or {}
    plugins = doc.get("plugins") or []
    config = doc.get("config")
    if not isinstance(env, dict) or not isinstance(plugins, list) or not (config is None or isinstance(config, dict)):
        raise CaseError(f"{path}: env and config must be mappings, plugins a list")
    try:
        expectations = parse_expectations(doc.get("expect"), str(path))
        resources = check_manifests(doc.get("resources"))
    except ExpectationError as exc:
        raise CaseError(str(exc)) from None
    except ManifestError as exc:
        raise CaseError(f"{path}: {exc}") from None
    return Case(
        name=name or path.name.removesuffix(CASE_SUFFIX),
        capture_path=capture,
        case_path=path,
        description=str(doc.get("description") or ""),
        config=config,
        env={str(k): str(v) for k, v in env.items()},
        resources=resources,
        plugins=[str(p) for p in plugins],
        expectations=expectations,
        compare_upstream_requests=bool(doc.get("compare_upstream_requests", True)),
        timeout=float(doc.get("timeout", DEFAULT_TIMEOUT)),
    )


def discover_cases(root: str | Path) -> list[Case]:
    """Every case under ``root`` (a folder, a case file or a capture): each ``*.case.yaml``, and
    each Kafka frame capture that no sibling case file covers. JSONL files of another format (the
    registry captures) are skipped."""
    root = Path(root)
    if root.is_file():
        return [load_case(root)]
    cases = []
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        name = str(path.relative_to(root))
        if path.name.endswith(CASE_SUFFIX):
            cases.append(load_case(path, name.removesuffix(CASE_SUFFIX)))
        elif (
            path.suffix == ".jsonl"
            and is_frame_capture(path)
            and not path.with_name(path.name.removesuffix(".jsonl") + CASE_SUFFIX).exists()
        ):
            cases.append(load_case(path, name.removesuffix(".jsonl")))
    return cases


# -- results ------------------------------------------------------------------------------------


@dataclass
class CaseResult:
    """What a replay found."""

    case: Case
    failures: list[str] = field(default_factory=list)
    responses: int = 0
    upstream_requests: int = 0
    seconds: float = 0.0
    #: Every field difference found: (message kind, api key, version, captured frame, difference).
    differences: list[tuple[str, int, int, Frame, Difference]] = field(default_factory=list)
    #: How many messages were compared per (kind, api key, version).
    compared: Counter[tuple[str, int, int]] = field(default_factory=Counter)

    def record(self, kind: str, key: int, version: int, frame: Frame, comparison: Comparison) -> None:
        self.compared[(kind, key, version)] += 1
        self.differences.extend((kind, key, version, frame, d) for d in comparison.differences)
        self.failures.extend(comparison.lines())

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        status = "PASS" if self.ok else "FAIL"
        expected = sum(1 for e in self.case.expectations if e.uses)
        return (
            f"{status} {self.case.name}: {self.responses} responses, {self.upstream_requests} upstream requests"
            f" compared, {expected} documented differences applied ({self.seconds:.2f} s)"
        )

    def report(self) -> str:
        lines = [self.summary()]
        lines.extend(f"  {line}" for line in self.failures)
        return "\n".join(lines)


# -- the replay ---------------------------------------------------------------------------------


def _registry_for(case: Case, registry: PluginRegistry | None) -> PluginRegistry:
    if registry is None:
        registry = PluginRegistry()
        registry.load_entry_points()
    if case.plugins:
        sys.path.insert(0, str(case.folder))
        try:
            for spec in case.plugins:
                module_name, _, attr = spec.partition(":")
                try:
                    module = importlib.import_module(module_name)
                    plugin = getattr(module, attr) if attr else module
                except (ImportError, AttributeError) as exc:
                    raise CaseError(f"{case.case_path}: plugin {spec!r}: {exc}") from None
                registry.register(plugin, spec)
        finally:
            sys.path.remove(str(case.folder))
    return registry


@dataclass
class _Client:
    stream: trio.SocketStream
    reader: FrameReader = field(default_factory=FrameReader)
    frames: list[bytearray] = field(default_factory=list)
    closed: bool = False

    async def receive(self) -> bytearray | None:
        while not self.frames:
            data = await self.stream.receive_some(1 << 20)
            if not data:
                return None
            self.frames.extend(self.reader.feed(data))
        return self.frames.pop(0)


class _Replay:
    def __init__(
        self, case: Case, capture: Capture, broker: ScriptedBroker, gateway: Gateway, result: CaseResult
    ) -> None:
        self.case = case
        self.capture = capture
        self.broker = broker
        self.gateway = gateway
        self.result = result
        self.clients: dict[int, _Client] = {}
        self.bound: dict[int, trio.Event] = {}
        self.dead: set[int] = set()
        assert gateway.min_broker_id is not None
        nodes = set(broker.captured_brokers.values()) | set(broker_addresses(capture.expected_responses()).values())
        self.address_book = AddressBook(
            expected=broker_addresses(capture.expected_responses()),
            gateway={a: n for n in nodes if (a := gateway.advertised_address(n)) is not None},
            upstream={broker.address},
        )
        expected_responses = capture.expected_responses()
        self.response_number = {id(f): i for i, f in enumerate(expected_responses, 1)}
        self.exchange_of: dict[int, Exchange] = {
            id(ex.response): ex for exchanges in capture.client.values() for ex in exchanges if ex.response is not None
        }

    def fail(self, lines: Iterable[str]) -> None:
        self.result.failures.extend(lines)

    def expectations(self, kind: str, frame: Frame, key: int, version: int) -> list[Expectation]:
        return [e for e in self.case.expectations if e.selects(kind, key, version, frame.conn, frame.seq)]

    def port_of(self, conn: int) -> int:
        node = self.capture.node_of(conn)
        assert self.gateway.min_broker_id is not None
        if node is None:
            node = self.gateway.min_broker_id
        return self.gateway.settings.port_start + node - self.gateway.min_broker_id

    async def run(self) -> None:
        capture = self.capture
        last_index: dict[int, int] = {}
        steps = [f for f in capture.frames if f.dir in (capture.request_dir, capture.response_dir)]
        for i, frame in enumerate(steps):
            last_index[frame.conn] = i
        for i, frame in enumerate(steps):
            if frame.conn not in self.dead:
                if frame.dir == capture.request_dir:
                    await self.send(frame)
                else:
                    await self.receive(frame)
            if last_index[frame.conn] == i:
                await self.close(frame.conn)

    async def connect(self, conn: int) -> _Client | None:
        self.bound[conn] = self.broker.expect(conn)
        port = self.port_of(conn)
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
        except OSError as exc:
            self.fail([f"conn {conn}: cannot connect to the gateway on port {port}: {exc}"])
            return None
        client = _Client(stream)
        self.clients[conn] = client
        return client

    async def send(self, frame: Frame) -> None:
        new = frame.conn not in self.clients
        client = self.clients.get(frame.conn) or await self.connect(frame.conn)
        if client is None:
            self.dead.add(frame.conn)
            return
        try:
            await client.stream.send_all(len(frame.data).to_bytes(4, "big") + frame.data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.fail([f"conn {frame.conn} seq {frame.seq}: the gateway closed the connection ({exc})"])
            self.dead.add(frame.conn)
            return
        if new:  # the gateway opens a client's upstream connection on its first request
            await self._wait_bound(frame.conn)

    async def _wait_bound(self, conn: int) -> None:
        bound = self.bound[conn]
        with trio.move_on_after(self.case.timeout):
            await bound.wait()
        if not bound.is_set():
            self.broker.expect_nothing()
            self.fail([f"conn {conn}: the gateway opened no upstream connection within {self.case.timeout} s"])

    async def receive(self, expected: Frame) -> None:
        exchange = self.exchange_of.get(id(expected))
        key = expected.api_key if exchange is None else exchange.request.api_key
        version = expected.api_version if exchange is None else exchange.request.api_version
        if key is None or version is None:
            self.fail([f"conn {expected.conn} seq {expected.seq}: a response the capture cannot pair with a request"])
            return
        number = self.response_number.get(id(expected))
        label = message_label(key, version, RESPONSE, number, expected.conn, expected.seq)
        expectations = self.expectations(RESPONSE, expected, key, version)
        absent = [e for e in expectations if e.whole_message and e.action == "absent"]
        if absent:
            for e in absent:
                e.uses += 1
            return
        client = self.clients.get(expected.conn)
        if client is None:
            self.fail([f"{label}: no connection"])
            return
        actual: bytearray | None = None
        with trio.move_on_after(self.case.timeout):
            try:
                actual = await client.receive()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                actual = None
            if actual is None:
                self.fail([f"{label}: the gateway closed the connection instead of answering"])
                self.dead.add(expected.conn)
                return
        if actual is None:
            self.fail([f"{label}: no response within {self.case.timeout} s"])
            self.dead.add(expected.conn)
            return
        self.result.responses += 1
        comparison = compare_response(
            label, key, version, expected.data, bytes(actual), expectations, self.address_book
        )
        self.result.record(RESPONSE, key, version, expected, comparison)

    async def close(self, conn: int) -> None:
        client = self.clients.pop(conn, None)
        if client is None:
            return
        await self.wait_forwarded(conn)
        if client.frames:
            self.fail([f"conn {conn}: {len(client.frames)} responses more than the capture has"])
        await client.stream.aclose()
        await self.broker.release(conn)

    def forwarded_expected(self, conn: int) -> list[Exchange]:
        """The captured upstream requests of ``conn`` the gateway must forward."""
        out = []
        for ex in self.capture.upstream.get(conn, []):
            req = ex.request
            if req.api_key is None or req.api_version is None:
                continue
            skip = [
                e
                for e in self.expectations(UPSTREAM_REQUEST, req, req.api_key, req.api_version)
                if e.whole_message and e.action == "absent"
            ]
            if not skip:
                out.append(ex)
        return out

    async def wait_forwarded(self, conn: int) -> None:
        if conn in self.dead:
            return
        count = len(self.forwarded_expected(conn))
        with trio.move_on_after(self.case.timeout):
            await self.broker.wait_arrived(conn, count)

    def compare_upstream(self) -> None:
        """Compares the requests the gateway forwarded with the captured ones."""
        for received in self.broker.received:
            exchange = received.exchange
            if received.conn is None or exchange is None:
                continue
            req = exchange.request
            assert req.api_key is not None and req.api_version is not None
            self.result.upstream_requests += 1
            label = message_label(req.api_key, req.api_version, UPSTREAM_REQUEST, None, req.conn, req.seq)
            expectations = self.expectations(UPSTREAM_REQUEST, req, req.api_key, req.api_version)
            comparison = compare_request(label, req.data, received.data, expectations, self.address_book)
            self.result.record(UPSTREAM_REQUEST, req.api_key, req.api_version, req, comparison)
        matched = {id(r.exchange) for r in self.broker.received if r.exchange is not None}
        for conn in sorted(self.capture.upstream):
            if conn in self.dead:
                continue
            for ex in self.forwarded_expected(conn):
                if id(ex) not in matched:
                    req = ex.request
                    assert req.api_key is not None and req.api_version is not None
                    label = message_label(req.api_key, req.api_version, UPSTREAM_REQUEST, None, req.conn, req.seq)
                    self.fail([f"{label}: never forwarded upstream"])
        for e in self.case.expectations:
            if e.message == UPSTREAM_REQUEST and e.whole_message:
                e.uses += sum(
                    1
                    for conn, exchanges in self.capture.upstream.items()
                    for ex in exchanges
                    if ex.request.api_key is not None
                    and ex.request.api_version is not None
                    and e.selects(UPSTREAM_REQUEST, ex.request.api_key, ex.request.api_version, conn, ex.request.seq)
                    and id(ex) not in matched
                )


@dataclass
class Comparison:
    """The outcome of comparing one message: problems outside the field tree (correlation id,
    decoding) and differences by field path."""

    label: str
    problems: list[str] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"{self.label}: {p}" for p in self.problems] + render(self.label, self.differences)


def compare_response(
    label: str,
    key: int,
    version: int,
    expected: bytes,
    actual: bytes,
    expectations: Sequence[Expectation],
    address_book: AddressBook | None,
) -> Comparison:
    """Compares one response the client received with the captured one."""
    out = Comparison(label)
    want, got = response_correlation_id(expected), response_correlation_id(actual)
    if want != got:
        out.problems.append(f"correlation_id: expected {want}, got {got}")
    if response_class(key, version) is None:
        if expected[4:] != actual[4:]:
            out.problems.append(f"{api_name(key)} v{version} is unknown to kio and the bytes differ")
        return out
    try:
        expected_body = decode_response(key, version, expected)
        if key == ApiKey.API_VERSIONS:  # a documented rewrite: the versions the gateway can decode
            expected_body = intersect(expected_body) or expected_body
        expected_tree = to_tree(expected_body)
    except Exception as exc:  # e.g. an ApiVersions error answered in the v0 format: compare bytes
        if expected[4:] != actual[4:]:
            out.problems.append(f"the captured response does not decode ({exc}) and the bytes differ")
        return out
    try:
        actual_tree = to_tree(decode_response(key, version, actual))
    except Exception as exc:
        out.problems.append(f"the gateway's response does not decode: {exc}")
        return out
    out.differences = compare_trees(expected_tree, actual_tree, expectations, address_book)
    return out


def compare_request(
    label: str,
    expected: bytes,
    actual: bytes,
    expectations: Sequence[Expectation],
    address_book: AddressBook | None = None,
) -> Comparison:
    """Compares a request the gateway forwarded with the captured one; correlation ids are not
    compared (the gateway assigns its own upstream)."""
    out = Comparison(label)
    try:
        want = parse_request_header(expected)
        got = parse_request_header(actual)
    except ValueError as exc:
        out.problems.append(f"request header does not parse: {exc}")
        return out
    if (want.api_key, want.api_version) != (got.api_key, got.api_version):
        out.problems.append(f"forwarded as {api_name(got.api_key)} v{got.api_version}")
        return out
    if want.client_id != got.client_id:
        out.problems.append(f"header.client_id: expected {want.client_id!r}, got {got.client_id!r}")
    if request_class(want.api_key, want.api_version) is None:
        if expected[want.body_offset :] != actual[got.body_offset :]:
            out.problems.append("unknown to kio and the bytes differ")
        return out
    try:
        expected_tree = to_tree(decode_request_body(want.api_key, want.api_version, expected, want.body_offset))
        actual_tree = to_tree(decode_request_body(got.api_key, got.api_version, actual, got.body_offset))
    except Exception as exc:
        out.problems.append(f"request does not decode: {exc}")
        return out
    out.differences = compare_trees(expected_tree, actual_tree, expectations, address_book)
    return out


def _nodes(broker: ScriptedBroker, capture: Capture) -> list[int]:
    nodes = set(broker.captured_brokers.values()) | set(broker_addresses(capture.expected_responses()).values())
    nodes |= {n for conn in capture.client if (n := capture.node_of(conn)) is not None}
    return sorted(nodes) or [0]


def _untapped(connection: Connection, direction: str, frame: bytes | bytearray) -> None:
    """The tap of a replayed gateway capture when the caller gives none: sees frames, keeps none."""


async def replay(case: Case, registry: PluginRegistry | None = None, tap: FrameTap | None = None) -> CaseResult:
    """Replays one case; see the module docstring. ``tap``, if given, sees the replay's frames
    (a :class:`~kanal.conformance.capture.CaptureTap` records the replay as a gateway capture)."""
    started = time.perf_counter()
    result = CaseResult(case)
    try:
        capture = Capture.read(case.capture_path)
    except (OSError, CaptureFormatError) as exc:
        result.failures.append(f"cannot read the capture: {exc}")
        return result
    registry = _registry_for(case, registry)
    for e in case.expectations:
        e.uses = 0
    broker = ScriptedBroker(capture)
    run: _Replay | None = None
    refused: ManifestError | None = None
    async with trio.open_nursery() as outer:
        await outer.start(broker.serve)
        nodes = _nodes(broker, capture)
        count = nodes[-1] - nodes[0] + 1
        for attempt in range(1, 4):
            env = {
                # The scripted broker answers the captured connections only: the gateway's own audit
                # log would take one of them (a case may turn it on again).
                "GATEWAY_FEATURE_FLAGS_AUDIT": "false",
                **case.env,
                "KAFKA_BOOTSTRAP_SERVERS": f"{broker.address[0]}:{broker.address[1]}",
                "GATEWAY_BIND_HOST": "127.0.0.1",
                "GATEWAY_ADVERTISED_HOST": "127.0.0.1",
                "GATEWAY_PORT_START": str(free_port_block(count)),
                "GATEWAY_PORT_COUNT": str(count),
                "GATEWAY_MIN_BROKERID": str(nodes[0]),
                "GATEWAY_SHUTDOWN_TIMEOUT_MS": str(int(case.timeout * 1000)),
            }
            settings = build_settings(env, case.config, KnownSettings(registry.declared_settings()))
            # no membership group: the scripted broker answers only what the capture holds
            gateway = Gateway(settings, registry, fleet=False)
            # A gateway capture was recorded with a tap, which the gateway heeds (it forwards a
            # client's ApiVersions before the login instead of answering it from a recent answer):
            # replayed with one too, so that it forwards what it forwarded then.
            gateway.tap = tap if tap is not None or not capture.gateway_side else _untapped
            try:
                await apply_resources(gateway, case.resources)
            except ManifestError as exc:
                refused = exc
                break
            run, listen_error = await _replay_through(case, capture, broker, gateway, result)
            if listen_error is None:
                break
            if attempt == 3:
                raise listen_error
            log.info("gateway ports taken meanwhile, retrying with another block")  # a race with another process
        outer.cancel_scope.cancel()
    if refused is not None:
        raise CaseError(f"{case.case_path}: {refused}")
    result.failures.extend(f"scripted broker: {p}" for p in broker.problems)
    if case.compare_upstream_requests and run is not None:
        run.compare_upstream()
    for e in case.expectations:
        if not e.uses and (case.compare_upstream_requests or e.message != UPSTREAM_REQUEST):
            result.failures.append(f"expectation never applied (stale?): {e.describe()}")
    result.seconds = time.perf_counter() - started
    return result


async def _replay_through(
    case: Case, capture: Capture, broker: ScriptedBroker, gateway: Gateway, result: CaseResult
) -> tuple[_Replay | None, OSError | None]:
    """Starts the gateway and replays. Returns the replay (None when the gateway did not start in
    time), or the error of a gateway that could not listen on its ports (nothing replayed)."""
    run: _Replay | None = None
    async with trio.open_nursery() as inner:
        with trio.move_on_after(case.timeout) as starting:
            try:
                await inner.start(gateway.run)
            except OSError as exc:  # listening failed: nothing was replayed yet
                return None, exc
        if starting.cancelled_caught:
            result.failures.append(f"the gateway did not start within {case.timeout} s (no answer to its Metadata?)")
            inner.cancel_scope.cancel()
            return None, None
        run = _Replay(case, capture, broker, gateway, result)
        with trio.move_on_after(case.timeout * 4 + 30) as overall:
            try:
                await run.run()
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(case.timeout):
                    for conn in list(run.clients):
                        await run.close(conn)
                gateway.shutdown()
        if overall.cancelled_caught:
            result.failures.append("the replay did not finish in time")
            inner.cancel_scope.cancel()
    return run, None


def run_case(case: Case, registry: PluginRegistry | None = None, tap: FrameTap | None = None) -> CaseResult:
    """Replays one case in a fresh trio run."""
    return trio.run(replay, case, registry, tap)


def run_cases(cases: Iterable[Case], registry: PluginRegistry | None = None) -> list[CaseResult]:
    return [run_case(case, registry) for case in cases]


# -- suggested expectations ----------------------------------------------------------------------


def suggest_expectations(result: CaseResult) -> str:
    """The ``expect:`` entries that would document every difference a replay found, as YAML, each
    with a reason to write. A difference shared by every message of an API (or of an API version)
    becomes one entry for all of them; others name conn and seq."""
    groups: dict[tuple[str, int, str, str], list[tuple[int, Frame, Difference]]] = {}
    for kind, key, version, frame, difference in result.differences:
        value = "absent" if is_missing(difference.actual) else json.dumps(plain(difference.actual), sort_keys=True)
        groups.setdefault((kind, key, difference.path, value), []).append((version, frame, difference))
    per_api: Counter[tuple[str, int]] = Counter()
    for (kind, key, _version), n in result.compared.items():
        per_api[(kind, key)] += n
    entries: dict[str, dict[str, Any]] = {}
    for (kind, key, path, _value), hits in groups.items():
        versions = {v for v, _, _ in hits}
        difference = hits[0][2]
        if len(hits) == per_api[(kind, key)]:
            selectors: list[dict[str, Any]] = [{}]
        elif len(versions) == 1 and len(hits) == result.compared[(kind, key, next(iter(versions)))]:
            selectors = [{"version": next(iter(versions))}]
        else:
            selectors = [{"version": v, "conn": f.conn, "seq": f.seq} for v, f, _ in hits]
        for selector in selectors:
            head = {"api": api_name(key), **({"message": kind} if kind != RESPONSE else {}), **selector}
            ident = json.dumps(head, sort_keys=True)
            if is_missing(difference.actual):
                entries[ident + path] = {**head, "path": path, "absent": True, "reason": "TODO: why"}
            elif isinstance(difference.actual, bytes):
                entries[ident + path] = {**head, "path": path, "ignore": True, "reason": "TODO: why"}
            else:
                entry = entries.setdefault(ident, {**head, "values": {}, "reason": "TODO: why"})
                entry["values"][path] = plain(difference.actual)
    for entry in entries.values():
        if "values" in entry:
            entry["values"] = dict(sorted(entry["values"].items(), key=lambda kv: _natural(kv[0])))
    if not entries:
        return ""
    return yaml.safe_dump({"expect": list(entries.values())}, sort_keys=False, default_flow_style=False, width=120)


def _natural(text: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]
