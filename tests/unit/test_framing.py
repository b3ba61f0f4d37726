import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kanal.protocol.framing import FrameReader, FrameTooLarge, InvalidFrame, frame


def test_frames_split_across_reads_come_out_whole_and_in_order() -> None:
    payloads = [b"a" * 10, b"", b"b" * 70000, b"c"]
    wire = b"".join(frame(p) for p in payloads)
    reader = FrameReader()
    out: list[bytes] = []
    for i in range(0, len(wire), 7):
        out.extend(bytes(f) for f in reader.feed(wire[i : i + 7]))
    assert out == payloads
    assert reader.buffered == 0


@given(st.lists(st.binary(max_size=300), max_size=20), st.integers(min_value=1, max_value=64))
def test_any_chunking_gives_the_same_frames(payloads: list[bytes], chunk: int) -> None:
    wire = b"".join(frame(p) for p in payloads)
    reader = FrameReader()
    out = []
    for i in range(0, len(wire), chunk):
        out.extend(bytes(f) for f in reader.feed(wire[i : i + chunk]))
    assert out == payloads


def test_oversized_length_is_refused_before_the_body_arrives() -> None:
    reader = FrameReader(max_frame_size=1024)
    with pytest.raises(FrameTooLarge, match="1025 bytes exceeds the maximum of 1024"):
        reader.feed(struct.pack(">i", 1025))
    assert reader.buffered <= 4


def test_huge_length_does_not_allocate() -> None:
    reader = FrameReader()
    with pytest.raises(FrameTooLarge):
        reader.feed(struct.pack(">i", 2**31 - 1) + b"xx")


def test_negative_length_is_invalid() -> None:
    with pytest.raises(InvalidFrame):
        FrameReader().feed(struct.pack(">i", -5))


def test_a_partial_frame_can_be_taken_over_for_cut_through() -> None:
    reader = FrameReader()
    wire = frame(b"\x00\x00\x00\x07" + b"x" * 100) + frame(b"next")
    assert reader.feed(wire[:10]) == []
    assert reader.take_partial() == (104, bytearray(b"\x00\x00\x00\x07xx"))
    # the caller reads the remaining 98 bytes itself; the reader starts at the next frame
    assert [bytes(f) for f in reader.feed(wire[4 + 104 :])] == [b"next"]


def test_no_partial_before_the_correlation_id() -> None:
    reader = FrameReader()
    reader.feed(frame(b"abcdefgh")[:6])
    assert reader.take_partial() is None
