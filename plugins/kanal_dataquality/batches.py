"""Running a plan over the batches of one partition: the generated loop, and large batches split.

Each batch goes through the plan's generated loop (:mod:`kanal_dataquality.scan`), which calls back for
every record some rule failed; a batch an earlier interceptor edited, or one the loop cannot walk,
goes through the gateway's codec and ``evaluate`` instead. The outcome is what ``evaluate`` gives on
the records in order (:mod:`kanal_dataquality.policies` says which violations count).

**Large batches, two cores.** The gateway runs in one thread. A batch whose records take at least
:data:`MIN_SPLIT` bytes (decompressed) is split at a record boundary: a helper process
(:class:`kanal.api.HelperProcess`) runs the plan's checks over the first records while the
gateway runs its loop over the rest (:data:`LOCAL_SHARE` of them). The helper answers only which of
its records the checks did not clearly pass (usually none), and the gateway then decides those with
the exact path, in order, before its own part's results: a blocking violation in the helper's part
comes first, as it would in one pass. The helper rebuilds the rules from their sources (compiled once
per plan in that process). The first large batch starts the helper in the background (batches stay in
the gateway until it is ready); should it fail, the gateway runs that part itself;
``DATA_QUALITY_HELPER_PROCESS=false`` keeps everything in the gateway.
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Callable, Sequence
from typing import Any, Final

import orjson

from kanal.api import NONE, HelperProcess, RecordBatch, records_area, skip_records
from kanal_dataquality.cel import PASSED, Outcome
from kanal_dataquality.evaluate import BatchResult, Violation, evaluate
from kanal_dataquality.policies import CompiledPolicy, Plan, build_plan
from kanal_dataquality.rules import CEL, JSON_SCHEMA, compile_rule
from kanal_dataquality.scan import Checker, Failed, compile_checker, compile_scanner

__all__ = [
    "LOCAL_SHARE",
    "MIN_SPLIT",
    "check_part",
    "may_split",
    "new_helper",
    "scan_batches",
    "scan_batches_split",
    "scan_range",
]

#: The smallest batch (bytes of records, decompressed) worth a helper's part: about 1,300 records of
#: 200 bytes.
MIN_SPLIT = 256 * 1024
#: The part of a split batch's records the gateway runs: it also receives, decodes and forwards the
#: request, and decides the records the helper reports.
LOCAL_SHARE: Final = 0.5


def new_helper(start_soon: Callable[..., None] | None = None) -> HelperProcess:
    """The data-quality helper process (it starts with the first large batch, in the background as a
    task of the gateway when ``start_soon`` is its ``services.start_soon``)."""
    return HelperProcess("kanal-data-quality-helper", check_part, start_soon)


def may_split(batch: RecordBatch) -> bool:
    """Whether a batch may be large enough to split: by its size, or for a compressed one by its
    record count (it is measured once decompressed)."""
    count = batch.records_count
    return count >= 2 and (batch.size >= MIN_SPLIT or (batch.compression != NONE and count >= MIN_SPLIT // 256))


def scan_batches(plan: Plan, batches: Sequence[RecordBatch]) -> BatchResult:
    """The plan over the batches of one partition, in the gateway."""
    run = _Run(plan)
    for batch in batches:
        blocked = run.batch(batch)
        if blocked is not None:
            return BatchResult(0, blocked, [])
    return BatchResult(run.base, None, run.violations)


def scan_range(plan: Plan, batch: RecordBatch, first: int, stop: int) -> list[Violation]:
    """The violations of records ``first`` to ``stop`` (indexes in the batch) of a plan with no blocking
    policy, by the same generated loop as :func:`scan_batches` (the codec where it cannot walk); each
    violation's ``index`` is the record's index in the batch. For backtests, which read whole batches
    of a topic and evaluate only the records of their range."""
    run = _Run(plan)
    if first == 0 and stop == batch.records_count:
        run.batch(batch)
        return run.violations
    try:
        if not batch.changed():
            data, start = records_area(batch)
            p = skip_records(data, start, first, len(data))
            end = skip_records(data, p, stop - first, len(data))
            blocked: list[Violation] = []
            run.scan(data, p, first, stop, run._failed(batch, blocked, run.violations), end)
            return run.violations
    except (IndexError, ValueError):  # not what the header says: the codec decides
        run.violations.clear()
    result = evaluate(plan, batch.records()[first:stop])
    for v in result.violations:
        v.index += first
        v.batch = batch
    return result.violations


async def scan_batches_split(plan: Plan, batches: Sequence[RecordBatch], helper: HelperProcess) -> BatchResult:
    """:func:`scan_batches`, with the first records of large batches checked by ``helper`` meanwhile."""
    run = _Run(plan)
    for batch in batches:
        blocked = await run.split_batch(batch, helper)
        if blocked is not None:
            return BatchResult(0, blocked, [])
    return BatchResult(run.base, None, run.violations)


class _Run:
    """The violations of one partition so far; ``base`` is the index of the next batch's first record."""

    def __init__(self, plan: Plan) -> None:
        scan = plan.scanner
        if scan is None:
            scan = plan.scanner = compile_scanner(plan)
        self.plan = plan
        self.scan = scan
        self.violations: list[Violation] = []
        self.base = 0

    def batch(self, batch: RecordBatch) -> Violation | None:
        """One batch in the gateway: the violation that blocks it, else None (its violations kept)."""
        kept = len(self.violations)
        try:
            if not batch.changed():  # else an earlier interceptor edited it: the codec has the records it sends
                data, start = records_area(batch)
                return self._scan(batch, data, start)
        except (IndexError, ValueError):  # not what the header says: the codec decides (and may refuse it)
            del self.violations[kept:]
        finally:
            self.base += batch.records_count
        return self._codec(batch)

    async def split_batch(self, batch: RecordBatch, helper: HelperProcess) -> Violation | None:
        """:meth:`batch`, the first records checked by ``helper`` when the batch is large."""
        if not may_split(batch) or batch.changed():
            return self.batch(batch)
        count = batch.records_count
        kept = len(self.violations)
        try:
            data, start = records_area(batch)
            if len(data) - start < MIN_SPLIT or not helper.started:
                if len(data) - start >= MIN_SPLIT:
                    helper.start()  # in the background: this batch, and those until it is ready, stay here
                return self._scan(batch, data, start)
            first = count - max(1, int(count * LOCAL_SHARE))  # the helper's records: 0 to first
            cut = skip_records(data, start, first, len(data))
            return await self._split(batch, helper, data, start, first, cut)
        except (IndexError, ValueError):
            del self.violations[kept:]
        finally:
            self.base += count
        return self._codec(batch)

    def _scan(self, batch: RecordBatch, data: bytes, start: int) -> Violation | None:
        """The generated loop over a whole batch; raises ValueError or IndexError where it cannot walk."""
        blocked: list[Violation] = []
        failed = self._failed(batch, blocked, self.violations)
        stopped = self.scan(data, start, 0, batch.records_count, failed, len(data))
        return blocked[0] if stopped else None

    async def _split(
        self, batch: RecordBatch, helper: HelperProcess, data: bytes, start: int, first: int, cut: int
    ) -> Violation | None:
        count = batch.records_count
        later: list[Violation] = []
        blocked_later: list[Violation] = []
        local = self._failed(batch, blocked_later, later)
        stopped, reply = await helper.run(
            [_sources(self.plan), first],
            memoryview(data)[start:cut],
            lambda: self.scan(data, cut, first, count, local, len(data)),
        )
        blocked: list[Violation] = []
        failed = self._failed(batch, blocked, self.violations)
        if reply is None:  # the helper could not: its part here
            if self.scan(data, start, 0, first, failed, cut):
                return blocked[0]
        elif reply[:1] == b"=":
            flagged = array("q")
            flagged.frombytes(reply[1:])
            for i in range(0, len(flagged), 3):
                index = flagged[i]
                if self.scan(data, start + flagged[i + 1], index, index + 1, failed, start + flagged[i + 2]):
                    return blocked[0]
        else:
            raise ValueError("the records do not fill their lengths")
        if stopped:
            return blocked_later[0]
        self.violations += later
        return None

    def _codec(self, batch: RecordBatch) -> Violation | None:
        """One batch through the gateway's codec and ``evaluate``; ``self.base`` is past it already."""
        result = evaluate(self.plan, batch.records())
        first = self.base - batch.records_count
        for v in (*result.violations, *((result.blocked,) if result.blocked else ())):
            v.index += first
            v.batch = batch
        self.violations += result.violations
        return result.blocked

    def _failed(self, batch: RecordBatch, blocked: list[Violation], violations: list[Violation]) -> Failed:
        """The loop's callback for a record some rule failed: a blocking violation goes to ``blocked``
        (the loop stops), the others to ``violations``."""
        plan = self.plan
        policy_rules, blockers, any_mark, base = plan.policy_rules, plan.blockers, plan.any_mark, self.base

        def failed(index: int, outcomes: tuple[Outcome, ...]) -> bool:
            bad = {i for i, o in enumerate(outcomes) if o is not PASSED and not o[0]}
            for p in blockers:
                broken = tuple(i for i in policy_rules[p] if i in bad)
                if broken:
                    outs = tuple(outcomes[i] for i in broken)
                    blocked.append(Violation(p, None, broken, outs, base + index, batch))
                    return True
            record = batch.records()[index] if any_mark else None
            for p, indexes in enumerate(policy_rules):
                broken = tuple(i for i in indexes if i in bad)
                if broken:
                    violations.append(
                        Violation(p, record, broken, tuple(outcomes[i] for i in broken), base + index, batch)
                    )
            return False

        return failed


def _sources(plan: Plan) -> list[list[str]]:
    """The plan's rules as the helper rebuilds them: ``[type, source]`` each."""
    return [[rule.type, rule.source] for rule in plan.rules]


def check_part(job: Any, part: bytes) -> bytes:
    """The helper process's job: ``=`` and the ``(index, start, end)`` of each record of ``part`` the
    checks did not clearly pass (int64 each), or ``!`` when the records do not walk."""
    sources, count = job
    check = _checker(tuple((kind, source) for kind, source in sources))
    try:
        flagged = _spans(part, check(part, 0, count, len(part)))
    except (IndexError, ValueError):
        return b"!"
    return b"=" + array("q", flagged).tobytes()


def _spans(part: bytes, indexes: list[int]) -> list[int]:
    """``(index, start, end)`` of the records at ``indexes`` (ascending) of a walked ``part``, flat."""
    out: list[int] = []
    p = at = 0
    for index in indexes:
        p = skip_records(part, p, index - at, len(part))
        end = skip_records(part, p, 1, len(part))
        out += (index, p, end)
        p, at = end, index + 1
    return out


@functools.lru_cache(maxsize=256)
def _checker(sources: tuple[tuple[str, str], ...]) -> Checker:
    """The checker of rules given as ``(type, source)`` pairs, compiled once per process."""
    rules = []
    for i, (kind, source) in enumerate(sources):
        if kind == CEL:
            spec: dict[str, Any] = {"type": CEL, "celExpression": source}
        elif kind == JSON_SCHEMA:
            spec = {"type": JSON_SCHEMA, "schema": orjson.loads(source)}
        else:
            raise ValueError(f"a {kind} rule does not run in the helper process")
        rules.append(compile_rule(f"rule-{i}", spec))
    policy = CompiledPolicy("", "", tuple(rules), (), block=False, mark=False, report=True, cluster="", observed=False)
    return compile_checker(build_plan([policy]))
