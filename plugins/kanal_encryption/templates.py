"""Key id templates: ``{{record.topic}}``, ``{{record.key}}``, ``{{record.header.<name>}}``,
``{{record.value.<path>}}`` in a key id, resolved per record.

A key per topic, per tenant header or per record key is how data is kept apart, and a key per
record key is what crypto shredding deletes. A key id without a template is resolved once, when the
interceptor is configured; a templated one per record, from the parts it names only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .paths import FieldPath, PathError, parse_path

__all__ = ["RecordView", "Template", "TemplateError", "parse_template"]

_PLACEHOLDER = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")


class TemplateError(ValueError):
    """A template that does not parse, or a record that lacks what it names."""


@dataclass(slots=True)
class RecordView:
    """What a template may read of one record (the value parsed only when a template needs it)."""

    topic: str
    key: bytes | None
    headers: Mapping[str, bytes | None]
    value: Any = None  # the parsed JSON value, when a template reads it


Part = Callable[[RecordView], str]


class Template:
    """A parsed key id; :attr:`constant` is its text when it has no placeholder."""

    __slots__ = ("constant", "headers", "parts", "reads_key", "text", "value_paths")

    def __init__(self, text: str, parts: list[str | Part], headers: frozenset[str], value_paths: tuple[FieldPath, ...]):
        self.text = text
        self.parts = parts
        self.constant: str | None = text if all(isinstance(p, str) for p in parts) else None
        self.headers = headers  # the header names it reads
        self.value_paths = value_paths  # the value fields it reads
        self.reads_key = any(p is _key for p in parts)

    def render(self, record: RecordView) -> str:
        """The key id for ``record``; raises TemplateError when the record lacks a part it names."""
        if self.constant is not None:
            return self.constant
        return "".join(p if isinstance(p, str) else p(record) for p in self.parts)


def _topic(record: RecordView) -> str:
    return record.topic


def _key(record: RecordView) -> str:
    if record.key is None:
        raise TemplateError("the record has no key")
    return record.key.decode("utf-8", "replace")


def _header(name: str) -> Part:
    def read(record: RecordView) -> str:
        value = record.headers.get(name)
        if value is None:
            raise TemplateError(f"the record has no header {name!r}")
        return value.decode("utf-8", "replace")

    return read


def _value(path: FieldPath) -> Part:
    def read(record: RecordView) -> str:
        found, value = path.get(record.value)
        if not found or value is None or isinstance(value, (dict, list)):
            raise TemplateError(f"the record's value has no field {path.text!r} with a scalar value")
        return value if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)

    return read


def parse_template(text: str) -> Template:
    """Parses a key id with ``{{record....}}`` placeholders; raises TemplateError for one it does
    not know."""
    parts: list[str | Part] = []
    headers: set[str] = set()
    paths: list[FieldPath] = []
    pos = 0
    for match in _PLACEHOLDER.finditer(text):
        if match.start() > pos:
            parts.append(text[pos : match.start()])
        name = match.group(1)
        if name == "record.topic":
            parts.append(_topic)
        elif name == "record.key":
            parts.append(_key)
        elif name.startswith("record.header.") and len(name) > len("record.header."):
            header = name[len("record.header.") :]
            headers.add(header)
            parts.append(_header(header))
        elif name.startswith("record.value."):
            try:
                path = parse_path(name[len("record.value.") :])
            except PathError as exc:
                raise TemplateError(f"key id {text!r}: {exc}") from None
            paths.append(path)
            parts.append(_value(path))
        else:
            raise TemplateError(
                f"key id {text!r}: unknown placeholder {{{{{name}}}}} (expected record.topic, record.key,"
                " record.header.<name> or record.value.<field>)"
            )
        pos = match.end()
    if pos < len(text):
        parts.append(text[pos:])
    if "{{" in "".join(p for p in parts if isinstance(p, str)):
        raise TemplateError(f"key id {text!r}: an unclosed '{{{{'")
    return Template(text, parts, frozenset(headers), tuple(paths))
