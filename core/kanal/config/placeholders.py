"""``${VAR}`` and ``${VAR|default}`` placeholders in configuration values."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kanal.api.errors import ConfigError

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:\|([^}]*))?\}")


def expand(value: Any, env: Mapping[str, str], where: str) -> Any:
    """Expands placeholders in every string of a nested value; ``where`` names the key in errors.

    The default applies only when the variable is unset; a plain ``${VAR}`` with VAR unset is an
    error naming the variable, never an empty string that would fail later, far from the cause.
    """
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise ConfigError(
                where, f"environment variable {name} is not set (write ${{{name}|default}} for a default)"
            )

        return _PLACEHOLDER.sub(sub, value)
    if isinstance(value, Mapping):
        return {k: expand(v, env, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [expand(v, env, f"{where}[{i}]") for i, v in enumerate(value)]
    return value
