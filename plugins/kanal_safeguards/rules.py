"""The config shapes policies share, as operators write them (camelCase keys).

- a range ``{min, max, action, overrideValue}`` for a number (partitions, retention.ms...);
- a value ``{value, action}`` for a required value (an acks setting, a flag, a regex);
- a set ``{values, action, overrideValue}`` for the values allowed (compressions, cleanup policies).

Each checks a value and answers a :class:`~kanal_safeguards.decisions.Violation` or None. ``action``
is what a violation does (:class:`~kanal_safeguards.decisions.Action`, BLOCK by default);
``overrideValue`` is what OVERRIDE writes instead (required for OVERRIDE: a config without it is
refused when it is applied, naming the field).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from kanal_safeguards.decisions import Action, Violation

__all__ = ["RangeRule", "RegexRule", "ValueRule", "ValuesRule"]


class _Rule(msgspec.Struct, forbid_unknown_fields=True, rename="camel", dict=True):
    action: Action = Action.BLOCK

    def _check_override(self, override: Any) -> None:
        if self.action is Action.OVERRIDE and override is None:
            raise ValueError("overrideValue must not be null when the action is OVERRIDE")


class RangeRule(_Rule, kw_only=True):
    """A number within ``[min, max]`` (either may be absent)."""

    min: float | None = None
    max: float | None = None
    override_value: float | None = None

    def __post_init__(self) -> None:
        self._check_override(self.override_value)
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({_number(self.min)}) is greater than max ({_number(self.max)})")

    def check(self, name: str, value: float | None) -> Violation | None:
        """``name`` is how the reason calls the value (``numPartition``, ``retention.ms``)."""
        if value is None:
            return None
        if self.min is not None and value < self.min:
            reason = f"{name} is '{_number(value)}', must not be less than '{_number(self.min)}'"
        elif self.max is not None and value > self.max:
            reason = f"{name} is '{_number(value)}', must not be greater than '{_number(self.max)}'"
        else:
            return None
        return Violation(reason, self.action, name, value, self._override())

    def _override(self) -> Any:
        value = self.override_value
        return int(value) if value is not None and value == int(value) else value


class ValueRule(_Rule, kw_only=True):
    """A required value: equal to ``value`` (a number, a string, a flag)."""

    value: Any

    def check(self, name: str, value: Any, reason: str | None = None) -> Violation | None:
        if value == self.value:
            return None
        return Violation(reason or f"{name} is '{value}', must be '{self.value}'", self.action, name, value, self.value)


class RegexRule(_Rule, kw_only=True):
    """A string matching the regex ``value`` (whole string)."""

    value: str

    def __post_init__(self) -> None:
        try:
            self._pattern = re.compile(self.value)
        except re.error as exc:
            raise ValueError(f"value {self.value!r} is not a valid regex: {exc}") from None

    def check(self, name: str, value: str | None) -> Violation | None:
        if value is not None and self._pattern.fullmatch(value):
            return None
        return Violation(f"{name} '{value}' is invalid.", self.action, name, value, None)


class ValuesRule(_Rule, kw_only=True):
    """A value among ``values`` (compared without case for strings)."""

    values: list[Any]
    override_value: Any = None

    def __post_init__(self) -> None:
        self._check_override(self.override_value)
        self._allowed = {_fold(v) for v in self.values}

    def check(self, name: str, value: Any) -> Violation | None:
        if value is None or _fold(value) in self._allowed:
            return None
        allowed = ", ".join(str(v) for v in self.values)
        reason = f"{name} is '{value}', must be one of [{allowed}]"
        return Violation(reason, self.action, name, value, self.override_value)


def _number(value: float) -> str:
    """A number as operators write it: whole ones in full (``3600000``, not ``3.6e+06``)."""
    return str(int(value)) if value == int(value) else repr(value)


def _fold(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value
