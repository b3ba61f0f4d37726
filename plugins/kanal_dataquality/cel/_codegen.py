"""Translate the CEL AST into one Python expression, compiled once, run on plain JSON values.

The generated function is *optimistic*: it evaluates left to right with Python's short-circuit ``and`` /
``or`` and raises as soon as CEL would produce an error (missing key, wrong type, overflow, ...). When it
returns, its answer is CEL's answer: a conjunct that is false makes CEL's commutative ``&&`` false whatever
the others are, and everything evaluated before it raised nothing. When it raises, the caller asks the
reference evaluator. Constructs outside the subset raise ``Unsupported`` at build time; such an expression
runs on the reference evaluator only.

Subset: ``&& || ! ?:``, ``== != < <= > >= in``, ``+ - * / %`` (int64 overflow checks), unary ``-``, field
selection ``a.f``, indexing ``a[k]``, list literals, ``has(a.f)``, ``size()``, ``matches()`` with a
literal pattern, ``startsWith/endsWith/contains``, ``dyn()``, the macros ``all exists exists_one map
filter``, and int, double, string, bool and null literals. Not in the subset: uint and bytes literals,
map literals, type names and ``type()``, conversions (``int()``, ``string()``, ...), timestamps and
durations.

Static types (``bool``, ``num``, ``str``, ``list``, ``null``, ``dyn``) let the generator drop runtime checks
where the shape of the expression already guarantees them, e.g. the operands of ``&&`` that are comparisons.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
from kanal_dataquality.cel._parse import VARIABLES
from kanal_dataquality.cel._regex import Matcher, compile_matcher
from kanal_dataquality.cel._runtime import HELPERS

__all__ = ["FastFunction", "Generated", "Unsupported", "generate"]

FastFunction = Callable[[Any, Any, Any], Any]

_ORDER = {"<": "_lt", "<=": "_le", ">": "_gt", ">=": "_ge"}
_MIRROR = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}
_ARITH = {"+": "_add", "-": "_sub", "*": "_mul", "/": "_div", "%": "_mod"}


class Unsupported(Exception):
    """The expression uses something outside the fast-path subset."""


@dataclass
class Generated:
    """The generated source (for debugging), its compiled function, and the regexes it uses."""

    source: str
    function: FastFunction
    matchers: list[Matcher] = field(default_factory=list)


class _Gen:
    def __init__(self) -> None:
        self.consts: dict[str, Any] = {}
        self.matchers: list[Matcher] = []
        self.counter = 0
        self.scope: dict[str, str] = {}

    def name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def const(self, obj: Any) -> str:
        n = self.name("_k")
        self.consts[n] = obj
        return n

    # Each method returns (python code, static type). Code is always parenthesized or atomic.

    def gen(self, node: Node) -> tuple[str, str]:
        if isinstance(node, Lit):
            return self.literal(node)
        if isinstance(node, Ident):
            if node.name in self.scope:
                return self.scope[node.name], "dyn"
            if node.name in VARIABLES:
                return node.name, "dyn"
            raise Unsupported(f"type name {node.name}")
        if isinstance(node, Select):
            operand, _ = self.gen(node.operand)
            return f"{operand}[{node.field!r}]", "dyn"
        if isinstance(node, Index):
            return self.index(node)
        if isinstance(node, Has):
            operand, _ = self.gen(node.operand)
            t = self.name("_t")
            return f"({node.field!r} in {t} if ({t} := {operand}).__class__ is dict else _E())", "bool"
        if isinstance(node, Unary):
            code, typ = self.gen(node.operand)
            if node.op == "!":
                return (f"(not {code})" if typ == "bool" else f"_not({code})"), "bool"
            return f"_neg({code})", "num" if typ == "num" else "dyn"
        if isinstance(node, Binary):
            return self.binary(node)
        if isinstance(node, Cond):
            cond = self.boolean(node.cond)
            then, t1 = self.gen(node.then)
            other, t2 = self.gen(node.otherwise)
            return f"({then} if {cond} else {other})", t1 if t1 == t2 else "dyn"
        if isinstance(node, ListLit):
            return self.list_literal(node)
        if isinstance(node, Call):
            return self.call(node)
        if isinstance(node, Comprehension):
            return self.comprehension(node)
        if isinstance(node, MapLit):
            raise Unsupported("map literal")
        raise Unsupported(type(node).__name__)

    def boolean(self, node: Node) -> str:
        code, typ = self.gen(node)
        return code if typ == "bool" else f"_b({code})"

    def literal(self, node: Lit) -> tuple[str, str]:
        v = node.value
        if node.kind == "int" and isinstance(v, int):
            return (f"({v})" if v < 0 else repr(v)), "num"
        if node.kind == "double" and isinstance(v, float):
            if not math.isfinite(v) or v < 0 or (v == 0 and math.copysign(1.0, v) < 0):
                return self.const(v), "num"
            return repr(v), "num"
        if node.kind == "string" and isinstance(v, str):
            return repr(v), "str"
        if node.kind == "bool":
            return ("True" if v else "False"), "bool"
        if node.kind == "null":
            return "None", "null"
        raise Unsupported(f"{node.kind} literal")

    def index(self, node: Index) -> tuple[str, str]:
        operand, _ = self.gen(node.operand)
        idx = node.index
        if isinstance(idx, Lit) and idx.kind == "string":
            return f"{operand}[{idx.value!r}]", "dyn"
        if isinstance(idx, Lit) and idx.kind == "int" and isinstance(idx.value, int) and idx.value >= 0:
            t = self.name("_t")
            return f"({t}[{idx.value}] if ({t} := {operand}).__class__ is list else _E())", "dyn"
        index, _ = self.gen(idx)
        return f"_idx({operand}, {index})", "dyn"

    def list_literal(self, node: ListLit) -> tuple[str, str]:
        if all(isinstance(i, Lit) for i in node.items):
            values = [self.literal_value(i) for i in node.items if isinstance(i, Lit)]
            return self.const(values), "list"
        return "[" + ", ".join(self.gen(i)[0] for i in node.items) + "]", "list"

    def literal_value(self, node: Lit) -> Any:
        self.literal(node)  # raises Unsupported for uint and bytes
        return node.value

    def binary(self, node: Binary) -> tuple[str, str]:
        op = node.op
        if op in ("&&", "||"):
            parts: list[Node] = []
            self.flatten(node, op, parts)
            joiner = " and " if op == "&&" else " or "
            return "(" + joiner.join(self.boolean(p) for p in parts) + ")", "bool"
        if op in ("==", "!="):
            code = self.equality(node.left, node.right)
            return (code if op == "==" else f"(not {code})"), "bool"
        if op in _ORDER:
            return self.ordering(op, node.left, node.right), "bool"
        if op == "in":
            return self.membership(node.left, node.right), "bool"
        left, _ = self.gen(node.left)
        right, _ = self.gen(node.right)
        return f"{_ARITH[op]}({left}, {right})", "dyn" if op == "+" else "num"

    def flatten(self, node: Node, op: str, out: list[Node]) -> None:
        if isinstance(node, Binary) and node.op == op:
            self.flatten(node.left, op, out)
            self.flatten(node.right, op, out)
        else:
            out.append(node)

    def equality(self, left: Node, right: Node) -> str:
        if isinstance(left, Lit) and not isinstance(right, Lit):
            left, right = right, left
        if isinstance(right, Lit):
            code, _ = self.gen(left)
            lit, _ = self.literal(right)
            if right.kind == "string":
                return f"({code} == {lit})"  # a str equals only a str; every other JSON value compares False
            if right.kind == "bool":
                return f"({code} is {lit})"
            if right.kind == "null":
                return f"({code} is None)"
            if right.kind in ("int", "double"):
                if right.value in (0, 1):  # True == 1 and False == 0 in Python, not in CEL
                    t = self.name("_t")
                    return f"(({t} := {code}) == {lit} and {t}.__class__ is not bool)"
                return f"({code} == {lit})"
        a, _ = self.gen(left)
        b, _ = self.gen(right)
        return f"_eq({a}, {b})"

    def ordering(self, op: str, left: Node, right: Node) -> str:
        if isinstance(left, Lit) and not isinstance(right, Lit):
            left, right, op = right, left, _MIRROR[op]
        a, ta = self.gen(left)
        b, tb = self.gen(right)
        if ta == tb and ta in ("num", "str"):
            return f"({a} {op} {b})"  # both sides are known numbers, or known strings
        if isinstance(right, Lit) and right.kind in ("int", "double", "string"):
            t = self.name("_t")
            guard = "in _N" if right.kind != "string" else "is str"
            return f"({t} {op} {b} if ({t} := {a}).__class__ {guard} else _E())"
        return f"{_ORDER[op]}({a}, {b})"

    def membership(self, left: Node, right: Node) -> str:
        a, _ = self.gen(left)
        if (
            isinstance(right, ListLit)
            and right.items
            and all(isinstance(i, Lit) and i.kind == "string" for i in right.items)
        ):
            values = tuple(i.value for i in right.items if isinstance(i, Lit))
            return f"({a} in {self.const(values)})"  # == against str literals never errs and never lies
        b, _ = self.gen(right)
        if isinstance(left, Lit) and left.kind == "string":
            t = self.name("_t")
            return f"({a} in {t} if ({t} := {b}).__class__ is dict else _in({a}, {t}))"
        return f"_in({a}, {b})"

    def call(self, node: Call) -> tuple[str, str]:
        name = node.name
        if node.target is not None:
            receiver: Node | None = node.target
            args = node.args
        elif name in ("size", "matches", "dyn") and node.args:
            receiver, args = node.args[0], node.args[1:]
        else:
            raise Unsupported(f"function {name}()")
        assert receiver is not None
        if name == "dyn":
            return self.gen(receiver)
        recv, _ = self.gen(receiver)
        t = self.name("_t")
        if name == "size" and not args:
            return f"(len({t}) if ({t} := {recv}).__class__ in _SZ else _E())", "num"
        if name == "matches" and len(args) == 1:
            pattern = args[0]
            if not (isinstance(pattern, Lit) and pattern.kind == "string" and isinstance(pattern.value, str)):
                raise Unsupported("matches() with a pattern that is not a literal")
            m = compile_matcher(pattern.value)
            self.matchers.append(m)
            if m.literals is not None:  # ^(EUR|USD)$: exactly these texts
                return f"({t} in {self.const(m.literals)} if ({t} := {recv}).__class__ is str else _E())", "bool"
            search = self.search_code(m, t)
            return f"({search} is not None if ({t} := {recv}).__class__ is str else _E())", "bool"
        if name in ("startsWith", "endsWith", "contains") and len(args) == 1:
            arg = args[0]
            if isinstance(arg, Lit) and arg.kind == "string":
                lit = repr(arg.value)
                if name == "contains":
                    test = f"{lit} in {t}"
                else:
                    test = f"{t}.{'startswith' if name == 'startsWith' else 'endswith'}({lit})"
                return f"({test} if ({t} := {recv}).__class__ is str else _E())", "bool"
            code, _ = self.gen(arg)
            return f"_{name}({recv}, {code})", "bool"
        raise Unsupported(f"method {name}()")

    def search_code(self, m: Matcher, t: str) -> str:
        re2 = self.const(m.re2)
        if m.python is None:
            return f"{re2}({t})"
        py = self.const(m.python)
        if m.limit is None:
            return f"{py}({t})"
        return f"({py}({t}) if len({t}) <= {m.limit} else {re2}({t}))"

    def comprehension(self, node: Comprehension) -> tuple[str, str]:
        target, _ = self.gen(node.target)
        var = self.name(f"_v_{node.var}_")
        saved = dict(self.scope)
        self.scope[node.var] = var
        try:
            if node.kind in ("all", "exists", "exists_one", "filter"):
                body = self.boolean(node.body)
            else:
                body, _ = self.gen(node.body)
        finally:
            self.scope = saved
        # map()/filter() with a lambda rather than a comprehension: a comprehension's iterable may not
        # contain the := temporaries the target expression can need.
        fn = f"(lambda {var}: {body})"
        source = f"_iter({target})"
        if node.kind == "all":
            return f"all(map({fn}, {source}))", "bool"
        if node.kind == "exists":
            return f"any(map({fn}, {source}))", "bool"
        if node.kind == "exists_one":
            return f"(sum(map({fn}, {source})) == 1)", "bool"
        if node.kind == "map":
            return f"list(map({fn}, {source}))", "list"
        if node.kind == "filter":
            return f"list(filter({fn}, {source}))", "list"
        raise Unsupported(f"macro {node.kind}")


def generate(node: Node) -> Generated:
    """Generate and compile the fast function ``f(key, value, headers)``. Raises Unsupported."""
    gen = _Gen()
    body, _ = gen.gen(node)
    source = f"lambda key, value, headers: {body}"
    builtins = (all, any, sum, len, map, filter, list, dict, str, bool, int, float)
    namespace: dict[str, Any] = {"__builtins__": {b.__name__: b for b in builtins}}
    namespace.update(HELPERS)
    namespace.update(gen.consts)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "'abc'['x']": a SyntaxWarning; it raises at run time, as CEL errs
            code = compile(source, "<cel fast path>", "eval")
        function: FastFunction = eval(code, namespace)
    except (SyntaxError, RecursionError, MemoryError, ValueError) as exc:
        raise Unsupported(f"generated code does not compile: {type(exc).__name__}") from None
    return Generated(source, function, gen.matchers)
