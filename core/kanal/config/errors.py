"""The one error type of configuration: it always names the key at fault."""

from __future__ import annotations


class ConfigError(ValueError):
    """Invalid configuration; ``key`` is the environment variable or YAML path at fault."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem
