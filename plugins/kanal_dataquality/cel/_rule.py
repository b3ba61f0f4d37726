"""``compile_cel`` and ``CelRule``: a CEL expression compiled once, evaluated per record."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from kanal_dataquality.cel._codegen import FastFunction, Unsupported, generate
from kanal_dataquality.cel._parse import check, environment, parse, to_ast
from kanal_dataquality.cel._reference import ReferenceRunner

__all__ = ["FAILED", "PASSED", "CelRule", "Outcome", "compile_cel", "headers_map"]


class Outcome(NamedTuple):
    """The result of one rule on one record.

    ``passed`` is True when the rule holds. A failed rule has ``error`` None when the expression was simply
    false, or a reason when it could not be evaluated (a missing header, a field of the wrong type, ...);
    both are violations.
    """

    passed: bool
    error: str | None = None


PASSED = Outcome(True, None)
FAILED = Outcome(False, None)


def headers_map(headers: Iterable[tuple[str, bytes | None]]) -> dict[str, str]:
    """Kafka record headers as CEL's ``headers``: a map<string, string>.

    Values are decoded as UTF-8 (invalid bytes become U+FFFD), the last value of a repeated header wins,
    and a null value is presented as the empty string (the header is present: ``'h' in headers`` is true).
    """
    return {name: "" if raw is None else raw.decode("utf-8", "replace") for name, raw in headers}


class CelRule:
    """A compiled CEL expression. Build it with ``compile_cel``.

    ``evaluate(key, value, headers)`` takes the record already parsed into JSON-like Python values (dict,
    list, str, int, float, bool, None; the caller decodes JSON or Avro) and ``headers`` as made by
    ``headers_map``. It runs the generated fast path when there is one (``fast``), and the reference
    evaluator when the fast path gives up on the record or does not exist. It is safe to call from several
    threads at once; ``fallbacks`` (records decided by the reference) is then approximate.
    """

    __slots__ = ("_fast", "_reference", "expression", "fallbacks", "source")

    def __init__(self, expression: str, fast: FastFunction | None, source: str | None, reference: ReferenceRunner):
        self.expression = expression
        self.source = source  # the generated Python expression, for debugging
        self._fast = fast
        self._reference = reference
        self.fallbacks = 0

    @property
    def fast(self) -> bool:
        """Whether the expression has a fast path (else every record goes to cel-python)."""
        return self._fast is not None

    def evaluate(self, key: Any, value: Any, headers: Any) -> Outcome:
        fast = self._fast
        if fast is not None:
            try:
                result = fast(key, value, headers)
            except Exception:
                pass  # give up: the reference decides (a CEL error, or something the fast path does not model)
            else:
                if result is True:
                    return PASSED
                if result is False:
                    return FAILED
        return self.evaluate_reference(key, value, headers)

    def fast_answer(self, key: Any, value: Any, headers: Any) -> bool | None:
        """The fast path's answer, or None when it gives up or does not exist (for tests and diagnostics)."""
        if self._fast is None:
            return None
        try:
            result = self._fast(key, value, headers)
        except Exception:
            return None
        return result if result is True or result is False else None

    def evaluate_reference(self, key: Any, value: Any, headers: Any) -> Outcome:
        """Evaluate with cel-python only (the fallback; also the oracle of the tests)."""
        self.fallbacks += 1
        passed, error = self._reference.evaluate(key, value, headers)
        if passed:
            return PASSED
        return FAILED if error is None else Outcome(False, error)

    def __repr__(self) -> str:
        return f"CelRule({self.expression!r}, fast={self.fast})"


def compile_cel(expression: str) -> CelRule:
    """Compile a CEL expression over ``key``, ``value`` and ``headers``.

    Raises CelCompileError with a readable message when the expression is not valid CEL (syntax),
    refers to an undeclared variable, calls an unknown function or method (or with the wrong number of
    arguments), or uses an invalid regular-expression literal in ``matches()``.
    """
    tree = parse(expression)
    ast = to_ast(tree)
    check(ast)
    reference = ReferenceRunner(environment(), tree)
    try:
        generated = generate(ast)
    except Unsupported:
        return CelRule(expression, None, None, reference)
    return CelRule(expression, generated.function, generated.source, reference)
