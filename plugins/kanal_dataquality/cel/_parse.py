"""Parse CEL text with cel-python's grammar, turn the parse tree into the typed AST, and check it.

This module and ``_reference`` are the only ones that touch cel-python and lark (the typed boundary).

The parser singleton. ``celpy.celparser.CELParser.CEL_PARSER`` is a process-wide class attribute holding the
lark parser of the *first* ``celpy.Environment`` built in the process, with that environment's tree class.
A later environment with another runner class then gets trees of the wrong class (a CompiledRunner fails on
plain lark trees). Kanal must neither depend on nor disturb what other code in the process does with
cel-python, so it builds its own lark parser: it clears the attribute, lets ``CELParser`` build a fresh
parser with plain ``lark.Tree`` nodes, keeps that object, and puts the previous value back, all under a
lock. Its ``Environment`` is built the same way, so it never creates the singleton either.

Compile-time checks done here (cel-python has no type checker, and would report all of these only when a
record is evaluated): syntax, undeclared identifiers (the variables are ``key``, ``value``, ``headers`` and
the variables of comprehension macros), unknown functions and methods, wrong argument counts, ``has()``
without a field selection, macro variables that are not identifiers, message construction, out-of-range
literals, invalid regular-expression literals of ``matches()``.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import lark
from celpy import Environment, InterpretedRunner
from celpy.celparser import CELParser
from celpy.celtypes import DoubleType, IntType, UintType
from celpy.evaluation import celbytes, celstr
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from kanal_dataquality.cel._ast import (
    Binary,
    Call,
    Comprehension,
    Cond,
    Has,
    Ident,
    Index,
    ListLit,
    Lit,
    MapLit,
    Node,
    Select,
    Unary,
)
from kanal_dataquality.cel._regex import RegexError, compile_matcher

__all__ = ["VARIABLES", "CelCompileError", "check", "environment", "parse", "to_ast"]

VARIABLES = frozenset({"key", "value", "headers"})

# Names that denote types; they are values in expressions such as ``type(x) == int``.
TYPE_NAMES = frozenset({"int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type"})

# Global functions: name -> allowed argument counts.
FUNCTIONS: dict[str, frozenset[int]] = {
    "size": frozenset({1}),
    "matches": frozenset({2}),
    "dyn": frozenset({1}),
    "type": frozenset({1}),
    "int": frozenset({1}),
    "uint": frozenset({1}),
    "double": frozenset({1}),
    "string": frozenset({1}),
    "bytes": frozenset({1}),
    "bool": frozenset({1}),
    "duration": frozenset({1}),
    "timestamp": frozenset({1}),
}

# Methods (receiver.name(args)): name -> allowed argument counts, receiver not counted.
METHODS: dict[str, frozenset[int]] = {
    "size": frozenset({0}),
    "matches": frozenset({1}),
    "contains": frozenset({1}),
    "startsWith": frozenset({1}),
    "endsWith": frozenset({1}),
    **{
        name: frozenset({0, 1})
        for name in (
            "getDate",
            "getDayOfMonth",
            "getDayOfWeek",
            "getDayOfYear",
            "getFullYear",
            "getMonth",
            "getHours",
            "getMilliseconds",
            "getMinutes",
            "getSeconds",
        )
    },
}

MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})

# Deepest parse tree accepted. cel-python's evaluator recurses once or more per level of the tree and
# fails near 450 levels under the recursion limit it sets (2500); 400 levels is about 35 nested
# parentheses or a chain of 380 conditions.
MAX_DEPTH = 400


class CelCompileError(ValueError):
    """The expression is not valid CEL, or uses something this gateway does not provide."""


_lock = threading.Lock()
_parser: Any = None  # lark.Lark, private to Kanal
_environment: Any = None  # celpy.Environment for InterpretedRunner


def _setup() -> None:
    global _parser, _environment
    with _lock:
        if _parser is not None:
            return
        saved = CELParser.CEL_PARSER
        limit = sys.getrecursionlimit()
        CELParser.CEL_PARSER = None
        try:
            CELParser(tree_class=lark.Tree)
            parser = CELParser.CEL_PARSER
            env = Environment(runner_class=InterpretedRunner)  # finds our parser in place, builds none
        finally:
            CELParser.CEL_PARSER = saved
            sys.setrecursionlimit(max(limit, sys.getrecursionlimit()))  # Environment() sets it to 2500
        _environment = env
        _parser = parser


def environment() -> Any:
    """The cel-python Environment used to build reference runners."""
    _setup()
    return _environment


def parse(text: str) -> Any:
    """Parse CEL text into cel-python's lark tree. Raises CelCompileError on a syntax error."""
    _setup()
    if not isinstance(text, str):
        raise CelCompileError("the CEL expression must be a string")
    if not text.strip():
        raise CelCompileError("the CEL expression is empty")
    try:
        with _lock:
            tree = _parser.parse(text)
    except RecursionError:
        raise CelCompileError("the expression is nested too deeply") from None
    except UnexpectedInput as exc:
        raise CelCompileError(_syntax_message(text, exc)) from None
    except LarkError as exc:
        raise CelCompileError(f"syntax error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    depth = _depth(tree)
    if depth > MAX_DEPTH:
        raise CelCompileError(
            f"the expression is nested too deeply ({depth} levels of syntax, at most {MAX_DEPTH}): "
            "split it into several rules"
        )
    return tree


def _depth(tree: Any) -> int:
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, lark.Tree))
    return deepest


def _syntax_message(text: str, exc: UnexpectedInput) -> str:
    line, column = getattr(exc, "line", None), getattr(exc, "column", None)
    where = f" at line {line}, column {column}" if isinstance(line, int) and line > 0 else ""
    if isinstance(exc, UnexpectedEOF):
        what = "unexpected end of expression"
    elif isinstance(exc, UnexpectedToken):
        token = exc.token
        what = "unexpected end of expression" if token.type == "$END" else f"unexpected {str(token)!r}"
    elif isinstance(exc, UnexpectedCharacters):
        pos = exc.pos_in_stream
        what = f"unexpected character {text[pos]!r}" if pos is not None and 0 <= pos < len(text) else "bad input"
    else:
        what = "bad input"
    context = ""
    lines = text.splitlines()
    if isinstance(line, int) and 0 < line <= len(lines) and isinstance(column, int) and column > 0:
        source, caret = lines[line - 1], column - 1
        start = max(0, min(caret - 40, len(source) - 80))  # a window of 80 characters around the caret
        context = f"\n  {source[start : start + 80]}\n  {' ' * (caret - start)}^"
    return f"syntax error{where}: {what}{context}"


# --- lark tree -> AST ---------------------------------------------------------------------------------------

_RELATIONS = {
    "relation_lt": "<",
    "relation_le": "<=",
    "relation_gt": ">",
    "relation_ge": ">=",
    "relation_eq": "==",
    "relation_ne": "!=",
    "relation_in": "in",
}
_ARITHMETIC = {
    "addition_add": "+",
    "addition_sub": "-",
    "multiplication_mul": "*",
    "multiplication_div": "/",
    "multiplication_mod": "%",
}


def _trees(tree: Any) -> list[Any]:
    return [c for c in tree.children if isinstance(c, lark.Tree)]


def _where(tree: Any) -> str:
    meta = getattr(tree, "meta", None)
    line = getattr(meta, "line", None) if meta is not None and not getattr(meta, "empty", True) else None
    column = getattr(meta, "column", None) if line is not None else None
    return f" (line {line}, column {column})" if line is not None else ""


def to_ast(tree: Any) -> Node:
    """Convert cel-python's lark tree into the typed AST. Raises CelCompileError for constructs that
    are not supported (message construction, leading-dot names, malformed macros, bad literals)."""
    data = tree.data
    kids = _trees(tree)
    if data == "expr":
        if len(kids) == 3:
            return Cond(to_ast(kids[0]), to_ast(kids[1]), to_ast(kids[2]))
        return to_ast(kids[0])
    if data in ("conditionalor", "conditionaland"):
        if len(kids) == 2:
            return Binary("||" if data == "conditionalor" else "&&", to_ast(kids[0]), to_ast(kids[1]))
        return to_ast(kids[0])
    if data in ("relation", "addition", "multiplication"):
        if len(kids) == 2:
            op_tree = kids[0]
            op = _RELATIONS.get(op_tree.data) or _ARITHMETIC[op_tree.data]
            return Binary(op, to_ast(_trees(op_tree)[0]), to_ast(kids[1]))
        return to_ast(kids[0])
    if data == "unary":
        if len(kids) == 2:
            return Unary("!" if kids[0].data == "unary_not" else "-", to_ast(kids[1]))
        return to_ast(kids[0])
    if data in ("member", "primary", "paren_expr"):
        return to_ast(kids[0])
    if data == "member_dot":
        return Select(to_ast(kids[0]), str(tree.children[1]))
    if data == "member_index":
        return Index(to_ast(kids[0]), to_ast(kids[1]))
    if data == "member_dot_arg":
        target = kids[0]
        name = str(tree.children[1])
        args = tuple(_trees(kids[1])) if len(kids) > 1 else ()
        if name in MACROS:
            return _macro(tree, name, to_ast(target), args)
        return Call(name, to_ast(target), tuple(to_ast(a) for a in args))
    if data == "ident_arg":
        name = str(tree.children[0])
        args = tuple(_trees(kids[0])) if kids else ()
        if name == "has":
            if len(args) != 1:
                raise CelCompileError(f"has() takes exactly one argument{_where(tree)}")
            inner = to_ast(args[0])
            if not isinstance(inner, Select):
                raise CelCompileError(f"has() needs a field selection such as has(value.field){_where(tree)}")
            return Has(inner.operand, inner.field)
        return Call(name, None, tuple(to_ast(a) for a in args))
    if data == "ident":
        return Ident(str(tree.children[0]))
    if data == "list_lit":
        return ListLit(tuple(to_ast(e) for e in _trees(kids[0]))) if kids else ListLit(())
    if data == "map_lit":
        if not kids:
            return MapLit(())
        parts = [to_ast(e) for e in _trees(kids[0])]
        return MapLit(tuple(zip(parts[0::2], parts[1::2], strict=True)))
    if data == "literal":
        return _literal(tree)
    if data == "member_object":
        raise CelCompileError(f"message construction is not supported{_where(tree)}")
    if data in ("dot_ident", "dot_ident_arg"):
        raise CelCompileError(f"leading-dot names are not supported{_where(tree)}")
    raise CelCompileError(f"unsupported construct {data!r}{_where(tree)}")


def _macro(tree: Any, name: str, target: Node, args: tuple[Any, ...]) -> Node:
    if len(args) != 2:
        extra = " (the three-argument map() is not supported)" if name == "map" and len(args) == 3 else ""
        raise CelCompileError(f"{name}() takes a variable and an expression{extra}{_where(tree)}")
    var = to_ast(args[0])
    if not isinstance(var, Ident):
        raise CelCompileError(f"the first argument of {name}() must be a variable name{_where(tree)}")
    return Comprehension(name, target, var.name, to_ast(args[1]))


def _literal(tree: Any) -> Lit:
    token = tree.children[0]
    kind = token.type
    try:
        if kind == "INT_LIT":
            return Lit(int(IntType(token.value)), "int")
        if kind == "UINT_LIT":
            return Lit(int(UintType(token.value[:-1])), "uint")
        if kind == "FLOAT_LIT":
            return Lit(float(DoubleType(token.value)), "double")
        if kind in ("STRING_LIT", "MLSTRING_LIT"):
            return Lit(str(celstr(token)), "string")
        if kind == "BYTES_LIT":
            return Lit(bytes(celbytes(token)), "bytes")
        if kind == "BOOL_LIT":
            return Lit(token.value == "true", "bool")
        if kind == "NULL_LIT":
            return Lit(None, "null")
    except (ValueError, OverflowError) as exc:
        raise CelCompileError(f"invalid literal {token.value!r}: {exc}{_where(tree)}") from None
    raise CelCompileError(f"unsupported literal {token.value!r}{_where(tree)}")


# --- static checks ------------------------------------------------------------------------------------------


def check(node: Node, bound: frozenset[str] = frozenset()) -> None:
    """Reject undeclared identifiers, unknown functions and wrong argument counts."""
    if isinstance(node, Lit):
        return
    if isinstance(node, Ident):
        if node.name not in VARIABLES and node.name not in bound and node.name not in TYPE_NAMES:
            raise CelCompileError(f"undeclared reference to {node.name!r}: the variables are key, value and headers")
        return
    if isinstance(node, Select):
        check(node.operand, bound)
    elif isinstance(node, Index):
        check(node.operand, bound)
        check(node.index, bound)
    elif isinstance(node, Has):
        check(node.operand, bound)
    elif isinstance(node, Call):
        table, what = (FUNCTIONS, "function") if node.target is None else (METHODS, "method")
        if node.name not in table:
            raise CelCompileError(f"unknown {what} {node.name!r}")
        if len(node.args) not in table[node.name]:
            counts = " or ".join(str(n) for n in sorted(table[node.name]))
            raise CelCompileError(f"{node.name}() takes {counts} argument(s), not {len(node.args)}")
        if node.target is not None:
            check(node.target, bound)
        for arg in node.args:
            check(arg, bound)
        pattern = node.args[-1] if node.name == "matches" else None
        if isinstance(pattern, Lit) and isinstance(pattern.value, str):
            try:
                compile_matcher(pattern.value)
            except RegexError as exc:
                raise CelCompileError(str(exc)) from None
    elif isinstance(node, Comprehension):
        check(node.target, bound)
        check(node.body, bound | {node.var})
    elif isinstance(node, Unary):
        check(node.operand, bound)
    elif isinstance(node, Binary):
        check(node.left, bound)
        check(node.right, bound)
    elif isinstance(node, Cond):
        check(node.cond, bound)
        check(node.then, bound)
        check(node.otherwise, bound)
    elif isinstance(node, ListLit):
        for item in node.items:
            check(item, bound)
    elif isinstance(node, MapLit):
        for k, v in node.entries:
            check(k, bound)
            check(v, bound)
