"""Regular expressions for CEL ``matches()``: RE2 syntax and semantics, run with Python ``re`` when that is exact
and cheap.

CEL's ``matches()`` is an unanchored search with RE2 syntax. RE2 (``google-re2``, a dependency of
cel-python) is the authority: a pattern RE2 rejects is a compile error of the rule. RE2 through its Python
binding costs about 3 µs per search; Python ``re`` about 0.1 µs, but it is a different engine:

* Syntax and meaning. A pattern is translated to Python ``re`` only when every token is in a small subset
  that means the same in both engines; anything else (flags, POSIX classes, ``\\p{..}``, ``\\Q..\\E``,
  ``\\z``, ``\\B``, octal escapes, ...) runs on the precompiled RE2 object. Translation details, RE2
  meaning first: ``$`` is end of text (Python's ``$`` also matches before a final newline), so it becomes
  ``\\Z``; ``\\d \\w \\b`` are ASCII (Python gets ``re.ASCII``); ``\\s`` is ``[\\t\\n\\f\\r ]`` (Python's
  includes ``\\v``), so it is spelled out; a ``{`` that does not open a well-formed ``{n}``, ``{n,}`` or
  ``{n,m}`` is a literal (RE2 reads ``{,n}`` literally, Python as a repetition), so it is escaped; ``[``
  inside a class and ``&|~`` are escaped so that Python's set-operation warnings cannot change meaning.
* Time. Python ``re`` backtracks, RE2 runs in linear time, and the searched text comes from producers: a
  pattern such as ``[a-z]+[a-z]+[0-9]`` takes seconds on a 1 KiB string in Python ``re``. So a pattern with
  a quantified group never runs on Python ``re``, and for the others the *degree* (the number of quantifiers
  that can backtrack over the text, plus one when the search is unanchored) bounds the text length that
  Python ``re`` may see: degree 0 or 1 any length, 2 up to 32 characters, 3 up to 8, more never. Longer
  texts go to RE2. A quantifier does not count when it repeats one character set and is followed by a
  literal outside that set (``[^@]+@``), nor when it is ``?`` or a small ``{n,m}``.

Both engines give the same answer on every pattern that reaches Python ``re``; only the speed differs.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import re2

__all__ = ["Matcher", "RegexError", "compile_matcher", "literal_texts", "translate"]

_RE2_OPTIONS: Any = re2.Options()
_RE2_OPTIONS.log_errors = False  # RE2 would print every rejected pattern to stderr through absl

# Longest text that Python ``re`` may search, by degree (see the module docstring); None means no limit.
_LENGTH_LIMITS: dict[int, int | None] = {0: None, 1: None, 2: 32, 3: 8}

Search = Callable[[str], Any]


class RegexError(ValueError):
    """The pattern is not valid RE2 syntax."""


@dataclass(frozen=True, slots=True)
class Matcher:
    """How one literal pattern is searched.

    ``python`` is the Python ``re`` search when the pattern is in the shared subset, used for texts of at
    most ``limit`` characters (None: any length); ``re2`` is always available and exact.
    """

    pattern: str
    re2: Search
    python: Search | None
    limit: int | None
    literals: frozenset[str] | None = None  # the pattern matches exactly these texts (see literal_texts)


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "atom" (one character or class), "open", "close", "alt", "quant", "bol", "eol"
    text: str  # Python re spelling
    counts: bool = False  # quant only: can backtrack over the text
    char: str | None = None  # atom only: the one literal character it matches, if it is a literal


_REPEAT = re.compile(r"\{([0-9]+)(?:(,)([0-9]*))?\}")
_HEX2 = re.compile(r"[0-9A-Fa-f]{2}")
_CLASS_ESCAPES = {"d": r"\d", "D": r"\D", "w": r"\w", "W": r"\W", "s": "\\t\\n\\f\\r "}
_TOP_ESCAPES = {"d": r"\d", "D": r"\D", "w": r"\w", "W": r"\W", "s": r"[\t\n\f\r ]", "S": r"[^\t\n\f\r ]"}
_ZERO_WIDTH_ESCAPES = {"b": r"\b", "A": r"\A"}
_CONTROL_ESCAPES = {"t": r"\t", "n": r"\n", "r": r"\r", "f": r"\f", "v": r"\v", "a": r"\a"}
_CONTROL_CHARS = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}


def _escape(p: str, i: int, *, in_class: bool) -> tuple[str, int, str | None] | None:
    """Translate the escape at ``p[i] == '\\\\'``: (Python text, next index, the literal character or None),
    or None (RE2 only)."""
    if i + 1 >= len(p):
        return None
    c = p[i + 1]
    table = _CLASS_ESCAPES if in_class else _TOP_ESCAPES
    if c in table:
        return table[c], i + 2, None
    if c in _CONTROL_ESCAPES:
        return _CONTROL_ESCAPES[c], i + 2, _CONTROL_CHARS[c]
    if c == "x":
        if _HEX2.fullmatch(p, i + 2, i + 4):
            return p[i : i + 4], i + 4, chr(int(p[i + 2 : i + 4], 16))
        return None  # \x{...}: RE2 only
    if c.isascii() and not c.isalnum() and c != "_":
        return "\\" + c, i + 2, c  # an escaped punctuation character is that character in both
    return None


def _char_class(p: str, i: int) -> tuple[str, int] | None:
    """Translate the class opening at ``p[i] == '['``."""
    n = len(p)
    out = ["["]
    j = i + 1
    if j < n and p[j] == "^":
        out.append("^")
        j += 1
    if j < n and p[j] == "]":  # a leading ] is a literal in both
        out.append(r"\]")
        j += 1
    while j < n:
        d = p[j]
        if d == "]":
            out.append("]")
            return "".join(out), j + 1
        if d == "\\":
            esc = _escape(p, j, in_class=True)
            if esc is None:
                return None
            out.append(esc[0])
            j = esc[1]
        elif d == "[":
            if j + 1 < n and p[j + 1] in ":.=":
                return None  # POSIX class [[:alpha:]] and friends
            out.append(r"\[")
            j += 1
        elif d in "&|~":
            out.append("\\" + d)
            j += 1
        elif d == "-" and j + 1 < n and p[j + 1] == "-":
            return None
        else:
            out.append(d)
            j += 1
    return None


def _tokens(p: str) -> list[_Token] | None:
    toks: list[_Token] = []
    i, n = 0, len(p)
    while i < n:
        c = p[i]
        if c == "\\":
            if i + 1 < n and p[i + 1] in _ZERO_WIDTH_ESCAPES:
                toks.append(_Token("bol" if p[i + 1] == "A" else "zero", _ZERO_WIDTH_ESCAPES[p[i + 1]]))
                i += 2
                continue
            esc = _escape(p, i, in_class=False)
            if esc is None:
                return None
            toks.append(_Token("atom", esc[0], char=esc[2]))
            i = esc[1]
        elif c == "[":
            cls = _char_class(p, i)
            if cls is None:
                return None
            toks.append(_Token("atom", cls[0]))
            i = cls[1]
        elif c == "^":
            toks.append(_Token("bol", "^"))
            i += 1
        elif c == "$":
            toks.append(_Token("eol", r"\Z"))
            i += 1
        elif c == "(":
            if p.startswith("(?:", i):
                toks.append(_Token("open", "(?:"))
                i += 3
            elif p.startswith("(?P<", i):
                end = p.find(">", i)
                if end < 0:
                    return None
                toks.append(_Token("open", p[i : end + 1]))
                i = end + 1
            elif p.startswith("(?", i):
                return None  # flags and (?<name>..) are RE2 only; lookaround is rejected by RE2 anyway
            else:
                toks.append(_Token("open", "("))
                i += 1
        elif c == ")":
            toks.append(_Token("close", ")"))
            i += 1
        elif c == "|":
            toks.append(_Token("alt", "|"))
            i += 1
        elif c in "*+?":
            text = c
            i += 1
            if i < n and p[i] == "?":
                text += "?"
                i += 1
            toks.append(_Token("quant", text, counts=c != "?"))
        elif c == "{":
            m = _REPEAT.match(p, i)
            if m is None:
                toks.append(_Token("atom", r"\{", char="{"))
                i += 1
                continue
            low, comma, high = m.group(1), m.group(2), m.group(3)
            counts = bool(comma) and (not high or int(high) - int(low) > 3)
            text = m.group()
            i = m.end()
            if i < n and p[i] == "?":
                text += "?"
                i += 1
            toks.append(_Token("quant", text, counts=counts))
        elif c == "}":
            toks.append(_Token("atom", r"\}", char="}"))
            i += 1
        elif c == ".":
            toks.append(_Token("atom", "."))
            i += 1
        else:
            toks.append(_Token("atom", re.escape(c), char=c))
            i += 1
    return toks


def _disjoint(atom: str, char: str) -> bool:
    """Whether the one-character ``atom`` can never match ``char``."""
    try:
        return re.compile(atom, re.ASCII).fullmatch(char) is None
    except re.error:
        return False


def translate(pattern: str) -> tuple[str, int] | None:
    """The Python ``re`` spelling of an RE2 pattern (for ``re.ASCII``) and its degree, or None when the
    pattern uses anything outside the shared subset or quantifies a group."""
    toks = _tokens(pattern)
    if toks is None:
        return None
    counted = 0
    for k, tok in enumerate(toks):
        if tok.kind != "quant":
            continue
        prev = toks[k - 1] if k else None
        if prev is None or prev.kind != "atom":
            return None  # a quantified group, anchor or nothing: RE2 only
        if not tok.counts:
            continue
        nxt = toks[k + 1] if k + 1 < len(toks) else None
        if nxt is not None and nxt.char is not None and not tok.text.endswith("?") and _disjoint(prev.text, nxt.char):
            continue
        counted += 1
    depth, top_level_alt = 0, False
    for tok in toks:
        depth += (tok.kind == "open") - (tok.kind == "close")
        top_level_alt = top_level_alt or (tok.kind == "alt" and depth == 0)
    anchored = bool(toks) and toks[0].kind == "bol" and not top_level_alt
    degree = counted + (0 if anchored else 1)
    return "".join(t.text for t in toks), degree


_SPECIAL = frozenset("\\.+*?()[]{}|^$")


def literal_texts(pattern: str) -> frozenset[str] | None:
    """The texts a pattern matches when it is ``^lit$``, ``^(lit|lit|...)$`` or ``^(?:lit|...)$`` with
    plain literals (ordinary characters, escaped punctuation), else None.

    In RE2 ``^`` and ``$`` are the start and end of the text, so such a pattern matches exactly its
    literals: a set membership test gives the same answer as the search.
    """
    if len(pattern) < 2 or pattern[0] != "^" or pattern[-1] != "$":
        return None
    body = pattern[1:-1]
    if body.startswith("(?:") and body.endswith(")"):
        body, grouped = body[3:-1], True
    elif body.startswith("(") and not body.startswith("(?") and body.endswith(")"):
        body, grouped = body[1:-1], True
    else:
        grouped = False
    texts: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            if i + 1 >= len(body) or not body[i + 1].isascii() or body[i + 1].isalnum() or body[i + 1] == "_":
                return None  # a class (\\d), a control character, or a trailing backslash (an escaped $)
            current.append(body[i + 1])
            i += 2
            continue
        if c == "|" and grouped:
            texts.append("".join(current))
            current = []
        elif c in _SPECIAL:
            return None
        else:
            current.append(c)
        i += 1
    texts.append("".join(current))
    return frozenset(texts)


def compile_matcher(pattern: str) -> Matcher:
    """Compile a literal RE2 pattern for ``matches()``. Raises RegexError when RE2 rejects it."""
    try:
        compiled_re2: Any = re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        arg = exc.args[0] if exc.args else ""
        detail = arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)
        raise RegexError(f"invalid regular expression {pattern!r}: {detail}") from None
    re2_search: Search = compiled_re2.search
    translated = translate(pattern)
    if translated is not None and translated[1] in _LENGTH_LIMITS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                python: Search = re.compile(translated[0], re.ASCII).search
        except (re.error, Warning, RecursionError, OverflowError):
            pass
        else:
            limit = _LENGTH_LIMITS[translated[1]]
            return Matcher(pattern, re2_search, python, limit, literal_texts(pattern))
    return Matcher(pattern, re2_search, None, 0)
