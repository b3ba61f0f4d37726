"""Admin API routes of the gateway KMS (``kanal_admin_routes``): its key ids, and crypto shredding.

* ``GET /gateway/v2/encryption-key``: every key id of the keys topic, with its keys' uuids,
  algorithm, master key and creation time (never a key);
* ``GET /gateway/v2/encryption-key/<keyId>``: one key id (404 when there is none);
* ``DELETE /gateway/v2/encryption-key/<keyId>``: crypto shredding: writes a tombstone for each key of
  the key id (204; 404 when there is none). Everything encrypted with them is unreadable from then
  on, on this node at once and on the others as soon as they read the tombstones; records encrypted
  with that key id afterwards get a new key. Audited.

``<keyId>`` is the rendered key id (``user-alice``, a record key...), percent-encoded in the URL
(``/`` as ``%2F``, ``?`` as ``%3F``, ``%`` as ``%25``); ``gateway-kms://<keyId>`` is accepted too.
Any node answers for the whole fleet (they all follow the same topic).
"""

from __future__ import annotations

from typing import Any

import orjson
from quart import Response

from kanal.api import AdminRoutes, GatewayServices, ResourceError

from .kms.base import KmsError
from .kms.keystore import GATEWAY_KMS, KeyStore, StoredKey, keystore_of

__all__ = ["PREFIX", "add_routes"]

PREFIX = "/gateway/v2/encryption-key"


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body, option=orjson.OPT_INDENT_2), status, content_type="application/json")


def _describe(key_id: str, entries: list[StoredKey]) -> dict[str, Any]:
    return {
        "keyId": key_id,
        "keySecretId": GATEWAY_KMS + key_id,
        "keys": [
            {"uuid": e.uuid, "algorithm": e.algorithm, "masterKeyId": e.master, "createdAt": e.created_ms}
            for e in entries
        ],
    }


def _bare(key_id: str) -> str:
    return key_id[len(GATEWAY_KMS) :] if key_id.startswith(GATEWAY_KMS) else key_id


async def _synced(services: GatewayServices) -> KeyStore:
    store = keystore_of(services)
    try:
        await store.sync()
    except KmsError as exc:
        raise ResourceError(503, "Keys topic unavailable", str(exc)) from None
    return store


def add_routes(admin: AdminRoutes, services: GatewayServices) -> None:
    @admin.route(PREFIX, methods=["GET"])
    async def encryption_keys() -> Response:
        """The gateway KMS's key ids (crypto shredding), with their keys' uuids (no secrets)."""
        store = await _synced(services)
        return _json([_describe(key_id, store.entries(key_id)) for key_id in store.key_ids()])

    @admin.route(f"{PREFIX}/<path:key_id>", methods=["GET"])
    async def encryption_key(key_id: str) -> Response:
        """One key id of the gateway KMS (percent-encoded in the path)."""
        key_id = _bare(key_id)
        store = await _synced(services)
        entries = store.entries(key_id)
        if not entries:
            raise ResourceError(404, "Not found", f"no gateway KMS key id {key_id!r}")
        return _json(_describe(key_id, entries))

    @admin.route(f"{PREFIX}/<path:key_id>", methods=["DELETE"])
    async def delete_encryption_key(key_id: str) -> Response:
        """Crypto shredding: deletes a key id of the gateway KMS; what it encrypted is unreadable."""
        key_id = _bare(key_id)
        store = await _synced(services)
        if not store.entries(key_id):
            raise ResourceError(404, "Not found", f"no gateway KMS key id {key_id!r}")
        try:
            deleted = await store.delete(key_id)
        except KmsError as exc:
            raise ResourceError(503, "Keys topic unavailable", str(exc)) from None
        admin.audit("DELETE", kind="EncryptionKey", resourceName=key_id, keys=deleted, result="DELETED")
        return Response(b"", 204)
