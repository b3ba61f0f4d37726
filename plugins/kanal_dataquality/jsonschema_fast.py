"""A JSON schema as one generated Python expression: the record loop's check for common schemas.

jsonschema-rs costs about 0.5 to 1.4 µs per record in the record loop, much of it converting the Python
value; a plain Python expression over the value orjson just produced, pasted into the loop, costs less
for the schemas producers usually write (types, required and known properties, bounds, lengths,
enums, simple patterns): about half for the benchmark's 4-property schema, a fifth less for an 8-property
order schema with a pattern. Called as a function instead, it would not beat jsonschema-rs; the
loop calls ``is_valid`` when it cannot paste the check.

The check is *one-sided*: it returns True only when the value conforms; False or an exception means
"not decided here", and the rule's ``evaluate`` (jsonschema-rs) decides. So the check may be stricter
than the schema (``1.0`` is an integer for JSON schema, not for the check), never looser. A schema
with anything outside the subset below gets no check at all (``generate_check`` returns None).

Subset (every draft the rule engine accepts): boolean schemas; ``type``; ``enum`` and ``const`` of
strings, numbers, booleans and null; ``minimum``, ``maximum``, ``exclusiveMinimum``,
``exclusiveMaximum`` (draft-04's boolean form too); ``minLength``, ``maxLength`` (code points, as
Python's ``len``); ``pattern`` when its Python ``re`` spelling means the same (see :func:`_pattern`);
``required``, ``properties``, ``additionalProperties`` (a boolean), ``minProperties``,
``maxProperties``; ``items`` (one schema), ``minItems``, ``maxItems``, ``uniqueItems: false``; and
the annotations that never assert (``title``, ``description``, ``$comment``, ``$defs`` ...;
``format`` in 2019-09 and 2020-12, where it is an annotation).

Inputs are values as the record loop decodes them (orjson: dict with str keys, list, str, int, float,
bool, None; no lone surrogates). Numbers compare exactly across int and float, as jsonschema-rs does
for bounds and enum members below 2**53 in magnitude (the only ones the check takes).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kanal_dataquality.cel._regex import translate

__all__ = ["SchemaCheck", "generate_check"]

_ANNOTATIONS = frozenset(
    {
        "$schema",
        "$id",
        "$comment",
        "$defs",
        "$anchor",
        "definitions",
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
_FORMAT_IS_ANNOTATION = frozenset({"2019-09", "2020-12"})
_TYPES: dict[str, tuple[type, ...]] = {
    "null": (type(None),),
    "boolean": (bool,),
    "string": (str,),
    "object": (dict,),
    "array": (list,),
    "number": (int, float),
    "integer": (int,),
}
_EXACT = 2**53
_BUILTINS = (len, all, map, dict, list, str, int, float, bool)
_NUMERIC = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
_STRING = frozenset({"minLength", "maxLength", "pattern"})
_OBJECT = frozenset({"required", "properties", "additionalProperties", "minProperties", "maxProperties"})
_ARRAY = frozenset({"items", "minItems", "maxItems", "uniqueItems"})
_GENERIC = frozenset({"type", "enum", "const"})
# The longest text Python ``re`` may search, by the pattern's degree (as for CEL's matches()).
_LENGTH_LIMITS: dict[int, int | None] = {0: None, 1: None, 2: 32, 3: 8}
# Escapes whose meaning is not the same in Python ``re`` (ASCII) and in jsonschema-rs: \S and \s in a
# class (Python's is narrower, so a negated one is wider), word boundaries.
_UNSAFE_ESCAPES = frozenset("SbBpP")


class _Unsupported(Exception):
    pass


@dataclass(frozen=True, slots=True)
class SchemaCheck:
    """The generated check: ``function(value)`` is True only when ``value`` conforms.

    ``source`` is ``lambda value: <expression>``; ``function.__globals__`` holds what it refers to (the
    record loop inlines the expression with those names).
    """

    source: str
    function: Callable[[Any], Any]


def generate_check(schema: Mapping[str, Any] | bool, draft: str) -> SchemaCheck | None:
    """The check of a schema already validated against its meta-schema, or None (outside the subset)."""
    gen = _Gen(draft)
    try:
        body = gen.schema(schema, "value", "value")
        source = f"lambda value: {body}"
        namespace = gen.namespace()
        function = eval(compile(source, "<json schema check>", "eval"), namespace)
    except Exception:  # outside the subset, or a shape the generator does not expect: jsonschema-rs decides
        return None
    return SchemaCheck(source, function)


class _Gen:
    def __init__(self, draft: str) -> None:
        self.draft = draft
        self.consts: dict[str, Any] = {"_N": (int, float)}
        self.counter = 0

    def name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def const(self, obj: Any) -> str:
        n = self.name("_s")
        self.consts[n] = obj
        return n

    def schema(self, schema: Any, first: str, ref: str) -> str:
        """Code that is True when the value conforms. ``first`` is how the value is spelled where it is
        evaluated first (it may bind ``ref`` with ``:=``), ``ref`` everywhere after."""
        if schema is True:
            return "True"
        if schema is False:
            return "False"
        if not isinstance(schema, Mapping):
            raise _Unsupported("not a schema")
        allowed = _GENERIC | _NUMERIC | _STRING | _OBJECT | _ARRAY | _ANNOTATIONS
        for keyword in schema:
            if keyword == "format" and self.draft in _FORMAT_IS_ANNOTATION:
                continue
            if keyword not in allowed:
                raise _Unsupported(keyword)
        parts: list[str] = []
        spell = _Spelling(first, ref)  # every group test below comes after a part that evaluated the value
        classes: tuple[type, ...] | None = None  # the classes the value may have once ``type`` held
        if "type" in schema:
            names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            found: list[type] = []
            for t in names:
                for cls in _TYPES[t]:
                    if cls not in found:
                        found.append(cls)
            classes = tuple(found)
            parts.append(self.type_test(spell.next(), classes))
        for keyword in ("enum", "const"):
            if keyword in schema:
                values = schema[keyword] if keyword == "enum" else [schema[keyword]]
                parts.append(self.enum(spell, values))
        for group, own, test in (
            (_NUMERIC, (int, float), self.numeric),
            (_STRING, (str,), self.string),
            (_OBJECT, (dict,), self.object),
            (_ARRAY, (list,), self.array),
        ):
            present = {k: schema[k] for k in group if k in schema}
            if not present:
                continue
            if classes is not None and not set(classes) & set(own):
                continue  # the type excludes this group: its keywords cannot apply
            checks = test(present, ref)
            if not checks:
                continue  # keywords that assert nothing (minLength 0, uniqueItems false, ...)
            if classes is not None and set(classes) <= set(own):
                parts.extend(checks)  # the type already holds
            else:
                guard = self.type_test(spell.next(), own, negate=True)
                parts.append(f"({guard} or ({' and '.join(checks)}))")
        return "(" + " and ".join(parts) + ")" if parts else "True"

    def type_test(self, v: str, classes: tuple[type, ...], negate: bool = False) -> str:
        if classes == (type(None),):
            return f"({v} is not None)" if negate else f"({v} is None)"
        if len(classes) == 1:
            return f"({v}.__class__ {'is not' if negate else 'is'} {classes[0].__name__})"
        if classes == (int, float):
            return f"({v}.__class__ {'not in' if negate else 'in'} _N)"
        return f"({v}.__class__ {'not in' if negate else 'in'} {self.const(classes)})"

    def enum(self, spell: _Spelling, values: list[Any]) -> str:
        strings = [v for v in values if isinstance(v, str)]
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if not all(_exact(v) for v in numbers):
            raise _Unsupported("enum of large numbers")
        singles = [v for v in values if v is None or isinstance(v, bool)]
        if len(strings) + len(numbers) + len(singles) != len(values):
            raise _Unsupported("enum of objects or arrays")
        options = []
        if strings:  # only a str equals a str; an unhashable value raises (not decided here)
            options.append(f"({spell.next()} in {self.const(frozenset(strings))})")
        if numbers:
            v = spell.next()
            options.append(f"({v}.__class__ in _N and {spell.next()} in {self.const(frozenset(numbers))})")
        for single in dict.fromkeys(singles):
            options.append(f"({spell.next()} is {single!r})")
        return "(" + " or ".join(options) + ")" if options else "False"

    def numeric(self, kw: dict[str, Any], r: str) -> list[str]:
        lower: list[str] = []  # "bound op" pieces, written as one chained comparison: (0 <= r <= 10)
        upper: list[str] = []
        for bound, op, exclusive, strict_op, side in (
            ("minimum", "<=", "exclusiveMinimum", "<", lower),
            ("maximum", "<=", "exclusiveMaximum", "<", upper),
        ):
            flag = kw.get(exclusive)
            if isinstance(flag, bool):  # draft-04: a modifier of minimum / maximum
                if bound in kw:
                    side.append(f"{self.number(kw[bound])} {strict_op if flag else op}")
                continue
            if bound in kw:
                side.append(f"{self.number(kw[bound])} {op}")
            if flag is not None:
                side.append(f"{self.number(flag)} {strict_op}")
        checks = []
        while lower or upper:
            low = lower.pop() if lower else None
            high = upper.pop() if upper else None
            left = f"{low} " if low else ""
            right = f" {high.split(' ')[1]} {high.split(' ')[0]}" if high else ""
            checks.append(f"({left}{r}{right})")
        return checks

    def number(self, n: Any) -> str:
        if not _exact(n):
            raise _Unsupported("bound")
        return f"({n!r})" if n < 0 else repr(n)

    def string(self, kw: dict[str, Any], r: str) -> list[str]:
        checks = []
        if "minLength" in kw:
            least = self.count(kw["minLength"])
            if least != "0":
                checks.append(f"({r} != '')" if least == "1" else f"(len({r}) >= {least})")
        if "maxLength" in kw:
            checks.append(f"(len({r}) <= {self.count(kw['maxLength'])})")
        if "pattern" in kw:
            search, limit = _pattern(kw["pattern"])
            name = self.const(search)
            if limit is None:
                checks.append(f"({name}({r}) is not None)")
            else:
                checks.append(f"(len({r}) <= {limit} and {name}({r}) is not None)")
        return checks

    def count(self, n: Any) -> str:
        if isinstance(n, float) and n.is_integer():
            n = int(n)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise _Unsupported("count")
        return repr(n)

    def object(self, kw: dict[str, Any], r: str) -> list[str]:
        required = list(dict.fromkeys(kw.get("required") or []))
        properties = kw.get("properties") or {}
        if not isinstance(properties, Mapping) or not all(isinstance(k, str) for k in (*required, *properties)):
            raise _Unsupported("properties")
        checks: list[str] = []
        accessed: set[str] = set()  # required properties read as r[name]: a missing one raises KeyError
        for name, sub in properties.items():
            temp = self.name("_t")
            code = self.schema(sub, f"({temp} := {r}[{name!r}])", temp)
            if code == "True":
                continue
            if code.count(temp) == 1:  # read once: no temporary
                code = code.replace(f"({temp} := {r}[{name!r}])", f"{r}[{name!r}]")
            if name in required:
                accessed.add(name)
                checks.append(code)
            else:
                checks.append(f"({name!r} not in {r} or {code})")
        presence = [f"({name!r} in {r})" for name in required if name not in accessed]
        extra = kw.get("additionalProperties", True)
        if extra is False:
            optional = [name for name in properties if name not in required]
            if set(required) <= set(properties) and len(optional) <= 3:
                # every required name is there (read or tested), so the count leaves no room for others
                counted = "".join(f" + ({name!r} in {r})" for name in optional)
                presence.append(f"(len({r}) == {len(required)}{counted})")
            else:
                presence.append(f"({r}.keys() <= {self.const(frozenset(properties))})")
        elif extra is not True and extra != {}:
            raise _Unsupported("additionalProperties schema")
        if "minProperties" in kw:
            presence.append(f"(len({r}) >= {self.count(kw['minProperties'])})")
        if "maxProperties" in kw:
            presence.append(f"(len({r}) <= {self.count(kw['maxProperties'])})")
        return presence + checks

    def array(self, kw: dict[str, Any], r: str) -> list[str]:
        checks = []
        if kw.get("uniqueItems", False) is not False:
            raise _Unsupported("uniqueItems")
        if "minItems" in kw:
            checks.append(f"(len({r}) >= {self.count(kw['minItems'])})")
        if "maxItems" in kw:
            checks.append(f"(len({r}) <= {self.count(kw['maxItems'])})")
        if "items" in kw:
            items = kw["items"]
            if not isinstance(items, Mapping | bool):
                raise _Unsupported("items as a list")
            code = self.schema(items, "x", "x")
            if code != "True":
                item = eval(compile(f"lambda x: {code}", "<json schema items>", "eval"), self.namespace())
                checks.append(f"all(map({self.const(item)}, {r}))")
        return checks

    def namespace(self) -> dict[str, Any]:
        return {"__builtins__": {f.__name__: f for f in _BUILTINS}, **self.consts}


def _exact(n: Any) -> bool:
    """Whether jsonschema-rs compares any JSON number with ``n`` exactly, as Python does.

    Releases up to 0.60 did not beyond 2**53 (an int bound against a float value, and the reverse,
    went through f64 or 64-bit integers); the dependency range admits them, so such bounds get no
    check and the engine decides.
    """
    return isinstance(n, int | float) and not isinstance(n, bool) and -_EXACT < n < _EXACT


class _Spelling:
    """Hands out the value's spelling in evaluation order: the binding once, then the plain name."""

    __slots__ = ("first", "ref", "used")

    def __init__(self, first: str, ref: str) -> None:
        self.first = first
        self.ref = ref
        self.used = first == ref

    def next(self) -> str:
        if self.used:
            return self.ref
        self.used = True
        return self.first


def _pattern(pattern: Any) -> tuple[Callable[[str], Any], int | None]:
    """(search, longest text it may see) for a pattern whose Python ``re`` spelling means the same.

    The pattern was accepted by jsonschema-rs, whose ``\\d``, ``\\w`` are ASCII, ``.`` excludes only
    ``\\n`` and ``$`` is the end of the text: the RE2 subset that CEL's ``matches()`` translates reads
    the same there, except what ``_UNSAFE_ESCAPES`` lists and class set operations (``&&``, ``~~``,
    nested ``[``), which jsonschema-rs has and Python ``re`` has not. Backtracking is bounded as for CEL.
    """
    if not isinstance(pattern, str):
        raise _Unsupported("pattern")
    in_class = False
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1 : i + 2]
            if nxt in _UNSAFE_ESCAPES or (in_class and nxt == "s"):
                raise _Unsupported("escape")
            i += 2
            continue
        if in_class and (c == "[" or pattern.startswith(("&&", "~~", "--"), i)):
            raise _Unsupported("class set operation")
        if c == "[" and not in_class:
            in_class = True
            if pattern.startswith("]", i + 1) or pattern.startswith("^]", i + 1):
                i += 1 if pattern[i + 1] == "]" else 2
        elif c == "]" and in_class:
            in_class = False
        i += 1
    translated = translate(pattern)
    if translated is None or translated[1] not in _LENGTH_LIMITS:
        raise _Unsupported("pattern")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            search: Callable[[str], Any] = re.compile(translated[0], re.ASCII).search
        except (re.error, Warning, RecursionError, OverflowError):
            raise _Unsupported("pattern") from None
    return search, _LENGTH_LIMITS[translated[1]]
