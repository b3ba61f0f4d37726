"""Parse a view statement with sqlglot, check it against the supported subset, build the IR.

Everything outside the subset is refused with a ``ViewSqlError`` that names the construct
(``unsupported SQL: JOIN``, ``unsupported function: SUBSTRING``). The module docstring of
``kanal_topicviews.sql`` describes the accepted language.
"""

from __future__ import annotations

import math
import re

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError, TokenError

from .errors import ViewSqlError
from .ir import (
    And,
    Arith,
    ArithOp,
    Case,
    Cmp,
    CmpOp,
    Column,
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
    Scalar,
)

__all__ = ["like_regex", "parse_view"]

_CMP: dict[type[exp.Expression], CmpOp] = {
    exp.EQ: "=",
    exp.NEQ: "<>",
    exp.LT: "<",
    exp.LTE: "<=",
    exp.GT: ">",
    exp.GTE: ">=",
}
_ARITH: dict[type[exp.Expression], ArithOp] = {
    exp.Add: "+",
    exp.Sub: "-",
    exp.Mul: "*",
    exp.Div: "/",
    exp.Mod: "%",
}
_NOW: dict[type[exp.Expression], Now] = {
    exp.CurrentTimestamp: Now("timestamp"),
    exp.CurrentDate: Now("date"),
    exp.CurrentTime: Now("time"),
}
# Clauses of a SELECT other than the field list, FROM and WHERE, by sqlglot arg name.
_CLAUSES = {
    "with_": "WITH",
    "kind": "SELECT AS",
    "hint": "optimizer hint",
    "distinct": "DISTINCT",
    "into": "INTO",
    "operation_modifiers": "SELECT modifier",
    "exclude": "EXCLUDE",
    "match": "MATCH_RECOGNIZE",
    "laterals": "LATERAL",
    "joins": "JOIN",
    "connect": "CONNECT BY",
    "pivots": "PIVOT",
    "prewhere": "PREWHERE",
    "group": "GROUP BY",
    "having": "HAVING",
    "qualify": "QUALIFY",
    "windows": "WINDOW",
    "distribute": "DISTRIBUTE BY",
    "sort": "SORT BY",
    "cluster": "CLUSTER BY",
    "order": "ORDER BY",
    "limit": "LIMIT",
    "offset": "OFFSET",
    "locks": "FOR UPDATE",
    "sample": "TABLESAMPLE",
    "settings": "SETTINGS",
    "format": "FORMAT",
    "options": "OPTION",
    "for_": "FOR",
}
# Expression nodes refused with a readable name (anything else: its sqlglot name in capitals).
_NAMED: dict[type[exp.Expression], str] = {
    exp.Subquery: "subquery",
    exp.Select: "subquery",
    exp.Exists: "EXISTS (subquery)",
    exp.Window: "window function (OVER)",
    exp.Cast: "CAST",
    exp.TryCast: "TRY_CAST",
    exp.DPipe: "|| (string concatenation)",
    exp.Placeholder: "parameter placeholder",
    exp.Interval: "INTERVAL",
    exp.IntDiv: "DIV",
    exp.NullSafeEQ: "<=> (null-safe equality)",
    exp.Star: "* outside the SELECT list",
    exp.Array: "array literal",
    exp.Tuple: "row value",
    exp.BitwiseAnd: "& (bitwise and)",
    exp.BitwiseOr: "| (bitwise or)",
    exp.BitwiseXor: "^ (bitwise xor)",
    exp.BitwiseNot: "~ (bitwise not)",
    exp.SimilarTo: "SIMILAR TO",
}
_META_NAMES = ("record.key", "record.partition", "record.offset", "record.timestamp", "record.header.<name>")
_INT_RE = re.compile(r"[0-9]+")


def _unsupported(what: str, node: exp.Expression | None = None) -> ViewSqlError:
    if node is None:
        return ViewSqlError(f"unsupported SQL: {what}")
    return ViewSqlError(f"unsupported SQL: {what} (in `{node.sql()}`)")


def parse_view(statement: str) -> Query:
    """Parse and check one view statement; raise ``ViewSqlError`` naming what is not supported."""
    if not isinstance(statement, str) or not statement.strip():
        raise ViewSqlError("invalid SQL: empty statement")
    try:
        trees = [t for t in sqlglot.parse(statement) if t is not None]
    except ParseError as e:
        raise ViewSqlError(_parse_error_message(e)) from None
    except RecursionError:
        raise ViewSqlError("invalid SQL: statement nested too deeply") from None
    except TokenError:
        raise ViewSqlError("invalid SQL: cannot read the statement (an unterminated string or quoted name?)") from None
    except SqlglotError as e:
        raise ViewSqlError(f"invalid SQL: {_strip_ansi(str(e))}") from None
    if not trees:
        raise ViewSqlError("invalid SQL: empty statement")
    if len(trees) > 1:
        raise _unsupported("multiple statements")
    top = trees[0]
    if not isinstance(top, exp.Select):
        raise _unsupported(_statement_name(top))
    try:
        return _Builder().query(statement, top)
    except RecursionError:
        raise ViewSqlError("invalid SQL: statement nested too deeply") from None


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _parse_error_message(e: ParseError) -> str:
    if e.errors:
        err = e.errors[0]
        desc = _strip_ansi(str(err.get("description", ""))).split(" but got <Token")[0]
        missing = re.match(r"Required keyword: '\w+' missing for <class '[\w.]*\.(\w+)'>", desc)
        if missing:
            desc = f"incomplete {missing.group(1).upper()} clause"
        near = str(err.get("highlight") or "").strip()
        where = f" at line {err.get('line')}, column {err.get('col')}"
        return f"invalid SQL: {desc}{where}" + (f" near `{near}`" if near else "")
    return f"invalid SQL: {_strip_ansi(str(e)).splitlines()[0]}"


def _statement_name(top: exp.Expr) -> str:
    if isinstance(top, exp.Union):
        return "UNION"
    if isinstance(top, exp.Intersect):
        return "INTERSECT"
    if isinstance(top, exp.Except):
        return "EXCEPT"
    if isinstance(top, exp.Command):
        return f"{str(top.this).upper()} statement"
    name = {"truncatetable": "TRUNCATE", "altertable": "ALTER"}.get(top.key, top.key.upper())
    return f"{name} statement (only SELECT is accepted)"


def like_regex(pattern: str, escape: str | None = None, ignore_case: bool = False) -> re.Pattern[str]:
    """The regex of a LIKE pattern, for ``fullmatch``: ``%`` any run of characters, ``_`` one
    character, ``escape`` makes the next character literal."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if escape is not None and c == escape:
            if i + 1 >= n:
                raise ViewSqlError(f"invalid LIKE pattern {pattern!r}: ends with the escape character")
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    flags = re.DOTALL | (re.IGNORECASE if ignore_case else 0)
    return re.compile("".join(out), flags)


_REGEXP_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "n": re.DOTALL, "s": re.DOTALL}


def _regexp(pattern: str, flag_text: str) -> re.Pattern[str]:
    flags = 0
    for ch in flag_text:
        if ch == "c":
            flags &= ~re.IGNORECASE
        elif ch in _REGEXP_FLAGS:
            flags |= _REGEXP_FLAGS[ch]
        else:
            raise ViewSqlError(f"unsupported REGEXP_LIKE flag {ch!r} (supported: i, c, m, n, s)")
    try:
        return re.compile(pattern, flags)
    except re.error as e:
        raise ViewSqlError(f"invalid regular expression {pattern!r}: {e}") from None


class _Builder:
    def query(self, statement: str, sel: exp.Select) -> Query:
        for key, value in sel.args.items():
            if key in ("expressions", "from_", "where") or value in (None, False, []):
                continue
            raise _unsupported(_CLAUSES.get(key, key.rstrip("_").upper().replace("_", " ")))
        topic = self.topic(sel.args.get("from_"))
        star = False
        columns: list[Column] = []
        names: set[str] = set()
        for item in sel.expressions:
            if isinstance(item, exp.Star):
                if star:
                    raise _unsupported("* given twice")
                if item.args.get("except") or item.args.get("replace") or item.args.get("rename"):
                    raise _unsupported("* with modifiers", item)
                star = True
                continue
            col = self.column(item)
            if col.name in names:
                raise ViewSqlError(f"duplicate output field: {col.name!r} (give one of them another name with AS)")
            names.add(col.name)
            columns.append(col)
        where_node = sel.args.get("where")
        where = None if where_node is None else self.expr(where_node.this)
        return Query(statement=statement, topic=topic, star=star, columns=tuple(columns), where=where)

    def topic(self, from_: exp.Expression | None) -> str:
        if from_ is None:
            raise ViewSqlError("invalid SQL: missing FROM <topic>")
        table = from_.this
        if isinstance(table, exp.Subquery | exp.Select):
            raise _unsupported("subquery in FROM")
        if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
            raise _unsupported("FROM source other than a topic name", table)
        if table.args.get("alias") is not None:
            raise _unsupported("table alias", table)
        for key, value in table.args.items():
            if key not in ("this", "db", "catalog") and value not in (None, False, []):
                raise _unsupported(f"{key.upper()} on the FROM topic", table)
        return ".".join(p.name for p in table.parts)

    def column(self, item: exp.Expression) -> Column:
        if isinstance(item, exp.Alias):
            return Column(item.alias, self.expr(item.this))
        expr = self.expr(item)
        if isinstance(expr, Path) and isinstance(expr.parts[-1], str):
            return Column(expr.parts[-1], expr)
        if isinstance(expr, Meta):
            if expr.field == "header":
                return Column(expr.name, expr)
            if expr.field == "keyjson" and isinstance(expr.parts[-1], str):
                return Column(expr.parts[-1], expr)
            if expr.field != "keyjson":
                return Column(expr.field, expr)
        raise ViewSqlError(f"unsupported SQL: SELECT item without a name: `{item.sql()}` (add AS <name>)")

    # -- expressions

    def expr(self, node: exp.Expression) -> Expr:
        t = type(node)
        if t is exp.Paren:
            return self.expr(node.this)
        if t is exp.Literal:
            return Lit(_literal(node))
        if t is exp.Boolean:
            return Lit(bool(node.this))
        if t is exp.Null:
            return Lit(None)
        if t in (exp.Column, exp.Dot, exp.Bracket):
            return self.reference(node)
        if t in _CMP:
            return Cmp(_CMP[t], self.expr(node.this), self.expr(node.expression))
        if t is exp.And:
            return And(self.expr(node.this), self.expr(node.expression))
        if t is exp.Or:
            return Or(self.expr(node.this), self.expr(node.expression))
        if t is exp.Not:
            return Not(self.expr(node.this))
        if t is exp.Is:
            return self.is_(node)
        if t is exp.In:
            return self.in_(node)
        if t in (exp.Like, exp.ILike, exp.Escape):
            return self.like(node)
        if t is exp.RegexpLike:
            return self.regexp(node)
        if t is exp.Between:
            if node.args.get("symmetric"):
                raise _unsupported("BETWEEN SYMMETRIC", node)
            operand = self.expr(node.this)
            return And(
                Cmp(">=", operand, self.expr(node.args["low"])), Cmp("<=", operand, self.expr(node.args["high"]))
            )
        if t in _ARITH:
            return Arith(_ARITH[t], self.expr(node.this), self.expr(node.expression))
        if t is exp.Neg:
            inner = self.expr(node.this)
            if isinstance(inner, Lit) and type(inner.value) in (int, float):
                value = -inner.value  # type: ignore[operator]
                return Lit(float(value) if value < -(2**63) else value)
            return Neg(inner)
        if t is exp.Case:
            return self.case(node)
        if t in _NOW:
            if any(v not in (None, False, []) for v in node.args.values()):
                raise _unsupported(f"arguments of {node.sql().split('(')[0]}", node)
            return _NOW[t]
        raise self.refuse(node)

    def refuse(self, node: exp.Expression) -> ViewSqlError:
        for cls, name in _NAMED.items():
            if isinstance(node, cls):
                return _unsupported(name, node)
        if isinstance(node, exp.AggFunc):
            return ViewSqlError(f"unsupported aggregate function: {node.sql_name()}")
        if isinstance(node, exp.Anonymous):
            name = node.name.upper()
            hint = " (use CURRENT_TIMESTAMP)" if name in ("NOW", "SYSDATE", "GETDATE") else ""
            return ViewSqlError(f"unsupported function: {name}{hint}")
        if isinstance(node, exp.Func):
            return ViewSqlError(f"unsupported function: {node.sql_name()}")
        return _unsupported(node.key.upper(), node)

    def is_(self, node: exp.Expression) -> Expr:
        rhs = node.expression
        if isinstance(rhs, exp.Null):
            return IsNull(self.expr(node.this))
        if isinstance(rhs, exp.Boolean):
            return IsBool(self.expr(node.this), bool(rhs.this))
        raise _unsupported("IS with something other than NULL, TRUE or FALSE", node)

    def in_(self, node: exp.Expression) -> Expr:
        if node.args.get("query") is not None:
            raise _unsupported("subquery")
        for key in ("unnest", "field"):
            if node.args.get(key) is not None:
                raise _unsupported(f"IN {key.upper()}", node)
        items = node.expressions
        if not items:
            raise _unsupported("empty IN list", node)
        return In(self.expr(node.this), tuple(self.expr(i) for i in items))

    def like(self, node: exp.Expression) -> Expr:
        escape: str | None = None
        if isinstance(node, exp.Escape):
            esc = node.expression
            if not (isinstance(esc, exp.Literal) and esc.is_string and len(esc.this) == 1):
                raise _unsupported("ESCAPE other than a one-character string", node)
            escape = esc.this
            node = node.this
            if not isinstance(node, exp.Like | exp.ILike):
                raise _unsupported("ESCAPE without LIKE", node)
        ilike = isinstance(node, exp.ILike)
        op = "ILIKE" if ilike else "LIKE"
        pat = node.expression
        if not (isinstance(pat, exp.Literal) and pat.is_string):
            raise _unsupported(f"{op} with a pattern that is not a string literal", node)
        for key, value in node.args.items():
            if key not in ("this", "expression", "negate") and value not in (None, False, []):
                raise _unsupported(f"{op} {key.upper()}", node)
        m = Match(self.expr(node.this), like_regex(pat.this, escape, ilike), True, op)
        return Not(m) if node.args.get("negate") else m

    def regexp(self, node: exp.Expression) -> Expr:
        pat = node.expression
        if not (isinstance(pat, exp.Literal) and pat.is_string):
            raise _unsupported("REGEXP with a pattern that is not a string literal", node)
        flag = node.args.get("flag")
        flags = ""
        if flag is not None:
            if not (isinstance(flag, exp.Literal) and flag.is_string):
                raise _unsupported("REGEXP_LIKE flags that are not a string literal", node)
            flags = flag.this
        for key, value in node.args.items():
            if key not in ("this", "expression", "flag") and value not in (None, False, []):
                raise _unsupported(f"REGEXP {key.upper()}", node)
        return Match(self.expr(node.this), _regexp(pat.this, flags), False, "REGEXP")

    def case(self, node: exp.Expression) -> Expr:
        operand = node.args.get("this")
        whens: list[tuple[Expr, Expr]] = []
        for branch in node.args.get("ifs") or []:
            if not isinstance(branch, exp.If) or branch.args.get("false") is not None:
                raise _unsupported("CASE branch", branch)
            whens.append((self.expr(branch.this), self.expr(branch.args["true"])))
        default = node.args.get("default")
        return Case(
            None if operand is None else self.expr(operand),
            tuple(whens),
            None if default is None else self.expr(default),
        )

    # -- names

    def reference(self, node: exp.Expression) -> Expr:
        parts: list[tuple[PathPart, bool]] = _parts(node)  # (name or index, quoted)
        first, quoted = parts[0]
        if first == "$" and not quoted:
            if len(parts) == 1:
                raise _unsupported("$ without a field path (write SELECT * for the whole value)", node)
            return Path(tuple(p for p, _ in parts[1:]))
        if isinstance(first, str) and first.lower() == "record" and not quoted:
            return _meta(node, parts)
        return Path(tuple(p for p, _ in parts))


def _meta(node: exp.Expression, parts: list[tuple[PathPart, bool]]) -> Meta:
    known = ", ".join(_META_NAMES)
    if len(parts) == 1:
        raise ViewSqlError(f"unsupported SQL: `record` alone; name a metadata field: {known}")
    field, quoted = parts[1]
    name = field.lower() if isinstance(field, str) and not quoted else field
    rest = tuple(p for p, _ in parts[2:])
    if name == "key":
        return Meta("keyjson", parts=rest) if rest else Meta("key")
    if name in ("partition", "offset", "timestamp"):
        if rest:
            raise ViewSqlError(f"unknown record metadata: `{node.sql()}` (record.{name} has no fields)")
        return Meta(name)  # type: ignore[arg-type]
    if name == "header":
        if len(rest) != 1 or not isinstance(rest[0], str):
            raise ViewSqlError(
                f"unsupported SQL: `{node.sql()}`; write record.header.<name> or record.header['<name>']"
            )
        return Meta("header", name=rest[0])
    raise ViewSqlError(f"unknown record metadata: `{node.sql()}` (known: {known})")


def _parts(node: exp.Expression) -> list[tuple[PathPart, bool]]:
    if isinstance(node, exp.Column):
        if isinstance(node.this, exp.Star):
            raise _unsupported("qualified *", node)
        return [(i.name, bool(i.args.get("quoted"))) for i in node.parts]
    if isinstance(node, exp.Dot):
        right = node.expression
        if not isinstance(right, exp.Identifier) or not isinstance(node.this, exp.Column | exp.Dot | exp.Bracket):
            raise _unsupported("field access on an expression", node)
        return [*_parts(node.this), (right.name, bool(right.args.get("quoted")))]
    if isinstance(node, exp.Bracket):
        if not isinstance(node.this, exp.Column | exp.Dot | exp.Bracket) or len(node.expressions) != 1:
            raise _unsupported("subscript", node)
        sub = node.expressions[0]
        if isinstance(sub, exp.Literal) and sub.is_string:
            return [*_parts(node.this), (sub.this, True)]
        if isinstance(sub, exp.Literal) and _INT_RE.fullmatch(sub.this):
            return [*_parts(node.this), (int(sub.this), True)]
        raise _unsupported("subscript other than a string or a non-negative integer literal", node)
    raise _unsupported(node.key.upper(), node)


def _literal(node: exp.Expression) -> Scalar:
    text: str = node.this
    if node.args.get("is_string"):
        return text
    if _INT_RE.fullmatch(text):
        value = int(text)
        if value >= 2**64:
            raise ViewSqlError(f"number literal out of range: {text}")
        return value
    try:
        number = float(text)
    except ValueError:
        raise _unsupported(f"literal {text!r}", node) from None
    if not math.isfinite(number):
        raise ViewSqlError(f"number literal out of range: {text}")
    return number
