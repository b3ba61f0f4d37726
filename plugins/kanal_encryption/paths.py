"""Field paths into JSON records: ``a.b.c``, ``list[0].x``.

Parsed once, when an interceptor is configured, into steps (a key of an object, an index of a
list), so reading or replacing a field of a record is a short loop over them.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["FieldPath", "PathError", "parse_path"]

_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


class PathError(ValueError):
    """A field path that does not parse."""


class FieldPath:
    """A parsed path; ``text`` is as the operator wrote it (it is bound into the ciphertext)."""

    __slots__ = ("steps", "text")

    def __init__(self, text: str, steps: tuple[str | int, ...]) -> None:
        self.text = text
        self.steps = steps

    def get(self, document: Any) -> tuple[bool, Any]:
        """``(True, value)`` when the document has the field, else ``(False, None)``."""
        node = document
        for step in self.steps:
            if isinstance(step, int):
                if not isinstance(node, list) or step >= len(node):
                    return False, None
            elif not isinstance(node, dict) or step not in node:
                return False, None
            node = node[step]
        return True, node

    def set(self, document: Any, value: Any) -> None:
        """Replaces the field's value (which :meth:`get` found)."""
        node = document
        for step in self.steps[:-1]:
            node = node[step]
        node[self.steps[-1]] = value

    def __repr__(self) -> str:
        return f"FieldPath({self.text!r})"


def parse_path(text: str) -> FieldPath:
    """Parses ``a.b[0].c``; raises PathError naming what is wrong."""
    steps: list[str | int] = []
    pos = 0
    expect_name = True
    while pos < len(text):
        if text[pos] == "." and not expect_name and steps:
            pos += 1
            expect_name = True
            continue
        match = _STEP.match(text, pos)
        if match is None or (match.group(1) is not None and not expect_name):
            raise PathError(f"field path {text!r}: unexpected {text[pos]!r} at {pos}")
        if match.group(1) is not None:
            steps.append(match.group(1))
        else:
            if not steps:
                raise PathError(f"field path {text!r}: an index needs a field before it")
            steps.append(int(match.group(2)))
        expect_name = False
        pos = match.end()
    if not steps or expect_name:
        raise PathError(f"field path {text!r}: empty, or ends with '.'")
    return FieldPath(text, tuple(steps))
