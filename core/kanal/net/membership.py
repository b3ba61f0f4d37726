"""The fleet membership's I/O: drives :class:`kanal.protocol.membership.GroupMember` over the gateway's
own upstream connections (TLS and SASL as ``KAFKA_*`` configure them).

One connection at a time, to a bootstrap server while the coordinator is being looked up, then to the
coordinator; it is the membership's own, so a JoinGroup waiting for a rebalance never holds up the
gateway's other calls, and a heartbeat never waits behind them. The service starts at once and joins
in the background: the node serves its clients from the start, during a cluster outage too, and
rejoins when the cluster is back. At shutdown the gateway calls :meth:`FleetMembership.leave` first,
before it drains its client connections.

Each new member list goes to the node's :class:`~kanal.protocol.balance.LoadBalancer` (with internal
load balancing), which the address rewriting of every client answer reads: the list is replaced
whole, never changed in place, so readers need no lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from kanal.config.upstream import UpstreamSettings
from kanal.net.upstream import Address, Bootstrap, BrokerCalls, reason
from kanal.protocol.balance import LoadBalancer, node_of
from kanal.protocol.membership import (
    Assigned,
    Event,
    FleetError,
    FleetStatus,
    GroupMember,
    IncompatibleMembership,
    Left,
    MemberConfig,
    NodeState,
    Rejoining,
    Unavailable,
    describe_detail,
    describe_request,
)

log = logging.getLogger(__name__)

CLIENT_ID = "kanal-fleet"
#: A call that fails for one of these is a connection problem (the cluster is down, the coordinator
#: moved): the membership retries, the node keeps serving.
_UNANSWERED = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, ValueError)


def _members_text(assigned: Assigned) -> str:
    parts = []
    for member in assigned.members:
        metadata = member.metadata
        parts.append(f"{metadata.host}:{metadata.first_port}" if metadata is not None else f"{member.member_id} (?)")
    return ", ".join(parts)


class FleetMembership:
    """This node's membership in its fleet's group: a companion service of the gateway."""

    def __init__(
        self,
        config: MemberConfig,
        upstream: UpstreamSettings,
        connect_timeout: float,
        max_frame_size: int,
        *,
        on_members: Callable[[int], None] = lambda count: None,
        on_fatal: Callable[[FleetError], None] = lambda error: None,
        balancer: LoadBalancer | None = None,
    ) -> None:
        self.config = config
        self.upstream = upstream
        self.connect_timeout = connect_timeout
        self.max_frame_size = max_frame_size
        self.on_members = on_members  # the member count, at each member list (the gauge)
        self.on_fatal = on_fatal  # what the node cannot go on with: the gateway stops
        self.balancer = balancer  # fed each member list (None: internal load balancing is off)
        self.member = GroupMember(config, 0.0)
        self.failure: FleetError | None = None
        self._bootstrap = Bootstrap(upstream.bootstrap_servers)
        self._calls: BrokerCalls | None = None
        self._address: Address | None = None  # the connection's broker; None: a bootstrap server
        self._loop = trio.CancelScope()
        self._started = False
        self._loop_done = trio.Event()
        self._member_ids: frozenset[str] = frozenset()

    @property
    def group_id(self) -> str:
        return self.config.group_id

    def status(self) -> FleetStatus:
        return self.member.status()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Joins and stays in the group until :meth:`leave` or cancellation; ready at once."""
        self.member = GroupMember(self.config, trio.current_time())
        self.on_members(len(self.member.status().members))
        self._started = True
        task_status.started()
        try:
            with self._loop:
                try:
                    await self._join_and_stay()
                except FleetError as exc:
                    await self._fail(exc)
            self._loop_done.set()
            await trio.sleep_forever()  # the connection stays for the leave; cancellation ends it
        finally:
            self._loop_done.set()
            await self._drop()

    async def leave(self, timeout: float) -> None:
        """Leaves the group (within ``timeout`` seconds): the others learn at once that this node is
        going, rather than after a session timeout. Not during an outage: nobody would hear it."""
        self._loop.cancel()
        if not self._started:
            return
        with trio.move_on_after(timeout) as leaving:
            await self._loop_done.wait()
            member = self.member
            if member.state is NodeState.OUTAGE:
                member.stop()
                log.info("fleet group %s: not leaving during the outage (its session expires)", self.group_id)
                return
            if member.leave(trio.current_time()):
                await self._step()
        if leaving.cancelled_caught:
            self.member.stop()
            log.warning("fleet group %s: no answer to LeaveGroup within %.1f s", self.group_id, timeout)

    # -- the loop ---------------------------------------------------------------------------------

    async def _join_and_stay(self) -> None:
        member = self.member
        while True:
            await trio.sleep_until(member.due())
            try:
                await self._step()
            except FleetError:
                raise
            except Exception:  # a bug here must not stop a node that serves its clients
                log.exception("fleet group %s: unexpected failure, retrying", self.group_id)
                await self._drop()
                member.connection_failed("unexpected failure (see the log)", trio.current_time())

    async def _step(self) -> None:
        """Sends the machine's next request and hands it the answer (or the failure)."""
        member = self.member
        previous = member.state
        try:
            calls = await self._connection()
            response = await calls.call(member.request(calls.request_class), member.request_timeout())
        except _UNANSWERED as exc:
            await self._drop()
            event = member.connection_failed(reason(exc), trio.current_time())
        except BaseException:  # cancelled mid-call (a leave, the gateway stopping): the connection is spent
            await self._drop()
            raise
        else:
            event = member.receive(response, trio.current_time())
        self._report(event, previous)

    async def _connection(self) -> BrokerCalls:
        """The connection the next request goes on: the coordinator's, or (to find it) any broker's."""
        member = self.member
        address: Address | None = None
        if member.to_coordinator:
            assert member.coordinator is not None
            address = (member.coordinator.host, member.coordinator.port)
        if self._calls is not None and (address is None or address == self._address):
            return self._calls
        await self._drop()
        with trio.fail_after(self.connect_timeout):  # (ApiVersions too: a hung broker must not hang the loop)
            if address is None:
                self._calls = await self._bootstrap.connect(self._open)
            else:
                self._calls = await self._open(address)
        self._address = address
        return self._calls

    async def _open(self, address: Address) -> BrokerCalls:
        return await BrokerCalls.open(address, self.upstream, self.connect_timeout, self.max_frame_size, CLIENT_ID)

    async def _drop(self) -> None:
        calls, self._calls, self._address = self._calls, None, None
        if calls is not None:
            with trio.CancelScope(shield=True):
                await calls.aclose()

    # -- what the operator sees -------------------------------------------------------------------

    def _report(self, event: Event, previous: NodeState) -> None:
        group = self.group_id
        state = self.member.state
        if previous is NodeState.OUTAGE and state is not NodeState.OUTAGE:
            log.info("fleet group %s: the backing cluster answers again", group)
        if isinstance(event, Assigned):
            ids = frozenset(m.member_id for m in event.members)
            changed = ids != self._member_ids
            self._member_ids = ids
            self.on_members(len(event.members))
            if self.balancer is not None:
                self.balancer.members_changed(node_of(m.metadata) for m in event.members if m.metadata is not None)
            (log.info if changed else log.debug)(
                "fleet group %s: generation %d, %d member(s)%s: %s",
                group,
                event.generation,
                len(event.members),
                " (this node leads)" if event.leader else "",
                _members_text(event),
            )
            for member in event.members:
                if member.error is not None:
                    log.warning(
                        "fleet group %s: member %s has unreadable metadata: %s", group, member.member_id, member.error
                    )
        elif isinstance(event, Rejoining):
            log.info("fleet group %s: rejoining (%s)", group, event.reason)
        elif isinstance(event, Unavailable):
            log.warning(
                "fleet group %s: the backing cluster does not answer (%s); serving clients meanwhile, rejoining"
                " when it is back",
                group,
                event.reason,
            )
        elif isinstance(event, Left):
            if event.failure is None:
                log.info("left the fleet group %s", group)
            else:
                log.warning("fleet group %s: leaving failed (%s); the session expires by itself", group, event.failure)

    async def _fail(self, error: FleetError) -> None:
        """Logs why the node cannot stay (with what the group holds, when it can tell) and hands the
        error to the gateway, which stops with its exit code."""
        self.member.stop()
        if isinstance(error, IncompatibleMembership):
            detail = await self._describe()
            if detail:
                log.error("fleet group %s: %s", self.group_id, detail)
        log.error("%s (exit code %d)", error, error.exit_code)
        self.failure = error
        self.on_fatal(error)

    async def _describe(self) -> str | None:
        """DescribeGroups, best effort (two seconds): what the refused node met."""
        coordinator = self.member.coordinator
        with trio.move_on_after(2.0):
            try:
                calls = self._calls
                if calls is None:  # (the group's coordinator answers for it)
                    if coordinator is None:
                        return None
                    calls = self._calls = await self._open((coordinator.host, coordinator.port))
                response: Any = await calls.call(describe_request(calls.request_class, self.group_id), 2.0)
                return describe_detail(response, self.group_id)
            except _UNANSWERED:
                return None
        return None
