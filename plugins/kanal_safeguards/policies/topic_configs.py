"""Rules on Kafka configs (``retention.ms``, ``cleanup.policy``...) shared by the create-topic,
alter-topic-config and alter-broker-config policies: one table from the operator's key to the
config name and the rule kind, the config types built from it, and the check of a set of configs.

A config value arrives as a string; it is read as the rule needs it (a number for a range, a flag
for a boolean rule) and a rewrite (OVERRIDE) is written back as a string. A config the request does
not set is not checked: the broker's default applies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from kanal.api import InterceptorConfigError
from kanal_safeguards.decisions import Action, Decisions, Violation
from kanal_safeguards.rules import RangeRule, ValueRule, ValuesRule

__all__ = [
    "BROKER_CONFIGS",
    "REMOVE",
    "TOPIC_ALTER_KEYS",
    "TOPIC_CONFIGS",
    "Blacklist",
    "Checked",
    "ConfigRule",
    "ConfigRules",
    "apply_rewrites",
    "config_rules",
    "config_struct",
    "refuse_override",
]

ConfigRule = RangeRule | ValueRule | ValuesRule

#: The topic config rules, by operator key (snake_case here; operators write it in camelCase,
#: ``retention_ms`` as ``retentionMs``): the Kafka config name and the rule kind.
TOPIC_CONFIGS: dict[str, tuple[str, type[ConfigRule]]] = {
    "cleanup_policy": ("cleanup.policy", ValuesRule),
    "compression_type": ("compression.type", ValuesRule),
    "message_timestamp_type": ("message.timestamp.type", ValueRule),
    "preallocate": ("preallocate", ValueRule),
    "unclean_leader_election_enable": ("unclean.leader.election.enable", ValueRule),
    "message_downconversion_enable": ("message.downconversion.enable", ValueRule),
    "delete_retention_ms": ("delete.retention.ms", RangeRule),
    "file_delete_delay_ms": ("file.delete.delay.ms", RangeRule),
    "flush_messages": ("flush.messages", RangeRule),
    "flush_ms": ("flush.ms", RangeRule),
    "index_interval_bytes": ("index.interval.bytes", RangeRule),
    "max_compaction_lag_ms": ("max.compaction.lag.ms", RangeRule),
    "max_message_bytes": ("max.message.bytes", RangeRule),
    "message_timestamp_difference_max_ms": ("message.timestamp.difference.max.ms", RangeRule),
    "min_cleanable_dirty_ratio": ("min.cleanable.dirty.ratio", RangeRule),
    "min_compaction_lag_ms": ("min.compaction.lag.ms", RangeRule),
    "min_insync_replicas": ("min.insync.replicas", RangeRule),
    "retention_bytes": ("retention.bytes", RangeRule),
    "retention_ms": ("retention.ms", RangeRule),
    "segment_bytes": ("segment.bytes", RangeRule),
    "segment_index_bytes": ("segment.index.bytes", RangeRule),
    "segment_jitter_ms": ("segment.jitter.ms", RangeRule),
    "segment_ms": ("segment.ms", RangeRule),
}

#: The keys of ``alter-topic-config-policy`` (a subset of :data:`TOPIC_CONFIGS`).
TOPIC_ALTER_KEYS: tuple[str, ...] = (
    "retention_ms",
    "retention_bytes",
    "segment_ms",
    "segment_bytes",
    "segment_jitter_ms",
    "flush_messages",
    "flush_ms",
    "max_message_bytes",
    "min_insync_replicas",
    "cleanup_policy",
    "unclean_leader_election_enable",
)

#: The broker config rules of ``alter-broker-config-policy``.
BROKER_CONFIGS: dict[str, tuple[str, type[ConfigRule]]] = {
    "log_retention_bytes": ("log.retention.bytes", RangeRule),
    "log_retention_ms": ("log.retention.ms", RangeRule),
    "log_segment_bytes": ("log.segment.bytes", RangeRule),
}

#: An override that removes the config from the request (a blacklisted config under OVERRIDE).
REMOVE = None


class Blacklist(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """Config names a request must not set; OVERRIDE removes them from the request instead."""

    values: list[str]
    action: Action = Action.BLOCK

    def check(self, name: str, value: str | None) -> Violation | None:
        if name not in self.values:
            return None
        return Violation(f"Configuration '{name}' is not allowed.", self.action, name, value, REMOVE)


def config_struct(
    name: str, base: type[msgspec.Struct], table: Mapping[str, tuple[str, type[ConfigRule]]], keys: Iterable[str]
) -> type[msgspec.Struct]:
    """A policy's config type: ``base`` (its own keys) with an optional rule for each of ``keys``
    of ``table``, camelCase and closed to unknown keys like every config of the plugin."""
    fields = [(key, table[key][1] | None, None) for key in keys]
    return msgspec.defstruct(
        name, fields, bases=(base,), kw_only=True, forbid_unknown_fields=True, rename="camel", module=base.__module__
    )


@dataclass(frozen=True, slots=True)
class Checked:
    """What the rules decided about one resource's configs: the decisions, and the rewrites
    OVERRIDE asks for (config name to new value, :data:`REMOVE` to drop it)."""

    decisions: Decisions
    rewrites: dict[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ConfigRules:
    """The configured rules of one policy, by Kafka config name, and its blacklist."""

    rules: dict[str, ConfigRule]
    blacklist: Blacklist | None = None

    def check(self, configs: Iterable[tuple[str, str | None]], decisions: Decisions | None = None) -> Checked:
        """Checks ``(name, value)`` pairs (a None value: the config is not set by the request)."""
        checked = Checked(decisions if decisions is not None else Decisions())
        for name, value in configs:
            found: list[Violation] = []
            if self.blacklist is not None:
                _add(found, self.blacklist.check(name, value))
            rule = self.rules.get(name)
            if rule is not None and value is not None and not found:
                _add(found, _check_value(rule, name, value))
            for violation in found:
                checked.decisions.add(violation)
                if violation.action is Action.OVERRIDE:
                    checked.rewrites[name] = _as_config(violation.override)
        return checked


def config_rules(config: Any, table: Mapping[str, tuple[str, type[ConfigRule]]], keys: Iterable[str]) -> ConfigRules:
    """The :class:`ConfigRules` of a policy's config (the keys it set)."""
    rules = {table[key][0]: getattr(config, key) for key in keys if getattr(config, key) is not None}
    return ConfigRules(rules, getattr(config, "blacklist", None))


def apply_rewrites(entries: Iterable[Any], rewrites: Mapping[str, str | None]) -> tuple[Any, ...]:
    """Config entries (kio ``name``/``value`` entities) with the rewrites applied: a new value,
    or the entry dropped (:data:`REMOVE`)."""
    out: list[Any] = []
    for entry in entries:
        if entry.name not in rewrites:
            out.append(entry)
        elif rewrites[entry.name] is not REMOVE:
            out.append(dataclasses.replace(entry, value=rewrites[entry.name]))
    return tuple(out)


def refuse_override(rule: Any, key: str) -> None:
    """Refuses OVERRIDE where no value can replace the one at fault (a name, for instance)."""
    if rule is not None and rule.action is Action.OVERRIDE:
        raise InterceptorConfigError(f"{key}.action: OVERRIDE is not supported here (BLOCK or INFO)")


def _add(found: list[Violation], violation: Violation | None) -> None:
    if violation is not None:
        found.append(violation)


def _check_value(rule: ConfigRule, name: str, raw: str) -> Violation | None:
    """A config's string value checked by a rule, read as the rule's values are."""
    if isinstance(rule, RangeRule):
        try:
            number = float(raw)
        except ValueError:
            return Violation(f"{name} is '{raw}', must be a number", rule.action, name, raw, rule.override_value)
        return rule.check(name, int(number) if number.is_integer() else number)
    if isinstance(rule, ValuesRule):
        for part in (p.strip() for p in raw.split(",")):  # cleanup.policy may be "compact,delete"
            violation = rule.check(name, part)
            if violation is not None:
                return Violation(violation.reason, violation.action, name, raw, violation.override)
        return None
    reason = f"{name} is '{raw}', must be '{_as_config(rule.value)}'"  # as Kafka writes it: 'true'
    return rule.check(name, _typed_like(rule.value, raw), reason)


def _typed_like(expected: Any, raw: str) -> Any:
    """``raw`` read as the type of the rule's value (``"true"`` as True for a flag rule)."""
    if isinstance(expected, bool):
        lowered = raw.strip().lower()
        return {"true": True, "false": False}.get(lowered, raw)
    if isinstance(expected, int | float):
        try:
            return type(expected)(raw)
        except ValueError:
            return raw
    return raw


def _as_config(value: Any) -> str | None:
    """A config value as Kafka writes it (flags in lower case)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
