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


#: The family of external connections (``GATEWAY_EXTERNAL_CONNECTION_<NAME>_TYPE`` and
#: ``..._<NAME>_CONFIG_<PROPERTY>``), which several plugins read (each its connection types).
EXTERNAL_CONNECTION_PREFIX = "GATEWAY_EXTERNAL_CONNECTION_"


@dataclass
class ExternalConnection:
    """One external connection as its variables declare it: ``type`` and each property as
    ``(value, variable)``, so a plugin's error can name the variable it comes from."""

    name: str
    type: tuple[str, str] | None = None
    props: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def variables(self) -> list[str]:
        """Every variable of the connection (its properties', then its type's)."""
        return [variable for _, variable in self.props.values()] + ([self.type[1]] if self.type else [])


def external_connections(env: Mapping[str, str]) -> tuple[dict[str, ExternalConnection], list[str]]:
    """The external connections declared in ``env``, by name as written, and the variables of the
    family that have neither form (``<NAME>_TYPE``, ``<NAME>_CONFIG_<PROPERTY>``)."""
    declared: dict[str, ExternalConnection] = {}
    malformed = []
    for variable, value in env.items():
        if not variable.startswith(EXTERNAL_CONNECTION_PREFIX):
            continue
        rest = variable[len(EXTERNAL_CONNECTION_PREFIX) :]
        if "_CONFIG_" in rest:
            name, prop = rest.split("_CONFIG_", 1)
            declared.setdefault(name, ExternalConnection(name)).props[prop] = (value, variable)
        elif rest.endswith("_TYPE"):
            name = rest[: -len("_TYPE")]
            declared.setdefault(name, ExternalConnection(name)).type = (value, variable)
        else:
            malformed.append(variable)
    return declared, malformed
