"""Helpers called by the generated fast-path code (see ``_codegen``).

The contract of every helper: return exactly what CEL returns for plain JSON values (dict, list, str, int,
float, bool, None), or raise. Raising is always safe: the record is then decided by the reference
evaluator. A helper must never return a value where CEL gives an error, so each checks the exact classes of
its operands (``bool`` is not a number here, although Python's ``True == 1``).

Numbers: int and float are one generic number type. Ordering and equality compare them exactly across the
two classes; arithmetic on two ints is int64 with overflow checks (CEL semantics: division truncates toward
zero, the remainder takes the dividend's sign); arithmetic that involves a float is done in float.
"""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["HELPERS", "GiveUp"]

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


class GiveUp(Exception):
    """The fast path cannot decide this record (a CEL error, or something it does not model)."""


def _E() -> NoReturn:
    raise GiveUp


def _b(x: Any) -> Any:
    """``x`` if it is a bool, else give up (CEL's logical operators and ``?:`` need bools)."""
    if x is True or x is False:
        return x
    raise GiveUp


def _not(x: Any) -> bool:
    if x is True:
        return False
    if x is False:
        return True
    raise GiveUp


def _eq(a: Any, b: Any) -> bool:
    """CEL heterogeneous equality on JSON values."""
    ta, tb = a.__class__, b.__class__
    if ta is tb:
        if ta is list:
            return len(a) == len(b) and all(_eq(x, y) for x, y in zip(a, b, strict=True))
        if ta is dict:
            if len(a) != len(b):
                return False
            for k, v in a.items():
                if k.__class__ is not str:
                    raise GiveUp
                if k not in b or not _eq(v, b[k]):
                    return False
            return True
        if ta is str or ta is bool or ta is int or ta is float or a is None:
            return bool(a == b)
        raise GiveUp
    if (ta is int or ta is float) and (tb is int or tb is float):
        return bool(a == b)
    if ta in _JSON and tb in _JSON:
        return False
    raise GiveUp


_JSON = frozenset({dict, list, str, int, float, bool, type(None)})


def _ordered(a: Any, b: Any) -> bool:
    ta, tb = a.__class__, b.__class__
    if (ta is int or ta is float) and (tb is int or tb is float):
        return True
    return ta is tb and (ta is str or ta is bool)


def _lt(a: Any, b: Any) -> bool:
    if _ordered(a, b):
        return bool(a < b)
    raise GiveUp


def _le(a: Any, b: Any) -> bool:
    if _ordered(a, b):
        return bool(a <= b)
    raise GiveUp


def _gt(a: Any, b: Any) -> bool:
    if _ordered(a, b):
        return bool(a > b)
    raise GiveUp


def _ge(a: Any, b: Any) -> bool:
    if _ordered(a, b):
        return bool(a >= b)
    raise GiveUp


def _in(item: Any, container: Any) -> bool:
    tc = container.__class__
    if tc is list:
        return any(_eq(item, x) for x in container)
    if tc is dict:
        if item.__class__ is str:
            return item in container
        raise GiveUp
    raise GiveUp


def _int(r: int) -> int:
    if _I64_MIN <= r <= _I64_MAX:
        return r
    raise GiveUp


def _add(a: Any, b: Any) -> Any:
    ta, tb = a.__class__, b.__class__
    if ta is int and tb is int:
        return _int(a + b)
    if (ta is int or ta is float) and (tb is int or tb is float):
        return float(a) + float(b)
    if ta is tb and (ta is str or ta is list):
        return a + b
    raise GiveUp


def _sub(a: Any, b: Any) -> Any:
    ta, tb = a.__class__, b.__class__
    if ta is int and tb is int:
        return _int(a - b)
    if (ta is int or ta is float) and (tb is int or tb is float):
        return float(a) - float(b)
    raise GiveUp


def _mul(a: Any, b: Any) -> Any:
    ta, tb = a.__class__, b.__class__
    if ta is int and tb is int:
        return _int(a * b)
    if (ta is int or ta is float) and (tb is int or tb is float):
        return float(a) * float(b)
    raise GiveUp


def _div(a: Any, b: Any) -> Any:
    ta, tb = a.__class__, b.__class__
    if ta is int and tb is int:
        if b == 0:
            raise GiveUp
        q = abs(a) // abs(b)
        return _int(q if (a < 0) == (b < 0) else -q)
    if (ta is int or ta is float) and (tb is int or tb is float):
        if b == 0:
            raise GiveUp  # IEEE infinities: left to the reference
        return float(a) / float(b)
    raise GiveUp


def _mod(a: Any, b: Any) -> Any:
    if a.__class__ is int and b.__class__ is int and b != 0:
        r = abs(a) % abs(b)
        return -r if a < 0 else r
    raise GiveUp


def _neg(a: Any) -> Any:
    ta = a.__class__
    if ta is int:
        return _int(-a)
    if ta is float:
        return -a
    raise GiveUp


def _idx(container: Any, index: Any) -> Any:
    tc = container.__class__
    if tc is dict:
        if index.__class__ is str:
            return container[index]
        raise GiveUp
    if tc is list and index.__class__ is int and 0 <= index < len(container):
        return container[index]
    raise GiveUp


def _iter(container: Any) -> Any:
    tc = container.__class__
    if tc is list:
        return container
    if tc is dict:
        return list(container)
    raise GiveUp


def _str2(name: str) -> Any:
    def fn(s: Any, arg: Any) -> bool:
        if s.__class__ is str and arg.__class__ is str:
            if name == "contains":
                return arg in s
            return bool(s.startswith(arg) if name == "startsWith" else s.endswith(arg))
        raise GiveUp

    return fn


HELPERS: dict[str, Any] = {
    "_E": _E,
    "_b": _b,
    "_not": _not,
    "_eq": _eq,
    "_lt": _lt,
    "_le": _le,
    "_gt": _gt,
    "_ge": _ge,
    "_in": _in,
    "_add": _add,
    "_sub": _sub,
    "_mul": _mul,
    "_div": _div,
    "_mod": _mod,
    "_neg": _neg,
    "_idx": _idx,
    "_iter": _iter,
    "_contains": _str2("contains"),
    "_startsWith": _str2("startsWith"),
    "_endsWith": _str2("endsWith"),
    "_N": (int, float),
    "_SZ": (str, list, dict),
}
