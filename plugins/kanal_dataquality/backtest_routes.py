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

A backtest runs on the node that was asked: the jobs are this node's, not the fleet's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import trio
from quart import Response, request

from kanal.api import AdminRoutes, ConfigError, GatewayServices, ResourceError, UpstreamError, invalid
from kanal_dataquality.backtest import BacktestJob, BacktestJobs, BacktestRequest, parse_request, topic_error
from kanal_dataquality.observe import ClusterReader
from kanal_dataquality.policies import CompiledPolicy, compile_policy
from kanal_dataquality.resources import POLICY, RULE
from kanal_dataquality.runtime import Runtime, compile_manifests

__all__ = ["add_backtest_routes", "stored_topic"]

PREFIX = "/gateway/v2/data-quality/backtest"
#: How much longer than its ``maxSeconds`` a ``?wait=true`` request waits for its backtest.
WAIT_MARGIN = 30.0
#: How long a DELETE waits for a cancelled backtest to stop (it stops at its next record batch).
CANCEL_WAIT = 10.0

VIRTUAL_CLUSTER = "VirtualCluster"
ALIAS_TOPIC = "AliasTopic"


def _json(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    response = Response(orjson.dumps(body, option=orjson.OPT_INDENT_2), status, content_type="application/json")
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


async def _body() -> Any:
    data = await request.get_data()
    if not data or not data.strip():
        raise invalid("a JSON body is required")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        raise invalid("the body is not valid JSON") from None


def stored_topic(store: Any, services: GatewayServices, topic: str, vcluster: str | None) -> str:
    """The name the backing cluster stores a topic under, as clients of ``vcluster`` (None: the
    passthrough cluster) name it: the gateway's own naming (``services.topic_names.stored``) for the
    passthrough cluster; for a virtual cluster its alias topic, else ``<virtual cluster><topic>`` (as
    docs/multi-tenancy.md says), read from the stored VirtualCluster and AliasTopic resources."""
    if vcluster is None:
        return services.topic_names.stored(topic)
    if not any(m["metadata"]["name"] == vcluster for m in store.resources(VIRTUAL_CLUSTER)):
        raise ResourceError(404, "Not found", f"virtual cluster {vcluster!r} does not exist")
    for alias in store.resources(ALIAS_TOPIC):
        metadata = alias["metadata"]
        if metadata["name"] == topic and metadata.get("vCluster") == vcluster:
            return str(alias["spec"]["physicalName"])
    return vcluster + topic


def add_backtest_routes(admin: AdminRoutes, runtime: Runtime, services: GatewayServices) -> None:
    store = admin.store
    jobs = BacktestJobs()

    async def resolve_policy(wanted: BacktestRequest) -> CompiledPolicy:
        """The policy to run, compiled with the live rules: a stored one, or a draft validated exactly
        as storing it would (the same 400s), without storing it."""
        if wanted.draft is not None:
            kind = admin.kinds.get(POLICY)
            if kind is None:  # pragma: no cover - this plugin registers it
                raise ResourceError(500, "Internal error", "the DataQualityPolicy kind is not registered")
            manifest = dict((await store.put(kind, wanted.draft, dry_run=True)).resource)
            manifest.pop("status", None)
        else:
            found = store.get(POLICY, (wanted.policy,))
            if found is None:
                raise ResourceError(404, "Not found", f"DataQualityPolicy {wanted.policy!r} does not exist")
            manifest = found
        rules = dict(runtime.engine.rules)  # the live compiled rules: the same functions the policy runs
        unknown = {name for name in manifest["spec"]["rules"] if name not in rules}
        if unknown:  # stored since the engine was built (or never compiled on this node): compiled here
            rules.update(compile_manifests([m for m in store.resources(RULE) if m["metadata"]["name"] in unknown])[0])
        policy = compile_policy(manifest, rules, runtime.checks.observed_clusters)
        if not policy.rules:
            raise invalid(
                f"policy {policy.name!r} has no rule that compiles on this gateway "
                f"(missing: {', '.join(policy.missing_rules)})"
            )
        return policy

    def reader_for(policy: CompiledPolicy, wanted: BacktestRequest) -> tuple[ClusterReader, str, bool]:
        """(reader, stored topic name, whether the backtest owns the reader's client)."""
        if policy.observed:
            if wanted.virtual_cluster is not None:
                raise invalid("virtualCluster applies to topics of the gateway's own cluster only")
            cluster = runtime.settings.clusters.get(policy.cluster)
            if cluster is None:
                raise invalid(f"cluster {policy.cluster!r} is not configured on this node (DATA_QUALITY_CLUSTERS)")
            properties = {"bootstrap.servers": cluster.bootstrap_servers, **cluster.properties}
            try:
                client = services.connect(properties)
            except ConfigError as exc:
                raise invalid(f"cluster {policy.cluster!r}: {exc}") from None
            return ClusterReader(client), wanted.topic, True
        if policy.cluster != runtime.gateway_cluster:
            raise invalid(
                f"policy {policy.name!r} targets cluster {policy.cluster!r}, which is neither this gateway "
                f"({runtime.gateway_cluster!r}) nor a cluster without a gateway configured here"
            )
        topic = stored_topic(store, services, wanted.topic, wanted.virtual_cluster)
        return ClusterReader(services.kafka), topic, False

    async def partitions_of(reader: ClusterReader, topic: str, wanted: BacktestRequest) -> list[int]:
        try:
            code, partitions = await reader.partitions(topic)
        except UpstreamError as exc:
            raise ResourceError(502, "Upstream error", f"cannot read the topics of the cluster: {exc}") from None
        if code:
            raise topic_error(code, wanted.topic)
        chosen = list(partitions)
        asked = set(wanted.partitions or ()) | (set(wanted.range.offsets) if wanted.range.kind == "offsets" else set())
        absent = sorted(asked - set(partitions))
        if absent:
            raise invalid(
                f"topic {wanted.topic!r} has no partition {absent[0]} "
                f"(it has {len(partitions)}: 0 to {len(partitions) - 1})"
            )
        if wanted.partitions is not None:
            chosen = [p for p in chosen if p in wanted.partitions]
        if wanted.range.kind == "offsets":
            chosen = [p for p in chosen if p in wanted.range.offsets]
        return chosen

    def find(job_id: str) -> BacktestJob:
        job = jobs.get(job_id)
        if job is None:
            raise ResourceError(404, "Not found", f"no backtest {job_id!r} on this node (finished ones are kept 1 h)")
        return job

    @admin.route(PREFIX, methods=["POST"], read_only=False)
    async def dq_backtest_start() -> Response:
        """Start a backtest of a stored or draft data quality policy over a range of a topic's records
        (admins only); ?wait=true answers once it has finished."""
        wanted = parse_request(await _body())
        policy = await resolve_policy(wanted)
        jobs.check_room()
        reader, topic, owned = reader_for(policy, wanted)
        try:
            partitions = await partitions_of(reader, topic, wanted)
            user = admin.current_user()
            job = BacktestJob(
                wanted,
                policy,
                topic,
                partitions,
                reader,
                runtime.registry,
                draft=wanted.draft is not None,
                user=user.username if user is not None else None,
                owns_client=owned,
            )
            jobs.add(job)
        except BaseException:
            if owned:
                await reader.aclose()
            raise
        admin.audit("BACKTEST", kind=POLICY, resourceName=policy.name, topic=wanted.topic, backtest=job.id)
        services.start_soon(job.run, name=f"data quality backtest {job.id}")
        if request.args.get("wait", "false").lower() in ("true", "1", "yes"):
            with trio.move_on_after(wanted.max_seconds + WAIT_MARGIN):
                await job.done.wait()
        status = 200 if job.done.is_set() else 202
        return _json(job.as_json(), status, {"Location": f"{PREFIX}/{job.id}"})

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
        return _json(out)

    @admin.route(f"{PREFIX}/<job_id>", methods=["GET"], read_only=False)
    async def dq_backtest_get(job_id: str) -> Response:
        """One backtest: its progress and, once finished, its report (admins only)."""
        return _json(find(job_id).as_json())

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
        return _json(job.as_json())
