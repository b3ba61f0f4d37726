"""The topic page's "Marking violations" column: what the marking header of a record says.

A record a Mark policy caught carries ``vendor.dataquality.violations``, a JSON object of policy
names and the names of their failed rules (:mod:`kanal_dataquality.actions`). The console shows the
policies as the record's badge, the policies and rules as the column's text, and the header itself
as the details (spec 01: a policy badge, a Marking violations column and violation details).
"""

from __future__ import annotations

import json

import orjson

from kanal.api import RecordNote, ShownRecord
from kanal_dataquality.actions import MARK_HEADER

__all__ = ["COLUMN", "marking_note"]

COLUMN = "Marking violations"


def marking_note(record: ShownRecord) -> RecordNote | None:
    """What the marking header of ``record`` says (None: the record carries none)."""
    raw = record.header(MARK_HEADER)
    if raw is None:
        return None
    try:
        marks = orjson.loads(raw)
    except orjson.JSONDecodeError:
        marks = None
    if not isinstance(marks, dict) or not all(isinstance(v, list) for v in marks.values()):
        return RecordNote("marked", "an unreadable marking header", raw.decode("utf-8", errors="replace"))
    text = "; ".join(f"{policy}: {', '.join(map(str, rules))}" for policy, rules in sorted(marks.items()))
    return RecordNote(", ".join(sorted(marks)), text, json.dumps(marks, indent=2, ensure_ascii=False))
