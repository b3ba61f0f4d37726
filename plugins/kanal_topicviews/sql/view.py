"""``compile_view``: statement in, ``CompiledView`` out (parse and check, then generate code)."""

from __future__ import annotations

from typing import Any

from .codegen import Body, TransformFn, generate
from .errors import ViewSqlError
from .ir import Query
from .parse import parse_view

__all__ = ["CompiledView", "compile_view"]


class CompiledView:
    """One compiled view statement. Build with ``compile_view``; immutable once built.

    ``transform(value, meta, ctx)`` is the generated function itself (an attribute, so calling it
    costs one call): ``value`` is the parsed record value (``orjson.loads``), ``meta`` a
    ``RecordMeta`` (may be None when ``needs_meta`` is false), ``ctx`` the batch's
    ``now_context()`` (may be None when ``uses_now`` is false). It returns

    * ``None``: the record is filtered out (its offset stays a gap in the view);
    * ``KEEP``: keep the record with its original value bytes (``SELECT *``);
    * a ``dict``: the projected value, to serialize with ``orjson.dumps``.

    It raises ``ViewRecordError`` when the view reads the value and the value is not a JSON object;
    the caller applies ``onError`` to that record (as to a value that is not JSON at all).

    ``body`` is the same code in parts, for loops that inline it (``kanal_topicviews.fastloop``).
    """

    __slots__ = (
        "body",
        "columns",
        "needs_meta",
        "needs_value",
        "query",
        "select_all",
        "source",
        "statement",
        "topic",
        "transform",
        "uses_now",
    )

    statement: str
    topic: str
    columns: tuple[str, ...]
    select_all: bool
    needs_value: bool
    needs_meta: bool
    uses_now: bool
    source: str
    query: Query
    transform: TransformFn
    body: Body

    def __init__(self, query: Query) -> None:
        gen = generate(query)
        self.query = query
        self.statement = query.statement
        self.topic = query.topic
        self.columns = tuple(c.name for c in query.columns)
        self.select_all = query.star and not query.columns
        self.needs_value = gen.needs_value
        self.needs_meta = gen.needs_meta
        self.uses_now = gen.uses_now
        self.source = gen.source
        self.transform = gen.fn
        self.body = gen.body

    def __repr__(self) -> str:
        return f"CompiledView({self.statement!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return compile_view, (self.statement,)


def compile_view(statement: str) -> CompiledView:
    """Parse, check and compile a view statement. Raises ``ViewSqlError`` (message fit for a 400,
    naming the unsupported construct). Costs about a millisecond: cache the result per view."""
    query = parse_view(statement)
    try:
        return CompiledView(query)
    except RecursionError:
        raise ViewSqlError("invalid SQL: statement nested too deeply") from None
