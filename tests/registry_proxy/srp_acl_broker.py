"""A scripted Kafka endpoint that answers DescribeAcls, for the topic-acl tests.

Tansu, the test broker, implements neither CreateAcls nor DescribeAcls, so the topic-acl mode is
tested against this endpoint: a trio server (in a thread) that decodes requests with the gateway's
own protocol code (``kanal.protocol.messages``) and answers with kio messages: ApiVersions (offering
ApiVersions and DescribeAcls), and DescribeAcls from a table of bindings, with Kafka's MATCH
semantics for the name filter. ``error`` scripts a broker error, ``hang`` a broker that never answers.
"""

from __future__ import annotations

import contextlib
import struct
import threading
from typing import Any

import trio
from kanal_registry_proxy.acl import AclBinding

from kanal.api import ErrorCode, build, nested, response_class
from kanal.protocol.messages import decode_request, encode_response


class AclBroker:
    def __init__(self, bindings: list[AclBinding] | None = None) -> None:
        self.bindings = list(bindings or [])
        self.error: ErrorCode | None = None
        self.hang = False
        self.describe_calls = 0
        self.address = ""
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None

    def start(self) -> AclBroker:
        ready = threading.Event()

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as scope:
                self._scope = scope
                listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
                port = listeners[0].socket.getsockname()[1]
                self.address = f"127.0.0.1:{port}"
                ready.set()
                await trio.serve_listeners(self._serve, listeners)

        self._thread = threading.Thread(target=trio.run, args=(main,), daemon=True, name="acl-broker")
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._token is not None and self._scope is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        if self._thread is not None:
            self._thread.join(10)

    async def _serve(self, stream: trio.SocketStream) -> None:
        buffer = bytearray()
        try:
            while True:
                while len(buffer) < 4:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                (size,) = struct.unpack(">i", buffer[:4])
                while len(buffer) < 4 + size:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                frame = bytes(buffer[4 : 4 + size])
                del buffer[: 4 + size]
                header, body = decode_request(frame)
                answer = await self._answer(header.api_key, header.api_version, body)
                out = encode_response(answer, header.correlation_id)
                await stream.send_all(struct.pack(">i", len(out)) + out)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return

    async def _answer(self, key: int, version: int, body: Any) -> Any:
        cls = response_class(key, version)
        assert cls is not None
        if key == 18:
            entry = nested(cls, "api_keys")
            keys = (
                build(entry, api_key=18, min_version=0, max_version=3),
                build(entry, api_key=29, min_version=0, max_version=3),
            )
            return build(cls, error_code=ErrorCode.none, api_keys=keys)
        if key != 29:
            raise AssertionError(f"unexpected api key {key}")
        self.describe_calls += 1
        if self.hang:
            await trio.sleep_forever()
        resource_cls = nested(cls, "resources")
        acl_cls = nested(resource_cls, "acls")
        if self.error is not None:
            return build(cls, error_code=self.error, error_message="scripted failure", resources=())
        topic = body.resource_name_filter
        resources = []
        for b in self.bindings:
            if topic is not None and not b.applies_to(topic):
                continue
            acl = build(
                acl_cls, principal=b.principal, host=b.host, operation=b.operation, permission_type=b.permission
            )
            resources.append(
                build(
                    resource_cls,
                    resource_type=2,
                    resource_name=b.resource_name,
                    pattern_type=b.pattern_type,
                    acls=(acl,),
                )
            )
        return build(cls, error_code=ErrorCode.none, resources=tuple(resources))
