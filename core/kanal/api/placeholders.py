"""``${VAR}`` and ``${VAR|default}`` placeholders in configuration values.

One rule for every place an operator writes configuration: the config file, interceptor configs
(from the file or the admin API, expanded when the interceptor is made, so the stored resource keeps
the placeholder and not the secret), and plugins' own settings (external connections)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["expand_placeholders"]

from kanal.api.errors import ConfigError

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:\|([^}]*))?\}")


def expand_placeholders(value: Any, env: Mapping[str, str], where: str) -> Any:
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
        return {k: expand_placeholders(v, env, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [expand_placeholders(v, env, f"{where}[{i}]") for i, v in enumerate(value)]
    return value
