"""The console's "Marking violations" column reads the data-quality marking header."""

from __future__ import annotations

from kanal_dataquality.actions import MARK_HEADER
from kanal_dataquality.console.marks import marking_note

from kanal.api import ShownRecord


def record(*headers: tuple[str, bytes | None]) -> ShownRecord:
    return ShownRecord("orders", 0, 7, 0, None, b"{}", tuple(headers))


def test_a_marked_record_names_its_policies_and_rules() -> None:
    note = marking_note(
        record(("x", b"1"), (MARK_HEADER, b'{"orders": ["positive-amount", "shape"], "audit": ["id"]}'))
    )
    assert note is not None
    assert note.badge == "audit, orders"
    assert note.text == "audit: id; orders: positive-amount, shape"
    assert note.details is not None and '"positive-amount"' in note.details


def test_an_unmarked_or_unreadable_record() -> None:
    assert marking_note(record(("other", b"x"))) is None
    broken = marking_note(record((MARK_HEADER, b"not json")))
    assert broken is not None and broken.text == "an unreadable marking header" and broken.details == "not json"
