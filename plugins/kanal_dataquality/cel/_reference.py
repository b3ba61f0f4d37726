"""The reference evaluator: cel-python's InterpretedRunner with Kanal's operator overloads.

It evaluates with CEL's error semantics (``false && error`` is ``false``, ``error || true`` is ``true``), so it
decides every record the fast path gives up on. It costs 100 to 500 µs per record.

Why the InterpretedRunner and only it. cel-python's CompiledRunner is faster (about 75 µs) but not
re-entrant: ``Transpiler.evaluate`` writes the activation into the globals of the ``celpy.evaluation``
module and ``exec``s there on every call, so two threads (``trio.to_thread`` workers) evaluating at once
would see each other's records; it also logs at ERROR level on every evaluation error, and it needs trees of
its own class from the parser singleton (see ``_parse``). The InterpretedRunner builds a fresh ``Evaluator``
for each call and shares nothing mutable, and the fallback is rare by design, so its speed does not matter.

Kanal's overloads (passed through cel-python's documented ``functions`` hook, which takes precedence over
its built-ins) make the reference follow the current CEL specification and the data-quality spec where
cel-python 0.5 does not:

* Numbers are one generic number type (spec: the payload is JSON, numbers are generic). Ordering and
  equality work across int, uint and double in both directions (``0 < value.x`` and ``value.x > 0``;
  ``1 == 1.0``), as in cel-go and cel-cpp; stock cel-python raises "no matching overload" on
  ``0 < 2.5`` and ``1 == 1.0``. Arithmetic mixing int and double is done in double (a Kanal choice that
  follows "one generic number type"; strict CEL has no such overload). ``bool`` is not a number
  (cel-python's BoolType subclasses int, so stock ``true > 0`` is true).
* Equality is heterogeneous: values of different types are unequal, not an error (``'a' == 1`` is false),
  and lists and maps compare element by element with the same rule. ``in`` uses that equality.
* ``&&`` and ``||`` on a non-bool operand are errors unless the other operand decides (stock cel-python
  returns the non-bool operand: ``1 && true`` is 1).
* A negative list index is an error (stock: Python's negative indexing). ``size()`` of null or a number
  is an error (stock: ``size(null)`` is 0). ``contains()``, ``startsWith()`` and ``endsWith()`` take
  strings only (stock ``contains()`` also searches lists and maps).
* ``matches()`` caches compiled RE2 patterns and never lets RE2 log to stderr.

Known differences from the CEL specification that remain (none of them make the fast path and the
reference disagree, because the fast path gives up on all of them): ``has(a.b)`` is false rather than an
error when ``a`` itself is missing or not a map; ``exists_one`` counts an element whose predicate is an
error as a match; integers compared with doubles are compared exactly (cel-go converts the int to double
first, which differs beyond 2**53).

One difference between the fast path and the reference remains: an integer beyond 64 bits is a double
here (CEL has no wider integer) but an exact Python int in the fast path, so ``==`` on such a value can
differ. orjson already parses such integers as doubles, so only another decoder can produce them.

Record values are converted to cel-python types by ``to_cel``: JSON integers become int (uint for values in
[2**63, 2**64), double beyond), so ``type(value.x) == int`` is true for ``12`` and false for ``12.0``; the
spec only promises that such a test *may* fail, and tells users to check numbers with ranges.
"""

from __future__ import annotations

import functools
import logging
import math
import operator
import re
from collections.abc import Callable
from typing import Any

from celpy import InterpretedRunner
from celpy.celtypes import (
    BoolType,
    BytesType,
    DoubleType,
    DurationType,
    IntType,
    ListType,
    MapType,
    StringType,
    TimestampType,
    UintType,
)
from celpy.evaluation import CELEvalError, base_functions

from kanal_dataquality.cel._regex import RegexError, compile_matcher

__all__ = ["ReferenceRunner", "describe_error", "to_cel"]

logging.getLogger("celpy").setLevel(logging.CRITICAL)  # it logs every evaluation error at ERROR level

_I64_MIN, _I64_MAX, _U64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
_NUMERIC = frozenset({"int", "uint", "double"})


def to_cel(obj: Any) -> Any:
    """Convert a JSON-like Python value (dict, list, str, int, float, bool, None) to cel-python types."""
    cls = obj.__class__
    if cls is str:
        return StringType(obj)
    if cls is bool:
        return BoolType(obj)
    if cls is int:
        if _I64_MIN <= obj <= _I64_MAX:
            return IntType(obj)
        if 0 <= obj <= _U64_MAX:
            return UintType(obj)
        return DoubleType(float(obj))
    if cls is float:
        return DoubleType(obj)
    if obj is None:
        return None
    if cls is dict:
        return MapType({to_cel(k): to_cel(v) for k, v in obj.items()})
    if cls in (list, tuple):
        return ListType([to_cel(v) for v in obj])
    if cls is bytes:
        return BytesType(obj)
    # Subclasses of the JSON types, then whatever cel-python's own adapter knows (datetime, timedelta).
    if isinstance(obj, bool):
        return BoolType(obj)
    if isinstance(obj, str):
        return StringType(obj)
    if isinstance(obj, float):
        return DoubleType(obj)
    if isinstance(obj, int):
        return to_cel(int(obj))
    if isinstance(obj, dict):
        return MapType({to_cel(k): to_cel(v) for k, v in obj.items()})
    if isinstance(obj, list | tuple):
        return ListType([to_cel(v) for v in obj])
    from celpy.adapter import json_to_cel

    return json_to_cel(obj)


def _kind(x: Any) -> str:
    if isinstance(x, BoolType | bool):
        return "bool"
    if isinstance(x, UintType):
        return "uint"
    if isinstance(x, int):
        return "int"
    if isinstance(x, float):
        return "double"
    if isinstance(x, str):
        return "string"
    if isinstance(x, bytes):
        return "bytes"
    if x is None:
        return "null"
    if isinstance(x, list):
        return "list"
    if isinstance(x, dict):
        return "map"
    if isinstance(x, type):
        return "type"
    if isinstance(x, TimestampType):
        return "timestamp"
    if isinstance(x, DurationType):
        return "duration"
    return type(x).__name__


def _plain(x: Any) -> int | float:
    return float(x) if isinstance(x, float) else int(x)


def _errors_first(fn: Callable[..., Any]) -> Callable[..., Any]:
    """An operand that is already an error is the result (cel-python passes errors to operators)."""

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        for a in args:
            if isinstance(a, CELEvalError):
                return a
        return fn(*args)

    return wrapper


def _heq(a: Any, b: Any) -> bool:
    ka, kb = _kind(a), _kind(b)
    if ka in _NUMERIC and kb in _NUMERIC:
        return _plain(a) == _plain(b)
    if ka != kb:
        return False
    if ka == "list":
        return len(a) == len(b) and all(_heq(x, y) for x, y in zip(a, b, strict=True))
    if ka == "map":
        if len(a) != len(b):
            return False
        for k, v in a.items():
            match = [bk for bk in b if _heq(k, bk)]
            if not match or not _heq(v, b[match[0]]):
                return False
        return True
    if ka == "null":
        return True
    return bool(a == b)


@_errors_first
def _eq(a: Any, b: Any) -> BoolType:
    return BoolType(_heq(a, b))


@_errors_first
def _ne(a: Any, b: Any) -> BoolType:
    return BoolType(not _heq(a, b))


_ORDERED_KINDS = frozenset({"string", "bytes", "bool", "timestamp", "duration"})


def _ordering(op: Callable[[Any, Any], bool], symbol: str) -> Callable[..., Any]:
    @_errors_first
    def compare(a: Any, b: Any) -> BoolType:
        ka, kb = _kind(a), _kind(b)
        if ka in _NUMERIC and kb in _NUMERIC:
            return BoolType(op(_plain(a), _plain(b)))
        if ka == kb and ka in _ORDERED_KINDS:
            if ka == "bool":
                return BoolType(op(bool(a), bool(b)))
            return BoolType(op(a, b))
        raise TypeError(f"no such overload: {ka} {symbol} {kb}")

    return compare


@_errors_first
def _in(item: Any, container: Any) -> BoolType:
    kc = _kind(container)
    if kc == "list":
        return BoolType(any(_heq(item, x) for x in container))
    if kc == "map":
        if _kind(item) == "string":
            return BoolType(item in container)
        return BoolType(any(_heq(item, k) for k in container))
    raise TypeError(f"no such overload: {_kind(item)} in {kc}")


def _mixed_arithmetic(original: Callable[[Any, Any], Any], float_op: Callable[[float, float], float]) -> Any:
    @_errors_first
    def arith(a: Any, b: Any) -> Any:
        ka, kb = _kind(a), _kind(b)
        if ka == "bool" or kb == "bool":
            raise TypeError(f"no such overload: {ka}, {kb}")
        if ka in _NUMERIC and kb in _NUMERIC and ka != kb and "double" in (ka, kb):
            return DoubleType(float_op(float(a), float(b)))
        return original(a, b)

    return arith


def _float_div(a: float, b: float) -> float:
    if b == 0.0:
        if a == 0.0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _no_float_modulo(a: float, b: float) -> float:
    raise TypeError("no such overload: % on double")


@_errors_first
def _neg(a: Any) -> Any:
    if _kind(a) not in _NUMERIC:
        raise TypeError(f"no such overload: -{_kind(a)}")
    return base_functions["-_"](a)


def _logical(decisive: bool) -> Callable[[Any, Any], Any]:
    """``&&`` (decisive False) and ``||`` (decisive True): commutative, errors absorbed by the decisive value."""

    def logical(a: Any, b: Any) -> Any:
        for x in (a, b):
            if isinstance(x, BoolType | bool) and bool(x) is decisive:
                return BoolType(decisive)
        for x in (a, b):
            if isinstance(x, CELEvalError):
                return x
        for x in (a, b):
            if not isinstance(x, BoolType | bool):
                raise TypeError(f"no such overload: {_kind(x)} {'||' if decisive else '&&'}")
        return BoolType(not decisive)

    return logical


@_errors_first
def _index(container: Any, index: Any) -> Any:
    kc, ki = _kind(container), _kind(index)
    if kc == "list":
        if ki not in ("int", "uint"):
            raise TypeError(f"no such overload: list[{ki}]")
        if not 0 <= int(index) < len(container):
            raise IndexError(f"index {int(index)} out of range")
        return container[int(index)]
    if kc == "map":
        if ki == "string":
            return container[index]
        for k in container:
            if _heq(k, index):
                return container[k]
        raise KeyError(index)
    raise TypeError(f"no such overload: {kc}[{ki}]")


@_errors_first
def _size(x: Any) -> IntType:
    if _kind(x) in ("string", "bytes", "list", "map"):
        return IntType(len(x))
    raise TypeError(f"no such overload: size({_kind(x)})")


def _strings(name: str, op: Callable[[str, str], bool]) -> Callable[..., Any]:
    @_errors_first
    def fn(s: Any, arg: Any) -> BoolType:
        if _kind(s) != "string" or _kind(arg) != "string":
            raise TypeError(f"no such overload: {_kind(s)}.{name}({_kind(arg)})")
        return BoolType(op(str(s), str(arg)))

    return fn


@functools.lru_cache(maxsize=256)
def _search(pattern: str) -> Callable[[str], Any]:
    return compile_matcher(pattern).re2


@_errors_first
def _matches(text: Any, pattern: Any) -> Any:
    if _kind(text) != "string" or _kind(pattern) != "string":
        raise TypeError(f"no such overload: {_kind(text)}.matches({_kind(pattern)})")
    try:
        search = _search(str(pattern))
    except RegexError as exc:
        return CELEvalError(str(exc), ValueError, (str(exc),))
    return BoolType(search(str(text)) is not None)


OVERLOADS: dict[str, Any] = {
    "_==_": _eq,
    "_!=_": _ne,
    "_<_": _ordering(operator.lt, "<"),
    "_<=_": _ordering(operator.le, "<="),
    "_>_": _ordering(operator.gt, ">"),
    "_>=_": _ordering(operator.ge, ">="),
    "_in_": _in,
    "_+_": _mixed_arithmetic(base_functions["_+_"], operator.add),
    "_-_": _mixed_arithmetic(base_functions["_-_"], operator.sub),
    "_*_": _mixed_arithmetic(base_functions["_*_"], operator.mul),
    "_/_": _mixed_arithmetic(base_functions["_/_"], _float_div),
    "_%_": _mixed_arithmetic(base_functions["_%_"], _no_float_modulo),
    "-_": _neg,
    "_&&_": _logical(False),
    "_||_": _logical(True),
    "_[_]": _index,
    "size": _size,
    "contains": _strings("contains", lambda s, sub: sub in s),
    "startsWith": _strings("startsWith", str.startswith),
    "endsWith": _strings("endsWith", str.endswith),
    "matches": _matches,
}


class ReferenceRunner:
    """One compiled expression on cel-python. ``evaluate`` returns (passed, error message or None)."""

    __slots__ = ("_runner",)

    def __init__(self, environment: Any, tree: Any) -> None:
        self._runner: Any = InterpretedRunner(environment, tree, OVERLOADS)

    def evaluate(self, key: Any, value: Any, headers: Any) -> tuple[bool, str | None]:
        try:
            activation = {"key": to_cel(key), "value": to_cel(value), "headers": to_cel(headers)}
        except (TypeError, ValueError) as exc:
            return False, f"the record cannot be presented to CEL: {exc}"
        try:
            result = self._runner.evaluate(activation)
        except CELEvalError as exc:
            return False, describe_error(exc)
        except RecursionError:
            return False, "evaluation error: expression too deeply nested"
        except Exception as exc:  # cel-python lets some Python errors escape (e.g. iterating a number)
            return False, f"evaluation error: {type(exc).__name__}: {exc}"[:300]
        if isinstance(result, CELEvalError):
            return False, describe_error(result)
        if isinstance(result, BoolType | bool):
            return bool(result), None
        return False, f"evaluation error: the expression gave a {_kind(result)}, not a bool"


_CLASS = re.compile(r"<class '(?:celpy\.celtypes\.)?(\w+)'>")
_RULE = re.compile(r"Token\('RULE', '(\w+)'\)")
_CEL_NAMES = {
    "IntType": "int",
    "UintType": "uint",
    "DoubleType": "double",
    "BoolType": "bool",
    "StringType": "string",
    "BytesType": "bytes",
    "ListType": "list",
    "MapType": "map",
    "NoneType": "null",
    "TimestampType": "timestamp",
    "DurationType": "duration",
    "CELEvalError": "error",
}
_OPERATORS = {
    "relation_lt": "<",
    "relation_le": "<=",
    "relation_gt": ">",
    "relation_ge": ">=",
    "relation_eq": "==",
    "relation_ne": "!=",
    "relation_in": "in",
    "addition_add": "+",
    "addition_sub": "-",
    "multiplication_mul": "*",
    "multiplication_div": "/",
    "multiplication_mod": "%",
    "unary_neg": "-",
    "unary_not": "!",
}


def describe_error(err: BaseException) -> str:
    """A short, readable reason for a CEL evaluation error (it becomes the violation reason)."""
    args = err.args
    message = str(args[0]) if args else type(err).__name__
    detail = args[2] if len(args) > 2 else None
    if message == "no such key" and isinstance(detail, tuple) and detail:
        message = f"no such key: {str(detail[0])!r}"
    elif message == "return error for overflow":
        message = "integer overflow"
    elif message == "no such overload" and isinstance(detail, tuple) and detail:
        message = f"{message}: {detail[0]}"
    elif message == "invalid_argument" and isinstance(detail, tuple) and detail:
        message = f"invalid argument: {detail[0]}"
    message = _CLASS.sub(lambda m: _CEL_NAMES.get(m.group(1), m.group(1)), message)
    message = _RULE.sub(lambda m: repr(_OPERATORS.get(m.group(1), m.group(1))), message)
    if "(in activation" in message:
        message = message.split(" (in activation", 1)[0]
    return f"evaluation error: {message}"[:300]
