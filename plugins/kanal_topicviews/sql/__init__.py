"""The SQL of topic views: compile ``SELECT <fields> FROM <topic> [WHERE <condition>]`` once into one
generated Python function, run it on every record of a fetch.

API
---

``compile_view(statement) -> CompiledView`` (raises ``ViewSqlError`` naming what is unsupported)::

    view = compile_view("SELECT id, amount, customer.tier AS tier FROM orders "
                        "WHERE amount > 100 AND currency = 'EUR'")
    view.topic                      # 'orders', the physical topic
    ctx = now_context()             # once per fetch batch: the CURRENT_* values
    for rec in records:
        value = orjson.loads(rec.value) if view.needs_value else None
        meta = RecordMeta(rec.key, partition, offset, timestamp, rec.headers) if view.needs_meta else None
        out = view.transform(value, meta, ctx)   # may raise ViewRecordError -> onError
        if out is None: ...                      # filtered out (the offset becomes a gap)
        elif out is KEEP: ...                    # forward the original value bytes
        else: new_value = orjson.dumps(out)

``view.select_all`` is true when every kept record is ``KEEP`` (``SELECT *``), ``view.columns`` the
output field names, ``view.source`` the generated code. ``reference.evaluate`` is a slow AST-walking
interpreter of the same semantics, for tests.

The language
------------

* One statement: ``SELECT`` list, ``FROM`` one topic, optional ``WHERE``. A topic name with dashes
  is double-quoted (``FROM "my-topic"``); ``a.b`` is the topic ``a.b``. Refused, each with a message
  naming it: JOIN and several FROM sources, GROUP BY, HAVING, ORDER BY, LIMIT, OFFSET, DISTINCT,
  WITH, UNION/INTERSECT/EXCEPT, subqueries, window functions, CAST, ``||``, table aliases,
  aggregate and any other function (``unsupported function: SUBSTRING``), several statements, and
  any statement that is not a SELECT (DDL, DML).
* Names. Keywords and function names are case-insensitive. A name ``a``, ``a.b.c`` or ``$.a.b``
  is a path into the record value, which is a JSON object; field names are case-sensitive, as
  written, quoted (``"Amount"``) or not. ``a[0]`` indexes an array, ``a['x-y']`` is a member with
  any name. Double quotes make a name, single quotes a string: ``currency = "EUR"`` compares with
  the field ``EUR``.
* Record metadata (the words ``record``, ``key``... are case-insensitive, header names are not):
  ``record.key`` (the key as UTF-8 text), ``record.key.<path>`` (a path into the key parsed as
  JSON; NULL when the key is not JSON), ``record.partition``, ``record.offset``,
  ``record.timestamp`` (ms since the epoch), ``record.header.<name>`` or ``record.header['<name>']``
  (the value of the last header of that name, as UTF-8 text; invalid bytes become U+FFFD). A value
  field called ``record`` is reached as ``"record".x`` or ``$.record.x``.
* SELECT list: ``*`` (the output is the original value, bytes untouched); fields and expressions,
  optionally ``AS name``; ``*`` with more fields (the original members, then the new ones, which
  replace members of the same name). The output is a JSON object whose members follow the SELECT
  order; a member is named by its alias, else by the last name of its path (``customer.tier`` ->
  ``tier``, ``record.offset`` -> ``offset``, ``record.header.h`` -> ``h``); any other expression
  needs an alias; two outputs with one name are refused. A missing field gives ``null`` (the member
  is present).
* Expressions: literals (integers, decimals, ``'strings'``, TRUE, FALSE, NULL), paths, metadata,
  ``+ - * / %``, unary ``-``, ``= <> != < <= > >=``, ``AND OR NOT``, ``IN (...)``, ``NOT IN``,
  ``BETWEEN``, ``LIKE``, ``ILIKE``, ``NOT LIKE`` (``ESCAPE`` allowed), ``x REGEXP 're'``,
  ``REGEXP_LIKE(x, 're'[, 'flags'])``, ``IS [NOT] NULL``, ``IS [NOT] TRUE|FALSE``, ``CASE [x] WHEN
  ... THEN ... [ELSE ...] END``, ``CURRENT_TIMESTAMP``, ``CURRENT_DATE``, ``CURRENT_TIME``.

Semantics
---------

* Values are JSON values: NULL, boolean, number (integer or float, one kind), string, array,
  object; plus the temporal values of ``CURRENT_*``. A missing member, a step into something that
  is not an object (or array, for an index), an index out of range, and JSON ``null`` are all NULL.
  Evaluating never raises: every type problem gives NULL or FALSE as below.
* Three-valued logic: ``AND``, ``OR``, ``NOT`` follow SQL (``FALSE AND NULL`` is FALSE, ``TRUE OR
  NULL`` is TRUE, ``NOT NULL`` is NULL). WHERE keeps a record only when the condition is TRUE. A
  value used as a condition that is not a boolean counts as NULL.
* Comparisons: NULL on either side gives NULL. ``=`` / ``<>`` compare any two values: numbers by
  value (``1 = 1.0``), strings by code points, booleans with booleans, arrays and objects member by
  member; values of different kinds are not equal (``'1' = 1`` is FALSE, ``true = 1`` is FALSE).
  ``< <= > >=`` order two numbers, two strings (code-point order, case-sensitive) or two booleans
  (FALSE < TRUE); any other pair gives NULL. ``x IN (a, b)`` is ``x = a OR x = b`` (TRUE if one is
  equal, else NULL if x or an item is NULL, else FALSE). ``BETWEEN a AND b`` is ``>= a AND <= b``.
* Temporal values: ``CURRENT_TIMESTAMP`` is the instant, ``CURRENT_DATE`` midnight UTC of today,
  ``CURRENT_TIME`` the UTC time of day, all read once per batch (``now_context()``, ms precision).
  Compared with a number, they stand for ms since the epoch (the unit of ``record.timestamp``),
  ms since midnight for CURRENT_TIME. Compared with a string, the string is read as ISO-8601 (a
  date or a date-time, UTC unless it has an offset; a time for CURRENT_TIME); a string that does
  not parse is not equal and not ordered (NULL). In arithmetic they are their ms number
  (``record.timestamp > CURRENT_TIMESTAMP - 3600000``). Projected, they are ISO-8601 text
  (``2024-05-01T10:00:00.000Z``, ``2024-05-01``, ``10:00:00.000``).
* Arithmetic works on numbers only (else NULL): ``+ - *`` of integers are integers, ``/`` always
  divides exactly (a float), ``%`` keeps the dividend's sign; a zero divisor gives NULL; an integer
  result outside the 64-bit range becomes a float, a float result that is not finite becomes NULL.
* ``LIKE``: ``%`` any characters, ``_`` one character, the whole string must match,
  case-sensitive (``ILIKE``: case-insensitive). ``REGEXP``: Python ``re`` syntax, the pattern may
  match anywhere (anchor with ``^``/``$``), case-sensitive; ``REGEXP_LIKE`` flags ``i`` (ignore
  case), ``c`` (case-sensitive), ``m`` (multi-line), ``n``/``s`` (``.`` matches newlines). Patterns
  are literals, checked at compile time. A non-string operand gives NULL (no implicit conversion).
* Records: a view that reads the value (any value path, or ``*`` with more fields) needs a JSON
  object; any other value, a tombstone included, raises ``ViewRecordError`` so the caller applies
  ``onError``. ``SELECT *`` with a WHERE on metadata only never reads the value.
"""

from __future__ import annotations

from .errors import ViewRecordError, ViewSqlError
from .runtime import KEEP, RecordMeta, Temporal, ViewContext, now_context
from .view import CompiledView, compile_view

__all__ = [
    "KEEP",
    "CompiledView",
    "RecordMeta",
    "Temporal",
    "ViewContext",
    "ViewRecordError",
    "ViewSqlError",
    "compile_view",
    "now_context",
]
