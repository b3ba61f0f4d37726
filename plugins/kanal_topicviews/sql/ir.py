"""The checked form of a view statement: a few immutable nodes, free of sqlglot.

``parse.py`` builds it from the sqlglot AST and refuses everything else; ``codegen.py`` turns it
into Python source and ``reference.py`` walks it. ``NOT x``, ``IS NOT``, ``NOT LIKE``, ``NOT IN`` and
``NOT BETWEEN`` are all ``Not``; ``BETWEEN`` is an ``And`` of two comparisons sharing the operand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, TypeAlias

Scalar: TypeAlias = bool | int | float | str | None
PathPart: TypeAlias = str | int  # str: object member, int: array index (>= 0)
CmpOp: TypeAlias = Literal["=", "<>", "<", "<=", ">", ">="]
ArithOp: TypeAlias = Literal["+", "-", "*", "/", "%"]
MetaField: TypeAlias = Literal["key", "keyjson", "partition", "offset", "timestamp", "header"]
NowKind: TypeAlias = Literal["timestamp", "date", "time"]


@dataclass(frozen=True, slots=True)
class Lit:
    value: Scalar


@dataclass(frozen=True, slots=True)
class Path:
    """A path inside the record value (a JSON object)."""

    parts: tuple[PathPart, ...]


@dataclass(frozen=True, slots=True)
class Meta:
    """Record metadata: ``record.key`` (text), ``record.key.<path>`` (``keyjson``: the key parsed as
    JSON, then ``parts``), ``record.partition``, ``record.offset``, ``record.timestamp``,
    ``record.header.<name>`` (``name``)."""

    field: MetaField
    name: str = ""
    parts: tuple[PathPart, ...] = ()


@dataclass(frozen=True, slots=True)
class Now:
    """CURRENT_TIMESTAMP, CURRENT_DATE or CURRENT_TIME (one value per batch, from the context)."""

    kind: NowKind


@dataclass(frozen=True, slots=True)
class Cmp:
    op: CmpOp
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class And:
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Or:
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Not:
    operand: Expr


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: Expr


@dataclass(frozen=True, slots=True)
class IsBool:
    """``x IS TRUE`` / ``x IS FALSE``: never NULL."""

    operand: Expr
    value: bool


@dataclass(frozen=True, slots=True)
class In:
    operand: Expr
    items: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Match:
    """LIKE / ILIKE (``full``: the translated pattern must match the whole string) or REGEXP /
    REGEXP_LIKE (a search anywhere in the string). ``sql`` is the operator as written, for messages."""

    operand: Expr
    regex: re.Pattern[str]
    full: bool
    sql: str


@dataclass(frozen=True, slots=True)
class Arith:
    op: ArithOp
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Neg:
    operand: Expr


@dataclass(frozen=True, slots=True)
class Case:
    """``CASE [operand] WHEN a THEN b ... [ELSE d] END``; with an operand, ``WHEN a`` means
    ``operand = a``."""

    operand: Expr | None
    whens: tuple[tuple[Expr, Expr], ...]
    default: Expr | None


Expr: TypeAlias = Lit | Path | Meta | Now | Cmp | And | Or | Not | IsNull | IsBool | In | Match | Arith | Neg | Case


@dataclass(frozen=True, slots=True)
class Column:
    """One projected output field: its JSON name and its expression."""

    name: str
    expr: Expr


@dataclass(frozen=True, slots=True)
class Query:
    statement: str
    topic: str
    star: bool  # SELECT * (the original value's fields come first)
    columns: tuple[Column, ...]  # the other output fields, in SELECT order
    where: Expr | None


def children(e: Expr) -> tuple[Expr, ...]:
    """The direct sub-expressions of ``e``."""
    if isinstance(e, Cmp | And | Or | Arith):
        return (e.left, e.right)
    if isinstance(e, Not | IsNull | IsBool | Match | Neg):
        return (e.operand,)
    if isinstance(e, In):
        return (e.operand, *e.items)
    if isinstance(e, Case):
        out: list[Expr] = [] if e.operand is None else [e.operand]
        for cond, result in e.whens:
            out += (cond, result)
        if e.default is not None:
            out.append(e.default)
        return tuple(out)
    return ()


def walk(e: Expr) -> list[Expr]:
    """``e`` and all its sub-expressions, depth first."""
    out = [e]
    for c in children(e):
        out += walk(c)
    return out
