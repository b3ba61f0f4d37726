"""The errors of the plugin API: each says what is at fault, so the operator can mend it."""

from __future__ import annotations


class ConfigError(ValueError):
    """Invalid configuration; ``key`` is the environment variable or YAML path at fault."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


class InterceptorConfigError(ValueError):
    """An interceptor's config is invalid; the message names the key (the admin API answers 400)."""


class UpstreamError(ConnectionError):
    """The upstream broker could not be reached or refused the gateway's credentials."""


class LogError(UpstreamError):
    """A state log could not be created, written or read."""
