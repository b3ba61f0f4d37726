"""Kafka's ``ssl.principal.mapping.rules``: from a client certificate's subject to a principal.

The syntax and behaviour follow Kafka's SslPrincipalMapper, so an operator's existing rules work
unchanged: comma-separated rules, each ``DEFAULT`` (the whole subject) or
``RULE:pattern/replacement/[L|U]``. A rule applies when its pattern matches the whole subject;
the subject is then rewritten with the replacement (``$1`` back-references, ``\\`` escapes) and
optionally lower- or upper-cased. The first rule that applies gives the principal.

The rules see the subject as Java prints it (``X500Principal.getName()``, which Kafka uses), not as
other libraries do: rules written against a Kafka broker must meet the same text here.

Patterns are Python regular expressions, which agree with Java's for what such rules use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RULE = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(,\s*|$)")
_PARSER = re.compile(_RULE)
_DIGITS = "0123456789"


@dataclass(frozen=True, slots=True)
class _Template:
    parts: tuple[str | int, ...]  # literal text, or a group number

    def expand(self, match: re.Match[str]) -> str:
        return "".join(p if isinstance(p, str) else (match.group(p) or "") for p in self.parts)


def _template(replacement: str, groups: int, rule: str) -> _Template:
    """Java's replacement syntax as Kafka uses it: ``\\x`` is a literal x; ``$n`` is the longest
    group number its digits begin with (``$12`` with one group is group 1, then ``2``); a ``$n``
    whose first digit is beyond the pattern's groups stays literal text (Kafka escapes it)."""
    parts: list[str | int] = []
    text: list[str] = []
    i = 0
    while i < len(replacement):
        c = replacement[i]
        if c == "\\":
            if i + 1 == len(replacement):
                raise ValueError(f"Invalid rule: `{rule}`: the replacement ends with a lone `\\`")
            text.append(replacement[i + 1])
            i += 2
            continue
        if c != "$":
            text.append(c)
            i += 1
            continue
        if i + 1 == len(replacement) or replacement[i + 1] not in _DIGITS:
            raise ValueError(f"Invalid rule: `{rule}`: `$` must be followed by a group number")
        number = int(replacement[i + 1])
        j = i + 2
        if number > groups:
            if groups == 0:  # Kafka accepts it, then fails every client the rule applies to
                raise ValueError(f"Invalid rule: `{rule}`: `${number}` names a group, but the pattern has none")
            text.append("$")
            i += 1
            continue
        while j < len(replacement) and replacement[j] in _DIGITS and number * 10 + int(replacement[j]) <= groups:
            number = number * 10 + int(replacement[j])
            j += 1
        if text:
            parts.append("".join(text))
            text = []
        parts.append(number)
        i = j
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


# -- the subject as Java prints it ----------------------------------------------------------------

# The attribute types Java names in RFC 2253 form; any other is printed as its dotted OID.
_KEYWORDS = {
    "2.5.4.3": "CN",
    "2.5.4.6": "C",
    "2.5.4.7": "L",
    "2.5.4.8": "ST",
    "2.5.4.9": "STREET",
    "2.5.4.10": "O",
    "2.5.4.11": "OU",
    "0.9.2342.19200300.100.1.1": "UID",
    "0.9.2342.19200300.100.1.25": "DC",
}
# UTF8String, PrintableString, T61String, IA5String, GeneralString, BMPString: Java prints these
# as text; any other value (and any value of an unnamed type) as ``#`` and the hex of its DER.
_STRING_TAGS = frozenset({0x0C, 0x13, 0x14, 0x16, 0x1B, 0x1E})
_ESCAPED = frozenset(',=+<>#;"\\')
_SEQUENCE, _SET, _OID, _BMP_STRING = 0x30, 0x31, 0x06, 0x1E


def _tlv(der: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of contents, end) of the DER element at ``at``."""
    if at + 2 > len(der):
        raise ValueError("truncated DER")
    tag, length = der[at], der[at + 1]
    if tag & 0x1F == 0x1F:
        raise ValueError("unexpected high tag number in a certificate subject")
    start = at + 2
    if length & 0x80:
        count = length & 0x7F
        if not 1 <= count <= 4 or start + count > len(der):
            raise ValueError("bad DER length")
        length = int.from_bytes(der[start : start + count], "big")
        start += count
    end = start + length
    if end > len(der):
        raise ValueError("truncated DER")
    return tag, start, end


def _children(der: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(tag, element start, contents start, end) of each element between ``start`` and ``end``."""
    out = []
    while start < end:
        tag, contents, stop = _tlv(der, start)
        out.append((tag, start, contents, stop))
        start = stop
    return out


def _oid(data: bytes) -> str:
    arcs: list[int] = []
    value = 0
    for byte in data:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            arcs.append(value)
            value = 0
    if not arcs:
        raise ValueError("empty OID")
    first = min(arcs[0] // 40, 2)
    return ".".join(str(a) for a in [first, arcs[0] - 40 * first, *arcs[1:]])


def _value_text(raw: str) -> str:
    """Java's escaping of a text value (AVA.toRFC2253String): the special characters and NUL
    anywhere, spaces and carriage returns at either end."""
    chars = ["\\00" if c == "\0" else "\\" + c if c in _ESCAPED else c for c in raw]
    lead = 0
    while lead < len(chars) and chars[lead] in (" ", "\r"):
        lead += 1
    trail = len(chars) - 1
    while trail >= 0 and chars[trail] in (" ", "\r"):
        trail -= 1
    return "".join("\\" + c if i < lead or i > trail else c for i, c in enumerate(chars))


def _attribute(der: bytes, tag: int, start: int, end: int) -> str:
    fields = _children(der, start, end)
    if tag != _SEQUENCE or len(fields) != 2 or fields[0][0] != _OID:
        raise ValueError("bad attribute in a certificate subject")
    (_, _, oid_start, oid_end), (tag, value_at, value_start, value_end) = fields
    oid = _oid(der[oid_start:oid_end])
    keyword = _KEYWORDS.get(oid)
    if keyword is None or tag not in _STRING_TAGS:
        return f"{keyword or oid}=#{der[value_at:value_end].hex()}"
    # as current Java releases do (Java 17 read a BMPString's bytes as UTF-8 too)
    encoding = "utf-16-be" if tag == _BMP_STRING else "utf-8"
    return f"{keyword}={_value_text(der[value_start:value_end].decode(encoding, 'replace'))}"


def subject_of(der_certificate: bytes) -> str:
    """The subject of a DER certificate as Java's ``X500Principal.getName()`` gives it, which is the
    text Kafka's rules are matched against: RFC 2253, last RDN first (``CN=app,OU=team,O=corp``),
    types without an RFC 2253 keyword (an e-mail address...) as ``<oid>=#<hex of the DER value>``."""
    der = bytes(der_certificate)
    tag, start, _ = _tlv(der, 0)
    if tag != _SEQUENCE:
        raise ValueError("not a DER certificate")
    tbs_tag, tbs_start, tbs_end = _tlv(der, start)
    if tbs_tag != _SEQUENCE:
        raise ValueError("not a DER certificate")
    fields = _children(der, tbs_start, tbs_end)
    if fields and fields[0][0] == 0xA0:  # [0] version
        fields = fields[1:]
    # serialNumber, signature, issuer, validity, subject
    if len(fields) < 5 or fields[4][0] != _SEQUENCE:
        raise ValueError("not a DER certificate")
    _, _, name_start, name_end = fields[4]
    rdns = []
    for rdn_tag, _, rdn_start, rdn_end in _children(der, name_start, name_end):
        if rdn_tag != _SET:
            raise ValueError("bad RDN in a certificate subject")
        rdns.append("+".join(_attribute(der, t, s, e) for t, _, s, e in _children(der, rdn_start, rdn_end)))
    return ",".join(reversed(rdns))
