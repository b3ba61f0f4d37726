"""CEL rules for data quality: compile an expression once, evaluate it on each record.

    rule = compile_cel("value.amount > 0 && headers['x-source'] == 'web'")   # CelCompileError if invalid
    outcome = rule.evaluate(key, value, headers_map(record.headers))        # Outcome(passed, error)

The variables are ``key``, ``value`` (JSON-like Python values, already decoded by the caller) and
``headers`` (map<string, string>, see ``headers_map``). An expression is translated into one Python
expression (the fast path, about 0.5 µs for a three-clause rule); cel-python is the reference and decides
every record the fast path gives up on, so answers follow CEL's error semantics.

Module map: ``_parse`` (cel-python parser, typed AST, compile-time checks), ``_codegen`` and ``_runtime``
(the fast path and its exact number, equality and error rules), ``_reference`` (cel-python with Kanal's
overloads, why the InterpretedRunner, and the differences from the CEL specification that remain),
``_regex`` (RE2 patterns on Python ``re`` when that is exact and cheap), ``_rule`` (the public objects).
"""

from kanal_dataquality.cel._parse import CelCompileError
from kanal_dataquality.cel._rule import FAILED, PASSED, CelRule, Outcome, compile_cel, headers_map

__all__ = ["FAILED", "PASSED", "CelCompileError", "CelRule", "Outcome", "compile_cel", "headers_map"]
