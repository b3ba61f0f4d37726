"""Settings families a plugin declares (``kanal_settings``) and checks itself, at startup.

A family is every ``GATEWAY_*`` variable under one prefix (``GATEWAY_EXTERNAL_CONNECTION_``) whose
names carry parts the core cannot know (a connection's name, its properties). The plugin that declares
it says, once at startup, which of the family's variables it reads: the gateway then refuses to start
on a variable no plugin reads, with the closest name or value the plugins would have read. Several
plugins may declare the same prefix (each reads its own connection types): a variable passes when one
of them reads it, so a plugin never rejects what another one understands.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Hint:
    """What a plugin would have read instead of a variable it does not read (the error's hint, when no
    plugin reads it). ``names``: the variables it would have read there (the closest is suggested).
    ``values``: for a variable whose name is right but whose value selects nothing this plugin knows
    (a connection ``TYPE``), the values it knows; ``what`` names them in the error."""

    names: Collection[str] = ()
    values: Collection[str] = ()
    what: str = "value"


@dataclass(frozen=True)
class FamilyCheck:
    """One plugin's verdict on its family's variables: ``read`` are those it reads, ``hints`` say what
    it expected instead of some of the others (a variable in neither has no hint from this plugin)."""

    read: Collection[str] = ()
    hints: Mapping[str, Hint] = field(default_factory=dict)


@dataclass(frozen=True)
class SettingsFamily:
    """A family of ``GATEWAY_*`` variables: those starting with ``prefix``.

    ``check(variables)`` is called once at startup, before the gateway starts, with every variable
    of the family that is set (name -> value; possibly none). It raises
    :class:`~kanal.api.errors.ConfigError` naming the variable for what it owns and finds wrong (a
    missing or malformed property of one of its connections), and returns a :class:`FamilyCheck` for
    the rest. Without ``check``, every variable under the prefix is accepted.
    """

    prefix: str
    check: Callable[[Mapping[str, str]], FamilyCheck] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", self.prefix.upper().removesuffix("*"))
