"""Failing some entities of a request and not the others (one topic of a CreateTopics, one resource
of an AlterConfigs): the request goes upstream without them, and their error entries are added to
the broker's response, in the request's order; when every entity fails, the answer is built here
and nothing goes upstream. Entries are built generically for the request's version (the entity class
is the response's tuple field type), so every version kio knows is covered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kanal.api import ErrorCode, build, has_field, nested, response_class

__all__ = ["Failed", "Key", "error_entry", "failed_response", "key_of", "merge_failed"]

#: What names an entity in both the request and the response: ``(field, value)`` pairs
#: (``(("name", "orders"),)`` for a topic, resource type and name for a config resource).
Key = tuple[tuple[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Failed:
    """An entity the gateway answers itself: its key, its error code and message."""

    key: Key
    message: str
    error_code: int = ErrorCode.policy_violation


def key_of(entity: Any, names: Sequence[str]) -> Key:
    return tuple((name, getattr(entity, name)) for name in names)


def error_entry(entity_cls: type, failed: Failed) -> Any:
    """The response entry of a failed entity (its message where the version has one)."""
    values: dict[str, Any] = dict(failed.key)
    values["error_code"] = ErrorCode(failed.error_code)
    if has_field(entity_cls, "error_message"):
        values["error_message"] = failed.message
    return build(entity_cls, **values)


def merge_failed(response: Any, field: str, failed: Sequence[Failed], order: Sequence[Key]) -> Any:
    """``response`` with the entries of ``failed`` added to its ``field``, all in ``order`` (the
    keys of the request's entities; entries the request did not name keep their place at the end)."""
    if not failed:
        return response
    entity_cls = nested(type(response), field)
    names = [name for name, _ in failed[0].key]
    entries = {key_of(entry, names): entry for entry in getattr(response, field)}
    for one in failed:
        entries[one.key] = error_entry(entity_cls, one)
    ordered = [entries.pop(key) for key in dict.fromkeys(order) if key in entries]
    return dataclasses.replace(response, **{field: (*ordered, *entries.values())})


def failed_response(api_key: int, version: int, field: str, failed: Sequence[Failed]) -> Any:
    """The whole response when every entity failed (nothing went upstream)."""
    cls = response_class(api_key, version)
    if cls is None:  # a version kio does not know is never decoded, so never reaches a hook
        raise LookupError(f"no response schema for api key {api_key} version {version}")
    entity_cls = nested(cls, field)
    return build(cls, **{field: tuple(error_entry(entity_cls, one) for one in failed)})
