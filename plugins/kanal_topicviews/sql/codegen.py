"""Turn a checked view query (``ir.Query``) into the source of ONE Python function, and compile it.

The function is ``_view(v, m, ctx)``: ``v`` the parsed value, ``m`` a ``RecordMeta`` (or None when
the view reads no metadata), ``ctx`` a ``ViewContext``. It returns None (filtered out), ``KEEP``
(``SELECT *``: keep the original bytes) or the projected dict.

How the code is made fast while keeping the 3-valued semantics exact:

* Conditions are generated in *test* form: ``test(e, True)`` is a plain Python boolean that is true
  exactly when ``e`` is SQL TRUE, ``test(e, False)`` exactly when it is SQL FALSE. ``WHERE`` keeps
  a record when its condition is TRUE, so ``AND``/``OR``/``NOT`` become Python's short-circuit
  ``and``/``or`` over tests (``NOT x`` is TRUE when ``x`` is FALSE), with no NULL bookkeeping.
* A comparison with a literal is inlined with a class guard (``x.__class__ in _NUM and x > 100``,
  ``x == 'EUR'``); every other case calls the helpers of ``runtime.py``, which implement the same
  rules in general.
* Paths (or path prefixes) read more than once are read once into locals; LIKE and REGEXP
  patterns are compiled once and bound as constants.

``reference.py`` is the slow, independent statement of the same semantics; the tests check that the
two agree.
"""

from __future__ import annotations

import itertools
import keyword
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import runtime
from .errors import ViewRecordError, ViewSqlError
from .ir import (
    And,
    Arith,
    Case,
    Cmp,
    CmpOp,
    Expr,
    In,
    IsBool,
    IsNull,
    Lit,
    Match,
    Meta,
    Neg,
    Not,
    Now,
    Or,
    Path,
    PathPart,
    Query,
    walk,
)

__all__ = ["Body", "TransformFn", "generate", "view_source"]

TransformFn = Callable[[Any, Any, Any], Any]

_FLIP: dict[CmpOp, CmpOp] = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_INVERSE: dict[CmpOp, CmpOp] = {"=": "<>", "<>": "=", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}
_PY_OP = {"=": "==", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_CMP_HELPER = {"=": "_eq", "<>": "_ne", "<": "_lt", "<=": "_le", ">": "_gt", ">=": "_ge"}
_ARITH_HELPER = {"+": "_add", "-": "_sub", "*": "_mul", "/": "_div", "%": "_mod"}
_NOW_ATTR = {"timestamp": "ctx.timestamp", "date": "ctx.date", "time": "ctx.time"}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_counter = itertools.count()


def _not_object(v: Any) -> None:
    kind = "null (a tombstone)" if v is None else f"a JSON {type(v).__name__}"
    raise ViewRecordError(f"the record value is {kind}, not a JSON object")


_BASE_GLOBALS: dict[str, Any] = {
    "_NUM": frozenset((int, float)),
    "KEEP": runtime.KEEP,
    "_not_object": _not_object,
    "_key_text": runtime.key_text,
    "_key_json": runtime.key_json,
    "_header": runtime.header_text,
    "_out": runtime.out,
    "_truth": runtime.truth,
    "_eq": runtime.eq,
    "_ne": runtime.ne,
    "_lt": runtime.lt,
    "_le": runtime.le,
    "_gt": runtime.gt,
    "_ge": runtime.ge,
    "_in": runtime.in_,
    "_match": runtime.match,
    "_add": runtime.add,
    "_sub": runtime.sub,
    "_mul": runtime.mul,
    "_div": runtime.div,
    "_mod": runtime.mod,
    "_neg": runtime.neg,
}


def _kind(e: Expr) -> str:
    """Static kind: num, str, bool, null, temporal or any; ``_nullable`` says if NULL is possible."""
    if isinstance(e, Lit):
        v = e.value
        if v is None:
            return "null"
        if isinstance(v, bool):
            return "bool"
        return "str" if isinstance(v, str) else "num"
    if isinstance(e, Meta):
        return {"key": "str", "header": "str", "keyjson": "any"}.get(e.field, "num")
    if isinstance(e, Now):
        return "temporal"
    if isinstance(e, Arith | Neg):
        return "num"
    if isinstance(e, Cmp | And | Or | Not | IsNull | IsBool | In | Match):
        return "bool"
    return "any"


def _now_shift(e: Expr) -> bool:
    """``CURRENT_* + n`` or ``CURRENT_* - n`` with a small literal: always a finite in-range number
    (the ms of a temporal value stay below 2**48), so it is computed inline, never NULL."""
    if not (isinstance(e, Arith) and e.op in ("+", "-") and isinstance(e.left, Now) and isinstance(e.right, Lit)):
        return False
    n = e.right.value
    return isinstance(n, float) or (isinstance(n, int) and not isinstance(n, bool) and abs(n) < 2**53)


def _nullable(e: Expr) -> bool:
    if _now_shift(e):
        return False
    if isinstance(e, Lit):
        return e.value is None
    if isinstance(e, Meta):
        return e.field in ("key", "keyjson", "header")
    return not isinstance(e, Now | IsNull | IsBool)


def _may_be_temporal(e: Expr) -> bool:
    if isinstance(e, Now):
        return True
    if isinstance(e, Case):
        results = [r for _, r in e.whens] + ([e.default] if e.default is not None else [])
        return any(_may_be_temporal(r) for r in results)
    return False


def _prefixes(parts: tuple[PathPart, ...]) -> list[tuple[PathPart, ...]]:
    return [parts[:k] for k in range(1, len(parts) + 1)]


class _Gen:
    def __init__(self, query: Query) -> None:
        self.q = query
        self.globals: dict[str, Any] = dict(_BASE_GLOBALS)
        self.tmp_n = 0
        self.const_n = 0
        self.locals: dict[tuple[PathPart, ...], str] = {}  # hoisted value-path prefixes
        self.meta_locals: dict[tuple[str, str], str] = {}
        self.needs_value = False

    # -- names

    def tmp(self) -> str:
        self.tmp_n += 1
        return f"_t{self.tmp_n}"

    def const(self, obj: Any) -> str:
        self.const_n += 1
        name = f"_k{self.const_n}"
        self.globals[name] = obj
        return name

    def bind(self, code: str) -> tuple[str, str]:
        """(first use, later uses) of a value: a walrus into a temp unless it is already a name."""
        if _IDENT.fullmatch(code) and not keyword.iskeyword(code):
            return code, code
        t = self.tmp()
        return f"({t} := {code})", t

    # -- the function

    def body(self) -> Body:
        q = self.q
        where_exprs = walk(q.where) if q.where is not None else []
        col_exprs = [x for c in q.columns for x in walk(c.expr)]
        where_paths = [x.parts for x in where_exprs if isinstance(x, Path)]
        col_paths = [x.parts for x in col_exprs if isinstance(x, Path)]
        counts = Counter(p for parts in where_paths + col_paths for p in _prefixes(parts))
        in_where = {p for parts in where_paths for p in _prefixes(parts)}
        needs_value = self.needs_value = bool(where_paths or col_paths) or (q.star and bool(q.columns))

        setup: list[str] = []
        if needs_value:
            setup.append("if v.__class__ is not dict: _not_object(v)")
        metas = {x for x in where_exprs + col_exprs if isinstance(x, Meta)}
        for meta in sorted(metas, key=lambda x: (x.field, x.name, repr(x.parts))):
            key = (meta.field, meta.name)
            if key in self.meta_locals:
                continue
            name = f"_m{len(self.meta_locals) + 1}"
            self.meta_locals[key] = name
            if meta.field == "key":
                setup.append(f"{name} = _key_text(m.key)")
            elif meta.field == "keyjson":
                setup.append(f"{name} = _key_json(m.key)")
            elif meta.field == "header":
                setup.append(f"{name} = _header(m.headers, {meta.name!r})")
            else:
                setup.append(f"{name} = m.{meta.field}")

        hoist = sorted((p for p, n in counts.items() if n >= 2), key=len)
        for prefix in hoist:
            if prefix in in_where:
                setup.append(self.hoist(prefix))
        condition = self.test(q.where, True) if q.where is not None else None
        rest = [self.hoist(prefix) for prefix in hoist if prefix not in in_where]
        if q.star and not q.columns:
            result = "KEEP"
        else:
            items = []
            for col in q.columns:
                code = self.val(col.expr)
                if _may_be_temporal(col.expr):
                    code = f"_out({code})"
                items.append(f"{col.name!r}: {code}")
            members = ", ".join(items)
            if q.star:
                members = "**v, " + members
            result = f"{{{members}}}"
        return Body(tuple(setup), condition, tuple(rest), result, self.globals)

    def hoist(self, prefix: tuple[PathPart, ...]) -> str:
        name = f"_p{len(self.locals) + 1}"
        code = self.path_code(prefix)
        self.locals[prefix] = name
        return f"{name} = {code}"

    # -- values

    def path_code(self, parts: tuple[PathPart, ...]) -> str:
        for k in range(len(parts), 0, -1):
            if parts[:k] in self.locals:
                return self.steps(self.locals[parts[:k]], parts[k:], known_dict=False)
        return self.steps("v", parts, known_dict=True)

    def steps(self, code: str, parts: tuple[PathPart, ...], known_dict: bool) -> str:
        for i, p in enumerate(parts):
            if isinstance(p, str):
                if known_dict and i == 0:
                    code = f"{code}.get({p!r})"
                else:
                    first, later = self.bind(code)
                    code = f"({later}.get({p!r}) if {first}.__class__ is dict else None)"
            else:
                if known_dict and i == 0:
                    return "None"  # the value is an object: an index finds nothing
                first, later = self.bind(code)
                code = f"({later}[{p}] if {first}.__class__ is list and len({later}) > {p} else None)"
        return code

    def val(self, e: Expr) -> str:
        if isinstance(e, Lit):
            return repr(e.value)
        if isinstance(e, Path):
            return self.path_code(e.parts)
        if isinstance(e, Meta):
            name = self.meta_locals[(e.field, e.name)]
            return self.steps(name, e.parts, known_dict=False) if e.field == "keyjson" else name
        if isinstance(e, Now):
            return _NOW_ATTR[e.kind]
        if isinstance(e, Cmp):
            return f"{_CMP_HELPER[e.op]}({self.val(e.left)}, {self.val(e.right)})"
        if isinstance(e, IsNull):
            return f"({self.val(e.operand)} is None)"
        if isinstance(e, IsBool):
            return f"({self.val(e.operand)} is {e.value!r})"
        if isinstance(e, In):
            return f"_in({self.val(e.operand)}, ({''.join(self.val(i) + ', ' for i in e.items)}))"
        if isinstance(e, Match):
            return f"_match({self.const(e.regex)}, {self.val(e.operand)}, {e.full!r})"
        if isinstance(e, And | Or | Not):
            return f"(True if {self.test(e, True)} else False if {self.test(e, False)} else None)"
        if isinstance(e, Arith):
            if _now_shift(e):
                return f"({_NOW_ATTR[e.left.kind]}.ms {e.op} {self.val(e.right)})"  # type: ignore[union-attr]
            return f"{_ARITH_HELPER[e.op]}({self.val(e.left)}, {self.val(e.right)})"
        if isinstance(e, Neg):
            return f"_neg({self.val(e.operand)})"
        if isinstance(e, Case):
            out = []
            for cond, result in e.whens:
                test = self.test(Cmp("=", e.operand, cond) if e.operand is not None else cond, True)
                out.append(f"{self.val(result)} if {test} else ")
            default = "None" if e.default is None else self.val(e.default)
            return "(" + "".join(out) + default + ")"
        raise AssertionError(f"unknown node {e!r}")

    # -- conditions

    def test(self, e: Expr, want: bool) -> str:
        """Python boolean code: true exactly when ``e`` is SQL TRUE (``want``) or FALSE."""
        if isinstance(e, Lit):
            return repr(e.value is want)
        if isinstance(e, And | Or):
            # a chain of one operator is flattened: Python limits the nesting of parentheses
            joiner = " and " if isinstance(e, And) == want else " or "
            terms: list[Expr] = []
            todo: list[Expr] = [e]
            while todo:
                x = todo.pop()
                if isinstance(x, And | Or) and type(x) is type(e):
                    todo += (x.right, x.left)
                else:
                    terms.append(x)
            return "(" + joiner.join(self.test(t, want) for t in terms) + ")"
        if isinstance(e, Not):
            return self.test(e.operand, not want)
        if isinstance(e, IsNull):
            return f"({self.val(e.operand)} is {'' if want else 'not '}None)"
        if isinstance(e, IsBool):
            return f"({self.val(e.operand)} is {'' if want else 'not '}{e.value!r})"
        if isinstance(e, Cmp):
            return self.cmp_test(e, want)
        if isinstance(e, In):
            return self.in_test(e, want)
        if isinstance(e, Match):
            first, later = self.bind(self.val(e.operand))
            fn = self.const(e.regex.fullmatch if e.full else e.regex.search)
            return f"({first}.__class__ is str and {fn}({later}) is {'not ' if want else ''}None)"
        return f"({self.val(e)} is {want!r})"

    def cmp_test(self, e: Cmp, want: bool) -> str:
        op, left, right = e.op, e.left, e.right
        if isinstance(left, Lit | Now) and not isinstance(right, Lit | Now):
            op, left, right = _FLIP[op], right, left
        lk = _kind(left)
        if lk == "null" or _kind(right) == "null":
            return "False"  # NULL compared with anything is NULL
        rk = _kind(right)
        if {lk, rk} <= {"num", "temporal"} and not (lk == rk == "temporal"):
            # numbers (or a CURRENT_* value, as its ms) on both sides: guard the NULLs, compare
            sides = []
            guards = []
            for side in (left, right):
                if isinstance(side, Now):
                    sides.append(f"{_NOW_ATTR[side.kind]}.ms")
                elif _nullable(side):
                    first, later = self.bind(self.val(side))
                    guards.append(f"{first} is not None")
                    sides.append(later)
                else:
                    sides.append(self.val(side))
            pyop = _PY_OP[op if want else _INVERSE[op]]
            return "(" + "".join(g + " and " for g in guards) + f"{sides[0]} {pyop} {sides[1]})"
        if isinstance(right, Now) and lk == "any" and op not in ("=", "<>") and not _may_be_temporal(left):
            # a JSON value against CURRENT_*: numbers inline, strings (ISO-8601) through the helper
            first, later = self.bind(self.val(left))
            ms = f"{_NOW_ATTR[right.kind]}.ms"
            pyop = _PY_OP[op if want else _INVERSE[op]]
            helper = _CMP_HELPER[op]
            return (
                f"(({first}.__class__ in _NUM and {later} {pyop} {ms}) or "
                f"({later}.__class__ is str and {helper}({later}, {_NOW_ATTR[right.kind]}) is {want!r}))"
            )
        if not want:
            op = _INVERSE[op] if op not in ("=", "<>") else op
        if isinstance(right, Lit) and lk != "temporal" and not _may_be_temporal(left):
            lit = right.value
            a = self.val(left)
            if op in ("=", "<>"):
                is_true = (op == "=") == want  # the test is "equal" (else "not equal and not NULL")
                if isinstance(lit, bool):
                    if is_true:
                        return f"({a} is {lit!r})"
                    first, later = self.bind(a)
                    return f"({first} is not None and {later} is not {lit!r})"
                bool_guard = not isinstance(lit, str) and lit in (0, 1) and lk in ("any", "bool")
                if is_true:
                    if bool_guard:
                        first, later = self.bind(a)
                        return f"({first} == {lit!r} and {later}.__class__ is not bool)"
                    return f"({a} == {lit!r})"
                first, later = self.bind(a)
                if bool_guard:
                    return f"({first} is not None and ({later} != {lit!r} or {later}.__class__ is bool))"
                if not _nullable(left):
                    return f"({a} != {lit!r})"
                return f"({first} is not None and {later} != {lit!r})"
            # ordering: both sides of one kind (the inverse op gives the FALSE test)
            pyop = _PY_OP[op]
            if isinstance(lit, bool):
                guard = "is bool"
            elif isinstance(lit, str):
                guard = "is str"
            else:
                guard = "in _NUM"
            if lk == "num" and not _nullable(left) and guard == "in _NUM":
                return f"({a} {pyop} {lit!r})"
            first, later = self.bind(a)
            return f"({first}.__class__ {guard} and {later} {pyop} {lit!r})"
        helper = _CMP_HELPER[e.op]
        return f"({helper}({self.val(e.left)}, {self.val(e.right)}) is {want!r})"

    def in_test(self, e: In, want: bool) -> str:
        items = e.items
        scalars = [i.value for i in items if isinstance(i, Lit)]
        if len(scalars) == len(items) and _kind(e.operand) != "temporal" and not _may_be_temporal(e.operand):
            has_null = any(v is None for v in scalars)
            values = [v for v in scalars if v is not None]
            if has_null and not want:
                return "False"  # never FALSE: at best NULL
            if values and all(isinstance(v, str) for v in values):
                guard = "is str"
            elif values and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
                guard = "in _NUM"
            else:
                guard = ""
            if guard:
                k = self.const(frozenset(values))
                first, later = self.bind(self.val(e.operand))
                if want:
                    return f"({first}.__class__ {guard} and {later} in {k})"
                return f"({first} is not None and not ({later}.__class__ {guard} and {later} in {k}))"
        vals = "".join(self.val(i) + ", " for i in items)
        return f"(_in({self.val(e.operand)}, ({vals})) is {want!r})"


@dataclass(frozen=True, slots=True)
class Body:
    """The generated statement in parts (unindented lines), so that a record loop can inline it
    instead of calling ``_view`` once per record (the fetch path does, see ``kanal_topicviews.fastloop``).

    The code reads the value as ``v``, the metadata as ``m`` and the batch context as ``ctx``; its
    other names (helpers, constants) are in ``names``. ``setup`` runs first (it raises
    ``ViewRecordError`` for a value that is not an object), the record is kept when ``condition``
    (None: no WHERE) is true, then ``rest`` runs and ``result`` is ``KEEP`` or the projection."""

    setup: tuple[str, ...]
    condition: str | None
    rest: tuple[str, ...]
    result: str
    names: Mapping[str, Any]


def view_source(body: Body) -> str:
    """The source of ``_view(v, m, ctx)``: None (filtered out), ``KEEP`` or the projected dict."""
    lines = ["def _view(v, m, ctx):"]
    lines += [f"    {line}" for line in body.setup]
    if body.condition is not None:
        lines.append(f"    if not {body.condition}: return None")
    lines += [f"    {line}" for line in body.rest]
    lines.append(f"    return {body.result}")
    return "\n".join(lines) + "\n"


class Generated:
    """The source and the compiled function of one view, with what the function reads."""

    __slots__ = ("body", "fn", "needs_meta", "needs_value", "source", "uses_now")

    def __init__(
        self, fn: TransformFn, source: str, body: Body, needs_value: bool, needs_meta: bool, uses_now: bool
    ) -> None:
        self.fn = fn
        self.source = source
        self.body = body
        self.needs_value = needs_value
        self.needs_meta = needs_meta
        self.uses_now = uses_now


def generate(query: Query) -> Generated:
    """Generate and compile the view function of ``query``."""
    gen = _Gen(query)
    body = gen.body()
    src = view_source(body)
    try:
        code = compile(src, f"<kanal view #{next(_counter)} FROM {query.topic}>", "exec")
    except (SyntaxError, RecursionError, MemoryError):  # Python's limits on nesting
        raise ViewSqlError("invalid SQL: statement nested too deeply") from None
    namespace = dict(gen.globals)
    exec(code, namespace)
    exprs = [x for c in query.columns for x in walk(c.expr)]
    if query.where is not None:
        exprs += walk(query.where)
    return Generated(
        fn=namespace["_view"],
        source=src,
        body=body,
        needs_value=gen.needs_value,
        needs_meta=any(isinstance(x, Meta) for x in exprs),
        uses_now=any(isinstance(x, Now) for x in exprs),
    )
