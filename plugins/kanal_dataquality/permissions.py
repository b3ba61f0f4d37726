"""Who may manage data quality resources.

The admin API's users (``GATEWAY_ADMIN_API_USERS``) are either admins or read-only; the gateway has no
notion of groups. The plugin adds one: ``DATA_QUALITY_GROUPS`` maps a group name to its members (admin
API user names) and permissions, of which there is one, ``ManageDataQuality`` (the permission on the
gateway cluster; it is the gateway's own setting, so it cannot be set on an underlying Kafka cluster)::

    DATA_QUALITY_GROUPS='{team-orders: {members: [alice], permissions: [ManageDataQuality]}}'

Rules (checked on the plugin's routes ``PUT /gateway/v2/data-quality/<kind>`` and
``DELETE /gateway/v2/data-quality/<kind>/<name>``; the generic ``/gateway/v2/<kind>`` routes stay
admin-only):

* admins may do anything;
* a policy (created, changed or deleted) must be owned by a group (``metadata.group``) in which the user
  holds ``ManageDataQuality``, before and after the change;
* an alert likewise, by its ``metadata.group``, and its policy must be owned by such a group too;
* a rule has no owner: a user holding ``ManageDataQuality`` in some group may create one, and change or
  delete one only when every policy using it is owned by one of the user's groups.

Changing a group's permissions changes nothing in the policies it already owns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from kanal.api import ResourceError
from kanal_dataquality.resources import ALERT, POLICY, RULE
from kanal_dataquality.settings import MANAGE_DATA_QUALITY, Group

__all__ = ["authorize", "managing_groups"]


class _User(Protocol):
    @property
    def username(self) -> str: ...

    @property
    def admin(self) -> bool: ...


class _Store(Protocol):
    def resources(self, kind: str) -> list[dict[str, Any]]: ...


def managing_groups(username: str, groups: Mapping[str, Group]) -> set[str]:
    return {g.name for g in groups.values() if username in g.members and MANAGE_DATA_QUALITY in g.permissions}


def _forbidden(msg: str) -> ResourceError:
    return ResourceError(403, "Forbidden", msg)


def _group_of(manifest: Any) -> str | None:
    if isinstance(manifest, Mapping) and isinstance(manifest.get("metadata"), Mapping):
        group = manifest["metadata"].get("group")
        return group if isinstance(group, str) else None
    return None


def authorize(
    user: _User | None,
    groups: Mapping[str, Group],
    kind: str,
    new: Any,
    current: Mapping[str, Any] | None,
    store: _Store,
) -> None:
    """Raises 401/403 unless ``user`` may write ``new`` (None: delete) over ``current``."""
    if user is None:
        raise ResourceError(401, "Unauthorized", "valid HTTP Basic credentials of an admin API user are required")
    if user.admin:
        return
    mine = managing_groups(user.username, groups)
    if not mine:
        raise _forbidden(
            f"user {user.username!r} is not an admin and holds {MANAGE_DATA_QUALITY} in no group (DATA_QUALITY_GROUPS)"
        )
    if kind in (POLICY, ALERT):
        for manifest, what in ((new, "the new"), (current, "the current")):
            if manifest is None:
                continue
            group = _group_of(manifest)
            if group not in mine:
                raise _forbidden(
                    f"{what} {kind} is owned by group {group!r}; user {user.username!r} holds {MANAGE_DATA_QUALITY} "
                    f"only in {', '.join(sorted(mine))}"
                )
        if kind == ALERT:
            for manifest in (new, current):
                spec = manifest.get("spec") if isinstance(manifest, Mapping) else None
                policy_name = spec.get("policyName") if isinstance(spec, Mapping) else None
                policy = next((p for p in store.resources(POLICY) if p["metadata"]["name"] == policy_name), None)
                if policy is not None and _group_of(policy) not in mine:
                    raise _forbidden(f"policy {policy_name!r} is owned by group {_group_of(policy)!r}, not yours")
        return
    if kind == RULE and current is not None:
        name = current["metadata"]["name"]
        for policy in store.resources(POLICY):
            if name in policy["spec"].get("rules", ()) and _group_of(policy) not in mine:
                raise _forbidden(
                    f"rule {name!r} is used by policy {policy['metadata']['name']!r} of group {_group_of(policy)!r}; "
                    "only its group's managers or an admin may change it"
                )
