"""Comparing Kafka messages by field path: trees, documented rewrites, expectations, readable diffs.

Both messages are decoded with kio and turned into plain trees (dicts in schema field order,
lists, scalars). Before comparing:

1. *Documented rewrites* are normalized on both sides: a broker address (an entity with ``host`` and
   ``port``) becomes ``<broker:N>`` when it is the captured address of broker N (expected side) or
   the gateway's address for broker N (actual side); throttle times are not compared. Correlation
   ids are compared separately by the runner.
2. *Expectations* from the case file are applied: each names messages (api, version, conn, seq) and
   a field path, and says the expected value there is ``absent``, a given ``value``, or ``ignore``
   (not compared), with a reason. Paths use the syntax the diff prints, so a line of a diff can be
   pasted into an expectation.

Lists of entities whose first field is a unique key on both sides (``name``, ``index``,
``partition_index``, ``api_key``, ``node_id``...) are compared by that key, not by position
(their order is not compared): ``responses[name=orders].partition_responses[index=1].error_code``.
Other lists compare by index.
"""

from __future__ import annotations

import copy
import datetime
import enum
import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from kio.schema.index import api_key_map

from kanal.protocol.api import api_name

Tree = Any
Address = tuple[str, int]

MAX_LINES_PER_MESSAGE = 30


class ExpectationError(ValueError):
    """An invalid expectation in a case file; the message names the entry."""


# -- trees --------------------------------------------------------------------------------------


def to_tree(value: Any) -> Tree:
    """A kio message (or any dataclass) as nested dicts and lists."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_tree(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple | list):
        return [to_tree(v) for v in value]
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    return value


@dataclass(frozen=True, slots=True)
class Normalized:
    """A value standing for a placeholder (``<broker:111>``); equal to another Normalized with the
    same token. ``raw`` is kept for the diff."""

    raw: Any
    token: str | None


class _Ignored:
    def __repr__(self) -> str:
        return "<ignored>"


IGNORED: Any = _Ignored()
_MISSING: Any = object()

THROTTLE_FIELDS = frozenset({"throttle_time", "throttle_time_ms"})


def normalize(tree: Tree, address_token: Callable[[str, int], str | None]) -> Tree:
    """Applies the documented rewrites in place: broker addresses to tokens, throttle times out."""
    if isinstance(tree, dict):
        host, port = tree.get("host"), tree.get("port")
        if isinstance(host, str) and isinstance(port, int) and not isinstance(port, bool):
            token = address_token(host, port)
            tree["host"] = Normalized(host, token)
            tree["port"] = Normalized(port, token)
        for key, value in tree.items():
            if key in THROTTLE_FIELDS:
                tree[key] = Normalized(value, "<throttle>")
            elif isinstance(value, dict | list):
                normalize(value, address_token)
    elif isinstance(tree, list):
        for item in tree:
            if isinstance(item, dict | list):
                normalize(item, address_token)
    return tree


@dataclass
class AddressBook:
    """Which broker addresses stand for which broker: the captured ones (``expected``), the
    gateway's (``gateway``) and the scripted upstream's, which a client must never see."""

    expected: dict[Address, int]
    gateway: dict[Address, int]
    upstream: set[Address]

    def expected_token(self, host: str, port: int) -> str | None:
        node = self.expected.get((host, port))
        return None if node is None else f"<broker:{node}>"

    def actual_token(self, host: str, port: int) -> str | None:
        node = self.gateway.get((host, port))
        if node is not None:
            return f"<broker:{node}>"
        if (host, port) in self.upstream:
            return "<upstream address, not rewritten>"
        return None


# -- paths --------------------------------------------------------------------------------------

_SEGMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)|\[([^\]]*)\]|\.")


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a field path: a field name, a list index, ``*``, or ``field=value``."""

    name: str | None = None
    index: int | None = None
    any: bool = False
    key: tuple[str, str] | None = None


def parse_path(text: str) -> tuple[Step, ...]:
    """``responses[name=t].partition_responses[index=1].error_code`` into steps."""
    text = text.strip()
    steps: list[Step] = []
    pos = 0
    while pos < len(text):
        m = _SEGMENT.match(text, pos)
        if m is None:
            raise ExpectationError(f"invalid field path {text!r} at {text[pos:]!r}")
        if m.group(1) is not None:
            steps.append(Step(name=m.group(1)))
        elif m.group(2) is not None:
            inner = m.group(2).strip()
            if inner == "*":
                steps.append(Step(any=True))
            elif re.fullmatch(r"-?\d+", inner):
                steps.append(Step(index=int(inner)))
            elif "=" in inner:
                field_name, _, value = inner.partition("=")
                steps.append(Step(key=(field_name.strip(), value.strip())))
            else:
                raise ExpectationError(f"invalid selector [{inner}] in field path {text!r}")
        pos = m.end()
    return tuple(steps)


def key_text(value: Any) -> str:
    """How a key value is written in a path (``[name=orders]``, ``[index=1]``)."""
    if isinstance(value, Normalized):
        value = value.raw
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _key_field(items: Sequence[Any]) -> str | None:
    """The first field of the list's entities, if the list holds entities."""
    if not items or not all(isinstance(i, dict) and i for i in items):
        return None
    first = next(iter(items[0]))
    return first if all(next(iter(i)) == first for i in items) else None


def _unique_keys(items: Sequence[Any], field_name: str) -> list[str] | None:
    keys = []
    for item in items:
        value = item.get(field_name)
        if isinstance(value, dict | list) or value is IGNORED:
            return None
        keys.append(key_text(value))
    return keys if len(set(keys)) == len(keys) else None


def _locate(tree: Tree, steps: Sequence[Step], create: bool) -> list[tuple[Any, Any]]:
    """(container, key) pairs the path designates; with ``create``, a missing keyed entity at the
    end of the path is added (so that ``value`` can state an entity the capture lacks)."""
    if not steps:
        return []
    current: list[Tree] = [tree]
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        found: list[tuple[Any, Any]] = []
        for node in current:
            if step.name is not None:
                if isinstance(node, dict) and step.name in node:
                    found.append((node, step.name))
            elif isinstance(node, list):
                if step.any:
                    found.extend((node, j) for j in range(len(node)))
                elif step.index is not None:
                    if -len(node) <= step.index < len(node):
                        found.append((node, step.index % len(node)))
                elif step.key is not None:
                    name, wanted = step.key
                    hits = [
                        (node, j)
                        for j, item in enumerate(node)
                        if isinstance(item, dict) and name in item and key_text(item[name]) == wanted
                    ]
                    if not hits and create and last:
                        node.append({name: _parse_key_value(wanted)})
                        hits = [(node, len(node) - 1)]
                    found.extend(hits)
        if last:
            return found
        current = [container[key] for container, key in found]
    return []


def _parse_key_value(text: str) -> Any:
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return text


def _merge(old: Any, new: Any) -> Any:
    if isinstance(old, dict) and isinstance(new, Mapping):
        merged = dict(old)
        for k, v in new.items():
            merged[k] = _merge(old.get(k, _MISSING), v) if k in old else v
        return merged
    return new


# -- expectations -------------------------------------------------------------------------------

RESPONSE = "response"
UPSTREAM_REQUEST = "upstream-request"
_ACTIONS = ("absent", "value", "ignore")


def api_key_of(value: Any) -> int:
    """An API given by key number or name (``ApiVersions``, ``api_versions``, ``18``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip()
    if text.isdigit():
        return int(text)
    wanted = text.replace("_", "").replace("-", "").lower()
    for key in api_key_map:
        if api_name(int(key)).lower() == wanted:
            return int(key)
    raise ExpectationError(f"unknown API {value!r}")


@dataclass
class Expectation:
    """A documented difference between the capture and what the gateway must produce."""

    reason: str
    path: str
    action: str
    value: Any = None
    message: str = RESPONSE
    api_key: int | None = None
    api_version: int | None = None
    conn: int | None = None
    seq: int | None = None
    where: str = ""
    uses: int = 0

    def __post_init__(self) -> None:
        self.steps = parse_path(self.path)

    def selects(self, message: str, api_key: int, api_version: int, conn: int, seq: int) -> bool:
        return (
            self.message == message
            and self.api_key in (None, api_key)
            and self.api_version in (None, api_version)
            and self.conn in (None, conn)
            and self.seq in (None, seq)
        )

    @property
    def whole_message(self) -> bool:
        return not self.steps

    def describe(self) -> str:
        what = {"absent": "absent", "ignore": "not compared"}.get(self.action, f"= {show(self.value)}")
        target = " ".join(
            p
            for p in (
                api_name(self.api_key) if self.api_key is not None else "any API",
                f"v{self.api_version}" if self.api_version is not None else "",
                self.message,
                f"conn {self.conn}" if self.conn is not None else "",
                f"seq {self.seq}" if self.seq is not None else "",
            )
            if p
        )
        return f"{self.where}: {target}: {self.path or '(whole message)'} {what} ({self.reason})"


def parse_expectations(items: Any, where: str) -> list[Expectation]:
    """Expectations from a case file's ``expect`` list.

    Each entry selects messages (``message``: response or upstream-request; ``api``, ``version``,
    ``conn``, ``seq``: all optional) and gives a ``reason`` and one of: ``path`` with ``absent: true``,
    ``ignore: true`` or ``value: X``; or ``values:``, a mapping of paths to values (one expectation
    per path). ``absent: true`` without a path means the whole message is not expected."""
    if items is None:
        return []
    if not isinstance(items, list):
        raise ExpectationError(f"{where}: expect must be a list")
    allowed = {"message", "api", "version", "conn", "seq", "path", "reason", "values", *_ACTIONS}
    result = []
    for i, item in enumerate(items):
        at = f"{where}: expect[{i}]"
        if not isinstance(item, dict):
            raise ExpectationError(f"{at}: expected a mapping")
        unknown = set(item) - allowed
        if unknown:
            raise ExpectationError(f"{at}: unknown key {sorted(unknown)[0]!r} (expected {', '.join(sorted(allowed))})")
        reason = item.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise ExpectationError(f"{at}: every expectation needs a reason")
        actions = [a for a in (*_ACTIONS, "values") if a in item]
        if len(actions) != 1:
            raise ExpectationError(f"{at}: give exactly one of absent: true, ignore: true, value: ..., values: {{...}}")
        action = actions[0]
        if action in ("absent", "ignore") and item[action] is not True:
            raise ExpectationError(f"{at}: {action} must be true")
        message = item.get("message", RESPONSE)
        if message not in (RESPONSE, UPSTREAM_REQUEST):
            raise ExpectationError(f"{at}: message must be {RESPONSE} or {UPSTREAM_REQUEST}")
        if action == "values":
            pairs = item["values"]
            if not isinstance(pairs, dict) or not pairs or "path" in item:
                raise ExpectationError(f"{at}: values must be a non-empty mapping of field paths to values (no path)")
            targets = [(str(path), "value", value) for path, value in pairs.items()]
        else:
            path = item.get("path", "")
            if not isinstance(path, str):
                raise ExpectationError(f"{at}: path must be a string")
            if not path.strip() and action != "absent":
                raise ExpectationError(f"{at}: only absent applies to a whole message (no path)")
            targets = [(path, action, item.get("value"))]
        try:
            api_key = None if item.get("api") is None else api_key_of(item["api"])
            version = _opt_int(item.get("version"), "version")
            conn = _opt_int(item.get("conn"), "conn")
            seq = _opt_int(item.get("seq"), "seq")
            for path, act, value in targets:
                result.append(
                    Expectation(
                        reason=reason.strip(),
                        path=path.strip(),
                        action=act,
                        value=value,
                        message=message,
                        api_key=api_key,
                        api_version=version,
                        conn=conn,
                        seq=seq,
                        where=at,
                    )
                )
        except ExpectationError as exc:
            raise ExpectationError(f"{at}: {exc}") from None
    return result


def _opt_int(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ExpectationError(f"{where} must be an integer")
    return value


def apply_expectations(expected: Tree, actual: Tree, expectations: Sequence[Expectation]) -> None:
    """Changes the trees (in place) as the expectations say; counts their uses."""
    for exp in expectations:
        if exp.whole_message:
            continue
        if exp.action == "ignore":
            hits = 0
            for tree in (expected, actual):
                located = _locate(tree, exp.steps, create=False)
                hits += len(located)
                for container, key in sorted(
                    located, key=lambda ck: ck[1] if isinstance(ck[1], int) else 0, reverse=True
                ):
                    if isinstance(container, list):
                        del container[key]
                    else:
                        container[key] = IGNORED
            exp.uses += bool(hits)
            continue
        located = _locate(expected, exp.steps, create=exp.action == "value")
        if not located:
            continue
        exp.uses += 1
        if exp.action == "absent":
            for container, key in sorted(located, key=lambda ck: ck[1] if isinstance(ck[1], int) else 0, reverse=True):
                del container[key]
        else:
            for container, key in located:
                container[key] = _merge(container[key], copy.deepcopy(exp.value))


# -- diff ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Difference:
    """One difference at a field path; ``expected`` or ``actual`` is MISSING for an absent entity."""

    path: str
    expected: Any
    actual: Any

    def render(self) -> str:
        path = self.path or "(message)"
        if self.actual is _MISSING:
            return f"{path}: missing, expected {show(self.expected)}"
        if self.expected is _MISSING:
            return f"{path}: unexpected {show(self.actual)}"
        if isinstance(self.expected, bytes) and isinstance(self.actual, bytes):
            note = _bytes_note(self.expected, self.actual)
            return f"{path}: expected {show(self.expected)}, got {show(self.actual)}{note}"
        if isinstance(self.expected, list) and isinstance(self.actual, list):
            return f"{path}: expected {len(self.expected)} items, got {len(self.actual)}"
        return f"{path}: expected {show(self.expected)}, got {show(self.actual)}"


def _bytes_note(a: bytes, b: bytes) -> str:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f" (first difference at byte {n})"


def _unwrap(value: Any) -> Any:
    return value.raw if isinstance(value, Normalized) else value


def same(a: Any, b: Any) -> bool:
    """Equality after normalization: tokens decide when both sides have one."""
    if a is IGNORED or b is IGNORED:
        return True
    if isinstance(a, Normalized) and isinstance(b, Normalized) and (a.token is not None or b.token is not None):
        return a.token == b.token
    a, b = _unwrap(a), _unwrap(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    for x, y in ((a, b), (b, a)):  # a value written in a case file against a decoded one
        if isinstance(x, enum.Enum) and isinstance(y, str):
            return x.name == y
        if isinstance(x, datetime.timedelta) and isinstance(y, int) and not isinstance(y, bool):
            return x == datetime.timedelta(milliseconds=y)
        if isinstance(x, uuid.UUID | datetime.datetime) and isinstance(y, str):
            return str(x) == y
        if isinstance(x, bytes) and isinstance(y, str):
            return x.hex() == y
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    try:
        return bool(a == b)
    except Exception:
        return False


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def diff(expected: Tree, actual: Tree, path: str = "") -> list[Difference]:
    """The differences between two trees, by field path."""
    if same(expected, actual):
        return []
    e, a = _unwrap(expected), _unwrap(actual)
    if isinstance(e, dict) and isinstance(a, dict):
        out: list[Difference] = []
        for key in list(e) + [k for k in a if k not in e]:
            out.extend(diff(e.get(key, _MISSING), a.get(key, _MISSING), _join(path, key)))
        host, port = _join(path, "host"), _join(path, "port")
        if {host, port} <= {d.path for d in out} and _unwrap(e.get("host")) == _unwrap(a.get("host")):
            out = [d for d in out if d.path != host]  # same host, another port: the port line says it
        return out
    if isinstance(e, list) and isinstance(a, list):
        return _diff_lists(e, a, path)
    return [Difference(path, expected, actual)]


def _diff_lists(e: list[Any], a: list[Any], path: str) -> list[Difference]:
    key = _key_field(e + a)
    if key is not None:
        ek, ak = _unique_keys(e, key), _unique_keys(a, key)
        if ek is not None and ak is not None:
            out: list[Difference] = []
            actual_by_key = dict(zip(ak, a, strict=True))
            expected_keys = set(ek)
            for k, item in zip(ek, e, strict=True):
                out.extend(diff(item, actual_by_key.get(k, _MISSING), f"{path}[{key}={k}]"))
            for k, item in zip(ak, a, strict=True):
                if k not in expected_keys:
                    out.append(Difference(f"{path}[{key}={k}]", _MISSING, item))
            return out
    out = []
    if len(e) != len(a):
        out.append(Difference(path, e, a))
    for i in range(max(len(e), len(a))):
        out.extend(diff(e[i] if i < len(e) else _MISSING, a[i] if i < len(a) else _MISSING, f"{path}[{i}]"))
    return out


def show(value: Any, limit: int = 160) -> str:
    """A short readable rendering of a tree value."""
    text = _show(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show(value: Any) -> str:
    if isinstance(value, Normalized):
        inner = _show(value.raw)
        return f"{inner} ({value.token})" if value.token and value.token != "<throttle>" else inner
    if value is None:
        return "null"
    if value is IGNORED:
        return "<ignored>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return f"{value.value} ({value.name})"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bytes):
        if len(value) <= 24:
            return f"0x{value.hex()}" if value else "b''"
        return f"<{len(value)} bytes>"
    if isinstance(value, datetime.timedelta):
        return f"{int(value.total_seconds() * 1000)} ms"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


# -- messages -----------------------------------------------------------------------------------


def message_label(api_key: int, api_version: int, kind: str, number: int | None, conn: int, seq: int) -> str:
    """``Metadata v12 response #3 (conn 2 seq 5)``."""
    kind_text = "upstream request" if kind == UPSTREAM_REQUEST else kind
    ordinal = f" #{number}" if number is not None else ""
    return f"{api_name(api_key)} v{api_version} {kind_text}{ordinal} (conn {conn} seq {seq})"


def compare_trees(
    expected: Tree, actual: Tree, expectations: Sequence[Expectation], address_book: AddressBook | None = None
) -> list[Difference]:
    """Normalizes both trees, applies the expectations to them, and diffs."""
    if address_book is not None:
        normalize(expected, address_book.expected_token)
        normalize(actual, address_book.actual_token)
    else:
        normalize(expected, lambda h, p: None)
        normalize(actual, lambda h, p: None)
    apply_expectations(expected, actual, expectations)
    return diff(expected, actual)


def plain(value: Any) -> Any:
    """A tree value as plain YAML/JSON data (for suggested expectations)."""
    if isinstance(value, Normalized):
        return plain(value.raw)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, uuid.UUID | datetime.datetime):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def is_missing(value: Any) -> bool:
    return value is _MISSING


def render(label: str, differences: Sequence[Difference], limit: int = MAX_LINES_PER_MESSAGE) -> list[str]:
    """``<label>: <path>: expected X, got Y`` lines, at most ``limit`` (then a count of the rest)."""
    lines = [f"{label}: {d.render()}" for d in differences[:limit]]
    if len(differences) > limit:
        lines.append(f"{label}: ... and {len(differences) - limit} more differences")
    return lines
