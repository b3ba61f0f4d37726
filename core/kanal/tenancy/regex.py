"""Regular expressions over names, scoped to one virtual cluster.

A client's regex R (a KIP-848 subscription, a ListTransactions filter) is written against logical
names; the broker matches it against physical names. It is sent as::

    re.escape(prefix) + "(?:" + R' + ")"

where R' is R without its start-of-name anchors (``^``, ``\\A``). Kafka matches these regexes
against the whole name (RE2J's ``matches()``, a full match), so a physical name ``prefix + t``
matches the scoped regex exactly when its first characters are the literal prefix and the rest,
``t``, fully matches R': the tenant's names that matched before still match, and a name without the
prefix (another tenant's, an internal topic) can never match. The non-capturing group keeps R's
alternatives inside it (``a|b`` must not become ``prefix a | b``). The anchors go because the start
of the logical name is no longer the start of the string: ``^orders.*`` must still match
``team-a.orders-1``. They are dropped, not moved, so an anchor R placed where nothing can precede it
keeps its meaning, and one placed elsewhere (``a*^b``, which could only match ``b``) now matches more
names, all of them still the tenant's. Likewise a word-boundary assertion at the very start of R
sees the prefix's last character.

A blank regex is left as it is: Kafka reads an empty ListTransactions pattern as "no filter" (the
response is scoped anyway) and refuses a blank subscription regex, which it must still see blank.

R must be a complete regex on its own, or it could close the group and add an alternative that
matches everything (``)|(.*``): R and R' are parsed with RE2, the syntax Kafka uses, and refused
when they do not parse. The broker answers the same error for such a regex, so clients see no
difference.
"""

from __future__ import annotations

import re
from functools import cache

import re2

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a client's bad regex is an answer to the client, not a log line


class InvalidRegex(ValueError):
    """The client's regex does not parse: the request is answered with INVALID_REGULAR_EXPRESSION."""


@cache
def _opening(prefix: str) -> str:
    return re.escape(prefix) + "(?:"


def _check(regex: str) -> None:
    try:
        re2.compile(regex, _OPTIONS)
    except re2.error as e:
        why = e.args[0] if e.args else ""
        if isinstance(why, bytes):
            why = why.decode("utf-8", "replace")
        raise InvalidRegex(f"regular expression {regex!r} is not valid: {why}") from None


def _without_start_anchors(regex: str) -> str:
    """R with every ``^`` and ``\\A`` outside character classes, escapes and ``\\Q...\\E`` removed."""
    if "^" not in regex and "\\A" not in regex:
        return regex
    out: list[str] = []
    i, n = 0, len(regex)
    while i < n:
        c = regex[i]
        if c == "\\":
            end = _escape_end(regex, i)
            if regex[i : i + 2] != "\\A":
                out.append(regex[i:end])
            i = end
        elif c == "[":
            end = _class_end(regex, i)
            out.append(regex[i:end])
            i = end
        else:
            if c != "^":
                out.append(c)
            i += 1
    return "".join(out)


def _escape_end(regex: str, i: int) -> int:
    """Where the escape starting at ``regex[i] == '\\'`` ends."""
    kind = regex[i + 1 : i + 2]
    if kind == "Q":  # literal text up to \E (or the end)
        close = regex.find("\\E", i + 2)
        return len(regex) if close < 0 else close + 2
    if kind in ("p", "P") and regex[i + 2 : i + 3] == "{":  # \p{Greek}, \p{^Greek}
        close = regex.find("}", i + 3)
        return len(regex) if close < 0 else close + 1
    return min(i + 2, len(regex))


def _class_end(regex: str, i: int) -> int:
    """Where the character class starting at ``regex[i] == '['`` ends (after its ``]``)."""
    j = i + 1
    if regex[j : j + 1] == "^":
        j += 1
    if regex[j : j + 1] == "]":  # a leading ] is a literal
        j += 1
    n = len(regex)
    while j < n:
        c = regex[j]
        if c == "\\":
            j = _escape_end(regex, j)
        elif c == "[" and regex[j + 1 : j + 2] == ":":  # [:alpha:]
            close = regex.find(":]", j + 2)
            j = n if close < 0 else close + 2
        elif c == "]":
            return j + 1
        else:
            j += 1
    return n


def to_physical(regex: str, prefix: str) -> str:
    """The regex matching the physical names of the logical names ``regex`` matches.

    Raises :class:`InvalidRegex` when ``regex`` does not parse on its own.
    """
    if not regex.strip():
        return regex
    _check(regex)
    scoped = _without_start_anchors(regex)
    if scoped is not regex:
        _check(scoped)  # what goes inside the group must be complete on its own too
    return _opening(prefix) + scoped + ")"


def to_logical(regex: str, prefix: str) -> str | None:
    """The client's regex back from its scoped form, or None when it was not scoped by us."""
    opening = _opening(prefix)
    if regex.startswith(opening) and regex.endswith(")"):
        return regex[len(opening) : -1]
    return None
