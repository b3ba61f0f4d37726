"""The two errors of the view SQL compiler: one for statements, one for records."""

from __future__ import annotations


class ViewSqlError(ValueError):
    """The statement is not valid view SQL. The message names the construct, fit for an HTTP 400:
    ``unsupported SQL: JOIN``, ``unsupported function: SUBSTRING``, ``invalid SQL: ...``."""


class ViewRecordError(ValueError):
    """A record cannot be transformed by a view (its value is not a JSON object while the view
    reads the value). The caller applies the view's ``onError`` (DROP or FAIL_FETCH)."""
