"""The backtest pages: a job's page (its progress, live, a Cancel button, then its report), the list
of this node's backtests, and what the policy pages need to start one (the form's fields, the request
they stand for, the start itself).

Backtests are the admin API's (:class:`~kanal_dataquality.backtest_service.Backtests`, kept on the
runtime): a backtest started here is ``GET /gateway/v2/data-quality/backtest/<id>`` too, and the
reverse. They read a topic's records and their samples show them, so every page and form here is for
admin users only, as the API's routes are; a start is audited (``BACKTEST``) as the API's is.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import trio

from kanal.api import ConsolePages, Manifest, invalid
from kanal_dataquality.backtest import (
    DEFAULT_LATEST,
    DEFAULT_MAX_RECORDS,
    DEFAULT_MAX_SECONDS,
    MAX_SECONDS,
    BacktestJob,
    parse_request,
)
from kanal_dataquality.backtest_service import Backtests
from kanal_dataquality.resources import POLICY, PREFIXED

__all__ = [
    "CANCEL_WAIT",
    "add_backtest_pages",
    "backtest_fields",
    "first_topic",
    "job_view",
    "range_text",
    "request_body",
    "start_backtest",
    "start_from_form",
]

#: How long Cancel waits for the backtest to stop (it stops at its next record batch) before showing it.
CANCEL_WAIT = 10.0
#: The job page's live region is refreshed this often (seconds) while the backtest runs.
REFRESH_SECONDS = 1
_STATE_BADGES: Mapping[str, str] = {"running": "warn", "done": "ok", "cancelled": "info", "failed": "bad"}


# -- the form ---------------------------------------------------------------------------------------


def first_topic(manifest: Manifest) -> str:
    """The policy's first literal target topic ("" when it only has prefixes): what a backtest of it
    reads unless the form names another."""
    for target in manifest["spec"].get("targets") or []:
        topic = str(target.get("topic") or "")
        if target.get("patternType") != PREFIXED and topic and not topic.endswith("*"):  # "*": a form's prefix
            return topic
    return ""


def backtest_fields(manifest: Manifest | None, form: Mapping[str, str] | None = None) -> dict[str, str]:
    """The backtest form's fields: as submitted (shown again with an error), else the defaults."""
    defaults = {
        "topic": first_topic(manifest) if manifest is not None else "",
        "range": "latest",
        "latest": str(DEFAULT_LATEST),
        "from": "",
        "to": "",
        "maxRecords": str(DEFAULT_MAX_RECORDS),
        "maxSeconds": f"{DEFAULT_MAX_SECONDS:g}",
    }
    if form is None:
        return defaults
    return {name: form.get(name, value) or "" for name, value in defaults.items()}


def request_body(form: Mapping[str, str], policy: str | Manifest, default_topic: str = "") -> dict[str, Any]:
    """The admin API's request body a backtest form stands for (checked by ``parse_request``, which
    names the field at fault); ``policy``: a stored policy's name or a draft manifest."""
    body: dict[str, Any] = {"policy": policy, "topic": (form.get("topic") or "").strip() or default_topic}
    if (form.get("range") or "latest") == "time":
        times = {key: (form.get(key) or "").strip() for key in ("from", "to")}
        if not any(times.values()):
            raise invalid("a time range needs a from time, a to time or both (UTC, e.g. 2026-01-31T12:00:00)")
        body["range"] = {key: text for key, text in times.items() if text}
    else:
        body["range"] = {"latest": (form.get("latest") or "").strip() or DEFAULT_LATEST}
    records = (form.get("maxRecords") or "").strip()
    if records:
        body["maxRecords"] = records
    seconds = (form.get("maxSeconds") or "").strip()
    if seconds:
        try:
            body["maxSeconds"] = float(seconds)
        except ValueError:
            raise invalid(f"maxSeconds must be a number of seconds above 0 and at most {MAX_SECONDS:g}") from None
    return body


async def start_backtest(console: ConsolePages, backtests: Backtests, body: Mapping[str, Any]) -> BacktestJob:
    """Starts the backtest ``body`` asks for, as the logged-in user, and audits it as the API does
    (raises the API's ResourceError when it is refused)."""
    wanted = parse_request(body)
    user = console.current_user()
    job = await backtests.start(wanted, user.username if user is not None else None)
    console.audit("BACKTEST", kind=POLICY, resourceName=job.policy.name, topic=wanted.topic, backtest=job.id)
    return job


# -- what the pages show ----------------------------------------------------------------------------


def _when(iso: str | None) -> str:
    """An API time (``2026-01-31T12:00:00.000Z``) as the pages show times (UTC, to the second)."""
    if not iso:
        return ""
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return iso


def _clock(ms: int | None) -> str:
    return "" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def range_text(range_json: Mapping[str, Any]) -> str:
    """A job's range in words."""
    if "latest" in range_json:
        return f"the latest {range_json['latest']:,} records of each partition"
    if "offsets" in range_json:
        parts = []
        for partition, bounds in range_json["offsets"].items():
            start = bounds.get("start", "the log start")
            end = bounds.get("end", "the end")
            parts.append(f"partition {partition}: {start} to {end}")
        return "offsets, " + "; ".join(parts)
    start = _when(range_json.get("from")) or "the log start"
    end = _when(range_json.get("to")) or "the end"
    return f"from {start} to {end} (UTC)"


def _fraction(partitions: list[Mapping[str, Any]]) -> float | None:
    """How much of the range is read, 0 to 1 (None until the partitions' ranges are known)."""
    total = read = 0
    for p in partitions:
        if p["start"] < 0 or p["end"] < p["start"]:
            return None
        total += p["end"] - p["start"]
        read += p["end"] - p["start"] if p["done"] else min(max(p["position"] - p["start"], 0), p["end"] - p["start"])
    return read / total if total else 1.0


def job_view(job: BacktestJob) -> dict[str, Any]:
    """A job as its page shows it: the API's JSON, with times, the range and the samples for people."""
    out = job.as_json()
    out["badge"] = _STATE_BADGES.get(out["state"], "info")
    out["rangeText"] = range_text(out["range"])
    out["created"] = _when(out["createdAt"])
    out["finished"] = _when(out["finishedAt"])
    out["fraction"] = _fraction(out["progress"]["partitions"])
    report = out["report"]
    if report is not None:
        report["chart"] = {
            "values": [r["violations"] for r in report["rules"]],
            "labels": [r["rule"] for r in report["rules"]],
        }
        for sample in report["samples"]:
            sample["when"] = _clock(sample.get("timestamp"))
    return out


def _summary(job: BacktestJob) -> dict[str, Any]:
    full = job.as_json()
    return {
        "id": job.id,
        "state": job.state,
        "badge": _STATE_BADGES.get(job.state, "info"),
        "policy": full["policy"],
        "draft": full["draft"],
        "topic": full["topic"],
        "recordsRead": full["progress"]["recordsRead"],
        "violations": full["progress"]["violations"],
        "user": full["user"] or "",
        "created": _when(full["createdAt"]),
        "finished": _when(full["finishedAt"]),
    }


# -- the pages --------------------------------------------------------------------------------------


def add_backtest_pages(console: ConsolePages, backtests: Backtests) -> None:
    """The job pages and the list (admin users only: a backtest's samples show records)."""

    def refusal() -> Any | None:
        """A 403 page for anyone but an admin user (None: an admin)."""
        user = console.current_user()
        if user is not None and user.admin:
            return None
        name = user.username if user is not None else ""
        return console.render(
            "console/message.html",
            403,
            title="Not allowed",
            message=f"Backtests read a topic's records: they are for admin users, and {name!r} is read-only.",
        )

    def missing(job_id: str) -> Any:
        return console.render(
            "console/message.html",
            404,
            title="Not found",
            message=f"There is no backtest {job_id!r} on this node (finished ones are kept for an hour).",
        )

    def title_of(job: BacktestJob) -> str:
        return f"Backtest of {'draft ' if job.draft else ''}policy {job.policy.name}"

    @console.page("data-quality/backtests")
    async def dq_backtests() -> Any:
        """This node's backtests, newest first: running ones, and finished ones for an hour."""
        refused = refusal()
        if refused is not None:
            return refused
        rows = [_summary(job) for job in reversed(backtests.jobs.all())]
        return console.render("dataquality/backtests.html", title="Backtests", rows=rows)

    @console.page("data-quality/backtests/<job_id>")
    async def dq_backtest(job_id: str) -> Any:
        """A backtest: what it reads, its progress (live while it runs), then its report."""
        refused = refusal()
        if refused is not None:
            return refused
        job = backtests.jobs.get(job_id)
        if job is None:
            return missing(job_id)
        return console.render(
            "dataquality/backtest.html", title=title_of(job), job=job_view(job), every=REFRESH_SECONDS, live=False
        )

    @console.page("data-quality/backtests/<job_id>/live")
    async def dq_backtest_live(job_id: str) -> Any:
        """The job page's live region alone (state, progress, report), refreshed by the page."""
        refused = refusal()
        if refused is not None:
            return refused
        job = backtests.jobs.get(job_id)
        if job is None:
            return missing(job_id)
        return console.render("dataquality/backtest_live.html", title=title_of(job), job=job_view(job), live=True)

    @console.page("data-quality/backtests/<job_id>/cancel", methods=["POST"])
    async def dq_backtest_cancel(job_id: str) -> Any:
        """Cancels a running backtest and shows it as it stopped, with what it evaluated so far."""
        job = backtests.jobs.get(job_id)
        if job is None:
            return missing(job_id)
        path = f"data-quality/backtests/{job_id}"
        if job.state != "running":
            return console.redirect(path, f"The backtest had finished already ({job.state}).")
        job.cancel()
        with trio.move_on_after(CANCEL_WAIT):
            await job.done.wait()
        return console.redirect(path, "Backtest cancelled.")


async def start_from_form(
    console: ConsolePages, backtests: Backtests, form: Mapping[str, str], policy: str | Manifest, default_topic: str
) -> Any:
    """Starts a backtest from a submitted form and redirects to its page; raises ResourceError (the
    API's refusal, for the form to show) otherwise."""
    job = await start_backtest(console, backtests, request_body(form, policy, default_topic))
    return console.redirect(f"data-quality/backtests/{job.id}", f"Backtest {job.id} started.")
