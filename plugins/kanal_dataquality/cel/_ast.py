"""A small typed AST for CEL expressions, built from cel-python's parse tree (see ``_parse``).

The code generator and the static checks work on these nodes, never on lark trees, so that the untyped
parser stays behind one module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias


@dataclass(frozen=True, slots=True)
class Lit:
    """A literal. ``kind`` is the CEL type: int, uint, double, string, bytes, bool or null."""

    value: object
    kind: str


@dataclass(frozen=True, slots=True)
class Ident:
    name: str


@dataclass(frozen=True, slots=True)
class Select:
    """``operand.field``."""

    operand: Node
    field: str


@dataclass(frozen=True, slots=True)
class Index:
    """``operand[index]``."""

    operand: Node
    index: Node


@dataclass(frozen=True, slots=True)
class Call:
    """A function call ``name(args)`` (``target`` None) or a method call ``target.name(args)``."""

    name: str
    target: Node | None
    args: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Has:
    """The ``has(operand.field)`` macro."""

    operand: Node
    field: str


@dataclass(frozen=True, slots=True)
class Comprehension:
    """``target.kind(var, body)`` for kind in all, exists, exists_one, map, filter."""

    kind: str
    target: Node
    var: str
    body: Node


@dataclass(frozen=True, slots=True)
class Unary:
    """``!operand`` or ``-operand``."""

    op: str
    operand: Node


@dataclass(frozen=True, slots=True)
class Binary:
    """``left op right`` for the logical, relational and arithmetic operators (``in`` included)."""

    op: str
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Cond:
    """``cond ? then : otherwise``."""

    cond: Node
    then: Node
    otherwise: Node


@dataclass(frozen=True, slots=True)
class ListLit:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class MapLit:
    entries: tuple[tuple[Node, Node], ...]


Node: TypeAlias = Lit | Ident | Select | Index | Call | Has | Comprehension | Unary | Binary | Cond | ListLit | MapLit
