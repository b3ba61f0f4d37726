"""Kafka's ``ssl.principal.mapping.rules``: from a client certificate's subject to a principal.

The syntax and behaviour follow Kafka's SslPrincipalMapper, so an operator's existing rules work
unchanged: comma-separated rules, each ``DEFAULT`` (the whole subject) or
``RULE:pattern/replacement/[L|U]``. A rule applies when its pattern matches the whole subject;
the subject is then rewritten with the replacement (``$1`` back-references, ``\\`` escapes) and
optionally lower- or upper-cased. The first rule that applies gives the principal.

Patterns are Python regular expressions, which agree with Java's for what such rules use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cryptography import x509

_RULE = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(,\s*|$)")
_PARSER = re.compile(_RULE)


@dataclass(frozen=True, slots=True)
class _Template:
    parts: tuple[str | int, ...]  # literal text, or a group number

    def expand(self, match: re.Match[str]) -> str:
        return "".join(p if isinstance(p, str) else (match.group(p) or "") for p in self.parts)


def _template(replacement: str, groups: int, rule: str) -> _Template:
    """Java's replacement syntax: ``\\x`` is a literal x, ``$n`` a group; Kafka keeps a ``$n``
    beyond the pattern's groups as literal text."""
    parts: list[str | int] = []
    text: list[str] = []
    i = 0
    while i < len(replacement):
        c = replacement[i]
        if c == "\\" and i + 1 < len(replacement):
            text.append(replacement[i + 1])
            i += 2
            continue
        if c == "$":
            j = i + 1
            while j < len(replacement) and replacement[j].isdigit():
                j += 1
            if j == i + 1:
                raise ValueError(f"Invalid rule: `{rule}`: `$` must be followed by a group number")
            number = int(replacement[i + 1 : j])
            if number > groups:
                text.append(replacement[i:j])
            else:
                if text:
                    parts.append("".join(text))
                    text = []
                parts.append(number)
            i = j
            continue
        text.append(c)
        i += 1
    if text:
        parts.append("".join(text))
    return _Template(tuple(parts))


@dataclass(frozen=True, slots=True)
class Rule:
    """One parsed rule; ``pattern`` None is DEFAULT."""

    text: str
    pattern: re.Pattern[str] | None = None
    replacement: _Template | None = None
    case: str = ""  # "L", "U" or ""

    def apply(self, subject: str) -> str | None:
        """The principal this rule gives for ``subject``, or None when it does not apply."""
        if self.pattern is None or self.replacement is None:
            return subject
        if self.pattern.fullmatch(subject) is None:
            return None
        result = self.pattern.sub(self.replacement.expand, subject)
        if self.case == "L":
            return result.lower()
        if self.case == "U":
            return result.upper()
        return result


def parse_rules(rules: str | None) -> tuple[Rule, ...]:
    """Parses a rule list (None or blank: ``DEFAULT``); ValueError naming a bad rule."""
    if rules is None or not rules.strip():
        rules = "DEFAULT"
    parsed: list[Rule] = []
    for found in _SPLITTER.finditer(rules.strip()):
        text = found.group(1)
        match = _PARSER.match(text)
        if match is None or match.end() != len(text):
            rest = text[match.end() :] if match is not None else text
            raise ValueError(f"Invalid rule: `{text}`, unmatched substring: `{rest}`")
        if match.group(1) is not None:
            parsed.append(Rule(text))
        elif match.group(2) is not None:
            try:
                pattern = re.compile(match.group(2))
            except re.error as exc:
                raise ValueError(f"Invalid rule: `{text}`: bad pattern ({exc})") from None
            template = _template(match.group(4), pattern.groups, text)
            parsed.append(Rule(text, pattern, template, match.group(6)))
        # an empty rule (between two commas, or at the end) is ignored, as Kafka does
    if not parsed:
        raise ValueError(f"no rule in {rules!r}")
    return tuple(parsed)


def principal_for(subject: str, rules: tuple[Rule, ...]) -> str | None:
    """The principal of the first rule that applies, or None (Kafka refuses such a client)."""
    for rule in rules:
        principal = rule.apply(subject)
        if principal is not None:
            return principal
    return None


def subject_of(der_certificate: bytes) -> str:
    """The subject of a DER certificate as an RFC 2253 string (``CN=app,OU=team,O=corp``), the form
    Kafka's rules are written against."""
    return x509.load_der_x509_certificate(der_certificate).subject.rfc4514_string()
