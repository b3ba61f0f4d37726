"""The Fetch response walk and splice, held to kio: what the walk finds is what kio decodes, and a
spliced frame decodes to the response with those records and error codes replaced."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from kanal.protocol.entities import build, nested
from kanal.protocol.fetch_records import RecordsEdit, fetch_records, splice_records
from kanal.protocol.headers import InvalidHeader
from kanal.protocol.messages import decode_response, encode_response, response_type

partition_specs = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(max_size=40)),  # records (None: null)
        st.sampled_from([0, 1, 3]),  # error code
        st.integers(0, 2),  # aborted transactions
    ),
    max_size=4,
)


def _response(version: int, topics: list[list[tuple[bytes | None, int, int]]]) -> Any:
    cls = response_type(1, version)
    topic_cls = nested(cls, "responses")
    part_cls = nested(topic_cls, "partitions")
    aborted_cls = nested(part_cls, "aborted_transactions")
    entries = []
    for t, parts in enumerate(topics):
        partitions = tuple(
            build(
                part_cls,
                partition_index=p,
                error_code=ErrorCode(code),
                records=records,
                preferred_read_replica=-1,
                aborted_transactions=tuple(build(aborted_cls, producer_id=a, first_offset=a) for a in range(aborted)),
            )
            for p, (records, code, aborted) in enumerate(parts)
        )
        name = {"topic_id": uuid.UUID(int=t + 1)} if version >= 13 else {"topic": f"topic-{t}"}
        entries.append(build(topic_cls, partitions=partitions, **name))
    return build(cls, responses=tuple(entries), session_id=7)


@settings(max_examples=60, deadline=None)
@given(version=st.sampled_from([12, 13, 16, 17]), topics=st.lists(partition_specs, max_size=3), data=st.data())
def test_the_walk_finds_what_kio_decodes_and_a_splice_replaces_exactly_that(
    version: int, topics: list[list[tuple[bytes | None, int, int]]], data: st.DataObject
) -> None:
    body = _response(version, topics)
    frame = bytes(encode_response(body, 42))
    found = fetch_records(frame, version)
    decoded = decode_response(1, version, frame)
    assert len(found) == len(decoded.responses)
    edits = []
    for topic, walked in zip(decoded.responses, found, strict=True):
        assert (walked.name, walked.topic_id) == ((None, topic.topic_id) if version >= 13 else (topic.topic, None))
        for part, spot in zip(topic.partitions, walked.partitions, strict=True):
            assert (spot.partition, spot.error_code) == (part.partition_index, part.error_code)
            assert (None if spot.start < 0 else frame[spot.start : spot.end]) == part.records
            new = data.draw(st.one_of(st.none(), st.binary(max_size=30)), label="records")
            code = data.draw(st.one_of(st.none(), st.sampled_from([0, 91])), label="error code")
            if new is not None or code is not None:
                edits.append(RecordsEdit(spot, new, code))
    spliced = splice_records(frame, edits)
    expected = decoded
    changes = {(e.partition.error_at): e for e in edits}
    responses = []
    for topic, walked in zip(decoded.responses, found, strict=True):
        parts = []
        for part, spot in zip(topic.partitions, walked.partitions, strict=True):
            edit = changes.get(spot.error_at)
            if edit is not None:
                if edit.records is not None:
                    part = replace(part, records=edit.records)
                if edit.error_code is not None:
                    part = replace(part, error_code=ErrorCode(edit.error_code))
            parts.append(part)
        responses.append(replace(topic, partitions=tuple(parts)))
    expected = replace(decoded, responses=tuple(responses))
    assert decode_response(1, version, spliced) == expected


def test_a_frame_that_does_not_add_up_is_refused() -> None:
    frame = bytes(encode_response(_response(16, [[(b"abc", 0, 0)]]), 1))
    with pytest.raises(InvalidHeader):
        fetch_records(frame[:-3], 16)
    with pytest.raises(InvalidHeader):
        fetch_records(frame + b"\x00", 16)
    with pytest.raises(InvalidHeader, match="flexible"):
        fetch_records(frame, 11)
