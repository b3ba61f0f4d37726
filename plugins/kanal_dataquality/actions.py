"""What a policy does with a violation: the block message, the marking header, the violation text.

* Block: the partition's records are refused with ``INVALID_RECORD`` (87) and a message naming the
  policy, the record and the rules it broke (:func:`block_message`).
* Mark: the record is written with the header ``vendor.dataquality.violations`` whose value is a JSON
  object ``{policy name: [names of its failed rules]}`` (every marking policy the record broke; an
  existing header of that name is replaced). Block and mark together: only block applies.
* The violation text of a rule is its custom message, else ``<RULE_NAME> did not pass``; rules that
  broke together are joined with ``; ``.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from kanal.api import Record, RecordBatch
from kanal_dataquality.cel import Outcome
from kanal_dataquality.evaluate import Violation
from kanal_dataquality.policies import Plan
from kanal_dataquality.rules import CompiledRule

__all__ = ["INVALID_RECORD", "MARK_HEADER", "block_message", "details", "mark", "violation_text"]

INVALID_RECORD = 87
MARK_HEADER = "vendor.dataquality.violations"
_MAX_MESSAGE = 1000


def violation_text(rules: Sequence[CompiledRule]) -> str:
    return "; ".join(rule.message for rule in rules)


def details(rules: Sequence[CompiledRule], outcomes: Sequence[Outcome]) -> list[dict[str, str]]:
    """Per failed rule: its name, violation text and, for an evaluation error, the reason."""
    out = []
    for rule, outcome in zip(rules, outcomes, strict=True):
        item = {"rule": rule.name, "message": rule.message}
        if outcome.error:
            item["reason"] = outcome.error
        out.append(item)
    return out


def block_message(plan: Plan, violation: Violation, topic: str, partition: int, index: int) -> str:
    """The error message a blocked producer gets (in the Produce response's error_message)."""
    policy = plan.policies[violation.policy]
    rules = [plan.rules[i] for i in violation.rules]
    parts = []
    for rule, outcome in zip(rules, violation.outcomes, strict=True):
        parts.append(rule.message + (f" ({outcome.error})" if outcome.error else ""))
    names = ", ".join(r.name for r in rules)
    text = (
        f"Data quality policy '{policy.name}' blocked the batch for {topic}-{partition}: record {index} "
        f"violates rule{'s' if len(rules) > 1 else ''} {names}: {'; '.join(parts)}"
    )
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def mark(plan: Plan, violations: Sequence[Violation]) -> int:
    """Adds the marking header to the violating records of marking policies; returns how many records.

    Every violation of a marking policy carries its decoded ``record`` and ``batch``.
    """
    marks: dict[int, tuple[Record, dict[str, list[str]], RecordBatch | None]] = {}
    for v in violations:
        policy = plan.policies[v.policy]
        if not policy.mark or policy.block or v.record is None:
            continue
        entry = marks.get(id(v.record))
        if entry is None:
            entry = marks[id(v.record)] = (v.record, {}, v.batch)
        entry[1][policy.name] = [plan.rules[i].name for i in v.rules]
    changed: dict[int, RecordBatch] = {}
    for record, value, batch in marks.values():
        headers = [h for h in record.headers if h[0] != MARK_HEADER]
        headers.append((MARK_HEADER, orjson.dumps(value)))
        record.headers = headers
        if batch is not None:
            changed[id(batch)] = batch
    for batch in changed.values():
        batch.mark_changed()
    return len(marks)
