"""Probes of the fleet's other nodes: is each one's process still there?

A node killed outright (SIGKILL, a crashed host) stays a member of the fleet's group until its
session expires (``KAFKA_SESSION_TIMEOUT_MS``) and the group rebalances; meanwhile every node would
go on sending it clients. So each node connects to every other member's admin port
(``GATEWAY_HTTP_PORT``, announced in its member metadata) once a :data:`PROBE_INTERVAL`, and one that
refuses or does not accept within :data:`PROBE_TIMEOUT` is left out of the answers
(:meth:`~kanal.protocol.balance.LoadBalancer.set_unreachable`) until it accepts again or leaves the
group. A host name this node cannot resolve says nothing of the node (it may be a name only clients
resolve): its node is not left out. This is a hint for where to send clients, never membership: the
group alone says who is in the fleet (leadership, fleet-wide shares). The connection is opened and
closed without a request, so it costs the probed node an accept and nothing in its access log.
"""

from __future__ import annotations

import logging
import socket
from typing import Final

import trio

from kanal.protocol.balance import GatewayNode, LoadBalancer

log = logging.getLogger(__name__)

#: Seconds between two rounds of probes: how long a killed node's clients may be sent back to it.
PROBE_INTERVAL: Final = 1.0
#: Seconds a node has to accept a probe's connection (one on a live host accepts in microseconds).
PROBE_TIMEOUT: Final = 1.0


async def answers(node: GatewayNode, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether ``node`` accepts a connection on its admin port within ``timeout`` seconds (True
    when its host name does not resolve here: that is no sign of death)."""
    assert node.http_port is not None
    with trio.move_on_after(timeout):
        try:
            stream = await trio.open_tcp_stream(node.host, node.http_port)
        except socket.gaierror:
            return True
        except OSError:
            return False
        await stream.aclose()
        return True
    return False


async def _probe(node: GatewayNode, dead: set[bytes]) -> None:
    if not await answers(node):
        dead.add(node.identity)


async def probe_peers(balancer: LoadBalancer, interval: float = PROBE_INTERVAL) -> None:
    """Probes the other members of ``balancer`` every ``interval`` seconds, until cancelled."""
    while True:
        own = balancer.own.identity
        peers = [n for n in balancer.members if n.identity != own and n.http_port is not None]
        dead: set[bytes] = set()
        async with trio.open_nursery() as nursery:
            for node in peers:
                nursery.start_soon(_probe, node, dead)
        before = balancer.unreachable
        balancer.set_unreachable(dead)
        for node in peers:
            if node.identity in dead and node.identity not in before:
                log.warning(
                    "fleet node %s:%d does not accept connections on its admin port %d: its clients are sent"
                    " to the other nodes until it answers again or leaves the group",
                    node.host,
                    node.first_port,
                    node.http_port,
                )
            elif node.identity in before and node.identity not in dead:
                log.info("fleet node %s:%d answers again", node.host, node.first_port)
        await trio.sleep(interval)
