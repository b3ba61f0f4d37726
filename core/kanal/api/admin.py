"""What ``kanal_admin_routes`` gets: the admin API as a plugin's routes see it.

The core's implementation is the admin app (:mod:`kanal.admin.app`); plugins depend on this protocol
only, so the admin plane can change behind it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from kanal.api.resources import Key, KindRegistry, Manifest, ResourceKind

__all__ = ["AdminRoutes", "AdminUser", "Change", "ResourceStore", "View"]

View = Callable[..., Awaitable[Any]]


class AdminUser(Protocol):
    """The caller of an admin route."""

    username: str
    admin: bool


class Change(Protocol):
    """The outcome of a ``put``: the canonical resource and ``Created``, ``Updated`` or ``NOT_CHANGED``."""

    key: Key
    resource: Manifest
    result: str


class ResourceStore(Protocol):
    """The stored resources of every kind (the same on every node of the fleet)."""

    def resources(self, kind: str) -> list[Manifest]:
        """Every stored resource of ``kind``."""

    def get(self, kind: str, key: Key) -> Manifest | None:
        """One stored resource, or None."""

    def with_status(self, kind: ResourceKind, manifest: Manifest) -> Manifest:
        """The manifest with its ``status`` on this node (Pending, Ready or Failed, and why)."""

    async def put(self, kind: ResourceKind, manifest: Any, *, dry_run: bool = False) -> Change:
        """Validates and stores a resource (raises ``ResourceError``, a 400, when it is invalid)."""

    async def delete(self, kind: ResourceKind, key: Key) -> None:
        """Deletes a resource (``ResourceError`` 404 when there is none)."""


class AdminRoutes(Protocol):
    """The admin API, for adding routes (see ``kanal_admin_routes``)."""

    @property
    def store(self) -> ResourceStore: ...

    @property
    def kinds(self) -> KindRegistry:
        """The resource kinds (``kinds.get(name)``, ``kinds.by_path(path)``)."""

    def route(
        self, rule: str, methods: Sequence[str] = ("GET",), *, read_only: bool | None = None
    ) -> Callable[[View], View]:
        """Registers a view behind the API's authentication: GET routes (and those marked
        ``read_only``) are open to every user, other methods to admin users only."""

    def current_user(self) -> AdminUser | None:
        """The authenticated caller of the current request."""

    def audit(self, action: str, **fields: Any) -> None:
        """Records an admin change with the caller and their address."""
