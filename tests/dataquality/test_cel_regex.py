"""matches(): RE2 patterns translated to Python re must give RE2's answer; everything else stays on RE2."""

from __future__ import annotations

from typing import Any

import pytest
import re2
from hypothesis import event, given, settings
from hypothesis import strategies as st
from kanal_dataquality.cel._regex import RegexError, compile_matcher, literal_texts, translate

_OPTIONS: Any = re2.Options()
_OPTIONS.log_errors = False


def re2_search(pattern: str, text: str) -> bool:
    return re2.compile(pattern, _OPTIONS).search(text) is not None


@pytest.mark.parametrize(
    ("pattern", "python", "degree"),
    [
        ("^(EUR|USD|GBP)$", r"^(EUR|USD|GBP)\Z", 0),
        ("^ord-[0-9]+$", r"^ord\-[0-9]+\Z", 1),
        ("^[A-Z]{3}$", r"^[A-Z]{3}\Z", 0),
        (r"^[^@]+@[^@]+\.[a-z]+$", r"^[^@]+@[^@]+\.[a-z]+\Z", 2),  # [^@]+@ cannot backtrack
        ("[a-z]+[a-z]+[0-9]", "[a-z]+[a-z]+[0-9]", 3),
        (r"\s+", r"[\t\n\f\r ]+", 2),
        (r"[\s,]", "[\\t\\n\\f\\r ,]", 1),
        ("a{,3}", r"a\{,3\}", 1),  # RE2 reads {,3} literally
        ("x|^y", r"x|^y", 1),  # a top-level alternative is not anchored
    ],
)
def test_translation(pattern: str, python: str, degree: int) -> None:
    assert translate(pattern) == (python, degree)


@pytest.mark.parametrize(
    "pattern",
    [
        "(?i)abc",  # flags
        "(?s).",
        r"\pL",  # Unicode classes
        "[[:alpha:]]",  # POSIX classes
        r"\Qa.b\E",
        r"a\z",
        r"\B",
        r"\x{41}",
        r"\101",
        "(a+)+b",  # a quantified group: exponential in Python re
        "(ab)*",
        "(?<name>a)",
    ],
)
def test_re2_only_patterns(pattern: str) -> None:
    assert translate(pattern) is None
    matcher = compile_matcher(pattern)
    assert matcher.python is None


def test_length_limits_follow_the_degree() -> None:
    assert compile_matcher("^ord-[0-9]+$").limit is None
    assert compile_matcher("x.*y").limit == 32
    assert compile_matcher("[a-z]+[a-z]+[0-9]").limit == 8
    assert compile_matcher("a+b+c+d").limit is None  # each + is followed by a character it cannot match
    assert compile_matcher("a.*b.*c.*d").python is None  # degree 4: RE2 only


@pytest.mark.parametrize("pattern", ["(a", "a**", r"a\1", "(?=a)", "(?<!a)b", r"\e", "a{1001}", "[z-a]"])
def test_invalid_patterns(pattern: str) -> None:
    with pytest.raises(RegexError, match="invalid regular expression"):
        compile_matcher(pattern)


_ATOMS = st.sampled_from(
    ["a", "b", "-", r"\.", ".", "[ab]", "[^a]", "[a-c]", r"\d", r"\w", r"\s", r"\S", r"\D", r"\W", "[\\s-]", "é", "{"]
)
_QUANTIFIERS = st.sampled_from(["", "", "", "*", "+", "?", "{2}", "{1,3}", "{,2}", "*?", "+?", "{2,}"])
_PIECES = st.one_of(
    st.tuples(_ATOMS, _QUANTIFIERS).map("".join),
    st.sampled_from(["^", "$", r"\b", r"\A", "|"]),
    st.lists(st.tuples(_ATOMS, _QUANTIFIERS).map("".join), min_size=1, max_size=3).map(
        lambda parts: "(" + "|".join(parts) + ")"
    ),
    st.lists(_ATOMS, min_size=1, max_size=2).map(lambda parts: "(?:" + "".join(parts) + ")"),
)
PATTERNS = st.lists(_PIECES, min_size=1, max_size=6).map("".join)
TEXTS = st.text(alphabet="ab-.\n 1_é\t\v{},", max_size=12)


@settings(max_examples=400, deadline=None)
@given(pattern=PATTERNS, texts=st.lists(TEXTS, min_size=1, max_size=8))
def test_python_re_agrees_with_re2(pattern: str, texts: list[str]) -> None:
    try:
        re2.compile(pattern, _OPTIONS)
    except re2.error:
        with pytest.raises(RegexError):
            compile_matcher(pattern)
        event("invalid RE2")
        return
    matcher = compile_matcher(pattern)
    event("python re" if matcher.python is not None else "re2 only")
    for text in texts:
        expected = re2_search(pattern, text)
        assert (matcher.re2(text) is not None) is expected
        if matcher.python is not None and (matcher.limit is None or len(text) <= matcher.limit):
            assert (matcher.python(text) is not None) is expected, (pattern, translate(pattern), text)
        if matcher.literals is not None:
            assert (text in matcher.literals) is expected, (pattern, matcher.literals, text)


@pytest.mark.parametrize(
    ("pattern", "texts"),
    [
        ("^(EUR|USD|GBP)$", {"EUR", "USD", "GBP"}),
        ("^(?:a|b-c)$", {"a", "b-c"}),
        ("^web$", {"web"}),
        (r"^a\.b$", {"a.b"}),
        ("^$", {""}),
        ("^(|x)$", {"", "x"}),
        ("^a|b$", None),  # ^a, or b$: not anchored on both sides
        ("^(a)|(b)$", None),
        ("^(a|b)c$", None),
        (r"^a\$", None),  # an escaped $ is a literal, not the end
        (r"^\d$", None),
        ("^a.$", None),
        ("^a+$", None),
        ("^(?i)a$", None),
        ("EUR", None),
    ],
)
def test_literal_texts(pattern: str, texts: set[str] | None) -> None:
    assert literal_texts(pattern) == (None if texts is None else frozenset(texts))
    matcher = compile_matcher(pattern)
    assert matcher.literals == literal_texts(pattern)
    for text in ("EUR", "EURO", "a", "b-c", "web", "a.b", "axb", "", "x", "ac", "a$", "a\n"):
        if texts is not None:
            assert (text in texts) is re2_search(pattern, text), (pattern, text)
