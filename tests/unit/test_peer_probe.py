"""Probes of the fleet's other nodes (:mod:`kanal.net.peer_probe`): a node whose admin port refuses
connections is left out of the answers at the next round, and brought back once it accepts again;
the group's member list is not touched. Real sockets on the loopback interface."""

from __future__ import annotations

import socket
from collections.abc import Callable

import trio

from kanal.net.peer_probe import answers, probe_peers
from kanal.protocol.balance import GatewayNode, LoadBalancer, client_key


def closed_port() -> int:
    """A loopback port nothing listens on (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def until(condition: Callable[[], object], what: str) -> None:
    """Waits (at most 10 s) for ``condition()`` to hold."""
    with trio.move_on_after(10):
        while not condition():
            await trio.sleep(0.01)
        return
    raise AssertionError(f"{what}: not within 10 s")


def test_a_listening_port_answers_and_a_closed_one_does_not() -> None:
    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        assert await answers(GatewayNode("127.0.0.1", 7000, 7000, http_port=port))
        assert not await answers(GatewayNode("127.0.0.1", 7000, 7000, http_port=closed_port()))
        # a name this node cannot resolve is no sign of death
        assert await answers(GatewayNode("no-such-host.invalid", 7000, 7000, http_port=port))
        for listener in listeners:
            await listener.aclose()

    trio.run(main)


def test_a_dead_node_is_left_out_until_it_answers_again() -> None:
    async def main() -> None:
        port = closed_port()
        own = GatewayNode("127.0.0.1", 7000, 7000, http_port=closed_port())  # never probed: itself
        alive = GatewayNode("127.0.0.1", 8000, 8000, http_port=port)
        dead = GatewayNode("127.0.0.1", 9000, 9000, http_port=closed_port())
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
        balancer = LoadBalancer(own, 111, lambda broker: ("127.0.0.1", 7000))
        balancer.members_changed([own, alive, dead])
        keys = [client_key("10.0.0.1", None, f"c{i}") for i in range(40)]

        def ports() -> set[int]:
            return {balancer.address_of(k)(111)[1] for k in keys}  # type: ignore[index]

        assert ports() == {7000, 8000, 9000}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe_peers, balancer, 0.05)
            await until(lambda: balancer.unreachable, "the dead node found")
            assert balancer.unreachable == {dead.identity}
            assert ports() == {7000, 8000} and balancer.members == (own, alive, dead)
            assert all(s.port != 9000 for k in keys for s in balancer.standbys(k, [111]))
            # it comes back: its port accepts again
            revived = await trio.open_tcp_listeners(dead.http_port, host="127.0.0.1")  # type: ignore[arg-type]
            await until(lambda: not balancer.unreachable, "the node seen alive again")
            assert ports() == {7000, 8000, 9000}
            nursery.cancel_scope.cancel()
        for listener in [*listeners, *revived]:
            await listener.aclose()

    trio.run(main)
