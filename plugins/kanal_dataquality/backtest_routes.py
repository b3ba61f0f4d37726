"""Admin API routes of backtests (``kanal_admin_routes``), under ``/gateway/v2/data-quality/backtest``.

Admin users only, reading included: a backtest reads a topic's records and its samples show them.

* ``POST /backtest``: starts a backtest (see :mod:`kanal_dataquality.backtest` for the body); answers
  202 with the job (``Location`` names it). ``?wait=true`` answers once it has finished (200), or with
  the job as it stands after ``maxSeconds`` and a margin (202).
* ``GET /backtest``: the backtests this node keeps (running, and finished ones for a while), in short.
* ``GET /backtest/<id>``: one backtest: its progress (records read, each partition's position) and,
  once finished, its report.
* ``DELETE /backtest/<id>``: cancels a running backtest (200, the job with what it evaluated so far), or
  forgets a finished one (204).

A backtest runs on the node that was asked: the jobs are this node's, not the fleet's. They are kept
by :class:`~kanal_dataquality.backtest_service.Backtests` (the console's pages show the same ones).
"""

from __future__ import annotations

import trio
from quart import Response, request

from kanal.api import AdminRoutes
from kanal_dataquality.backtest import parse_request
from kanal_dataquality.backtest_service import Backtests, stored_topic
from kanal_dataquality.resources import POLICY
from kanal_dataquality.routes import json_body, json_response

__all__ = ["add_backtest_routes", "stored_topic"]

PREFIX = "/gateway/v2/data-quality/backtest"
#: How much longer than its ``maxSeconds`` a ``?wait=true`` request waits for its backtest.
WAIT_MARGIN = 30.0
#: How long a DELETE waits for a cancelled backtest to stop (it stops at its next record batch).
CANCEL_WAIT = 10.0


def add_backtest_routes(admin: AdminRoutes, backtests: Backtests) -> None:
    """The routes over ``backtests`` (this node's jobs, shared with the console's pages)."""
    jobs = backtests.jobs
    find = backtests.find

    @admin.route(PREFIX, methods=["POST"], read_only=False)
    async def dq_backtest_start() -> Response:
        """Start a backtest of a stored or draft data quality policy over a range of a topic's records
        (admins only); ?wait=true answers once it has finished."""
        wanted = parse_request(await json_body())
        user = admin.current_user()
        job = await backtests.start(wanted, user.username if user is not None else None)
        admin.audit("BACKTEST", kind=POLICY, resourceName=job.policy.name, topic=wanted.topic, backtest=job.id)
        if request.args.get("wait", "false").lower() in ("true", "1", "yes"):
            with trio.move_on_after(wanted.max_seconds + WAIT_MARGIN):
                await job.done.wait()
        status = 200 if job.done.is_set() else 202
        return json_response(job.as_json(), status, {"Location": f"{PREFIX}/{job.id}"})

    @admin.route(PREFIX, methods=["GET"], read_only=False)
    async def dq_backtest_list() -> Response:
        """The backtests this node keeps: running ones, and finished ones for an hour (admins only)."""
        out = []
        for job in jobs.all():
            full = job.as_json()
            out.append(
                {
                    key: full[key]
                    for key in ("id", "state", "policy", "draft", "topic", "createdAt", "finishedAt", "user")
                }
                | {"recordsRead": full["progress"]["recordsRead"], "violations": full["progress"]["violations"]}
            )
        return json_response(out)

    @admin.route(f"{PREFIX}/<job_id>", methods=["GET"], read_only=False)
    async def dq_backtest_get(job_id: str) -> Response:
        """One backtest: its progress and, once finished, its report (admins only)."""
        return json_response(find(job_id).as_json())

    @admin.route(f"{PREFIX}/<job_id>", methods=["DELETE"], read_only=False)
    async def dq_backtest_cancel(job_id: str) -> Response:
        """Cancels a running backtest (answers the job as it stopped), or forgets a finished one (204)."""
        job = find(job_id)
        if job.state != "running":
            jobs.remove(job_id)
            return Response(b"", 204)
        job.cancel()
        with trio.move_on_after(CANCEL_WAIT):
            await job.done.wait()
        return json_response(job.as_json())
