"""The JSONL frame format: reading, writing, labelling and pairing frames."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kanal.conformance.frames import (
    C2G,
    C2S,
    G2C,
    G2U,
    S2C,
    U2G,
    Capture,
    CaptureFormatError,
    Frame,
    exchanges,
    is_frame_capture,
    label,
    read_frames,
    write_frames,
)

ROOT = Path(__file__).resolve().parents[2]
KAFKA = ROOT / "conformance" / "captures" / "kafka"


def test_reads_the_shared_captures_exactly() -> None:
    path = KAFKA / "rdkafka.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    frames = read_frames(path)
    assert len(frames) == len(lines) == 163
    first = frames[0]
    assert (first.conn, first.seq, first.dir, first.api_key, first.api_version, first.correlation_id) == (
        1,
        0,
        C2S,
        18,
        3,
        1,
    )
    assert [f.to_json() for f in frames] == lines  # writing gives back the same objects


def test_write_and_read_back_with_optional_fields(tmp_path: Path) -> None:
    frames = [
        Frame(1, 0, C2G, 1.5, 18, 3, 7, b"\x00\x12\x00\x03\x00\x00\x00\x07", node=111),
        Frame(1, 1, G2C, 1.6, 18, 3, 7, b"\x00\x00\x00\x07", node=111, redacted=("sasl",)),
    ]
    path = tmp_path / "c.jsonl"
    assert write_frames(path, frames) == 2
    assert read_frames(path) == frames
    assert '"node":111' in path.read_text() and '"redacted":["sasl"]' in path.read_text()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "invalid JSON"),
        ('{"conn": 1, "seq": 0, "dir": "c2s"}', "missing field 'frame'"),
        ('{"conn": 1, "seq": 0, "dir": "up", "frame": ""}', "dir must be one of"),
        ('{"conn": 1, "seq": 0, "dir": "c2s", "frame": "***"}', "c.jsonl:1"),
    ],
)
def test_format_errors_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(CaptureFormatError, match=message):
        read_frames(path)


def test_registry_captures_are_not_frame_captures() -> None:
    assert is_frame_capture(KAFKA / "aiokafka.jsonl")
    assert not is_frame_capture(ROOT / "conformance" / "captures" / "registry" / "karapace.jsonl")


def test_label_fills_api_fields_from_the_frames() -> None:
    original = read_frames(KAFKA / "kafkapython.jsonl")
    bare = [Frame(f.conn, f.seq, f.dir, f.t, None, None, None, f.data) for f in original]
    assert label(bare) == original


def test_exchanges_pair_by_correlation_id_and_keep_unanswered_requests() -> None:
    frames = read_frames(KAFKA / "aiokafka.jsonl")
    pairs = exchanges(frames, C2S)
    assert sorted(pairs) == list(range(1, 10))
    fetches = [e for e in pairs[8] if e.request.api_key == 1]
    assert [e.response is not None for e in fetches] == [True, False]  # the last Fetch was pending at close
    for conn_pairs in pairs.values():
        for e in conn_pairs:
            if e.response is not None:
                assert e.response.correlation_id == e.request.correlation_id
                assert (e.response.api_key, e.response.api_version) == (e.request.api_key, e.request.api_version)


def test_capture_views() -> None:
    broker_side = Capture.read(KAFKA / "aiokafka.jsonl")
    assert not broker_side.gateway_side
    assert broker_side.client is broker_side.upstream
    assert broker_side.response_dir == S2C and broker_side.upstream_response_dir == S2C

    gateway_side = Capture.from_frames(
        [
            Frame(1, 0, C2G, 0, 18, 0, 5, b"\x00\x12\x00\x00\x00\x00\x00\x05", node=111),
            Frame(1, 1, G2U, 0, 18, 0, 1, b"\x00\x12\x00\x00\x00\x00\x00\x01", node=111),
            Frame(1, 2, U2G, 0, 18, 0, 1, b"\x00\x00\x00\x01", node=111),
            Frame(1, 3, G2C, 0, 18, 0, 5, b"\x00\x00\x00\x05", node=111),
        ]
    )
    assert gateway_side.gateway_side
    assert gateway_side.client[1][0].response is not None and gateway_side.client[1][0].response.dir == G2C
    assert gateway_side.upstream[1][0].response is not None and gateway_side.upstream[1][0].response.dir == U2G
    assert gateway_side.node_of(1) == 111

    with pytest.raises(CaptureFormatError, match="mixes"):
        Capture.from_frames([Frame(1, 0, C2S, 0, 18, 0, 1, b""), Frame(2, 0, C2G, 0, 18, 0, 1, b"")])
