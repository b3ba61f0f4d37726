"""Inlining a generated rule function into the generated record loop.

The CEL fast path and the JSON schema check are generated as ``lambda <params>: <expression>`` with their
own namespace. Called from the record loop, each costs a Python call per record; pasted into the loop as
an expression, nothing. Several rules share the loop, so every name an expression uses (its constants,
helpers, builtins and ``:=`` temporaries) gets the rule's prefix, and the loop's namespace gets the
renamed objects. The parameters become the loop's own locals of the same names.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["inline"]

# Scopes of their own inside the expression: names there would not be the loop's, so these stay calls.
_NESTED_SCOPES = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def inline(
    source: str, function: Callable[..., Any], params: tuple[str, ...], prefix: str
) -> tuple[str, dict[str, Any]] | None:
    """(expression, names to add to the loop's namespace) for ``source``, or None when it cannot be inlined.

    ``source`` is ``lambda <params>: <expression>`` and ``function`` its compiled function (its globals are
    where its names resolve).
    """
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        return None
    lam = tree.body
    if not isinstance(lam, ast.Lambda) or tuple(a.arg for a in lam.args.args) != params:
        return None
    if lam.args.vararg or lam.args.kwarg or lam.args.kwonlyargs or lam.args.defaults:
        return None
    namespace: Mapping[str, Any] = getattr(function, "__globals__", {})
    builtins = namespace.get("__builtins__", {})
    if not isinstance(builtins, Mapping):
        builtins = vars(builtins)
    nodes = list(ast.walk(lam.body))
    if any(isinstance(node, _NESTED_SCOPES) for node in nodes):
        return None
    temporaries = {n.target.id for n in nodes if isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name)}
    names: dict[str, Any] = {}
    for node in nodes:
        if not isinstance(node, ast.Name) or node.id in params:
            continue
        renamed = prefix + node.id
        if node.id in temporaries:
            pass  # a local of the loop
        elif node.id in namespace:
            names[renamed] = namespace[node.id]
        elif node.id in builtins:
            names[renamed] = builtins[node.id]
        else:
            return None  # a free name the function could not resolve either
        node.id = renamed
    try:
        return f"({ast.unparse(lam.body)})", names
    except (ValueError, RecursionError):
        return None
