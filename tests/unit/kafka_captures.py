"""Captured Kafka frames for unit tests: the repo's conformance copy, else ../shared beside the repo."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class CapturedFrame:
    file: str
    conn: int
    seq: int
    direction: str
    api_key: int
    api_version: int
    correlation_id: int
    frame: bytes


def captures_dir() -> Path | None:
    for d in (REPO / "conformance" / "captures" / "kafka", REPO.parent / "shared" / "captures" / "kafka"):
        if d.is_dir() and any(d.glob("*.jsonl")):
            return d
    return None


def frames() -> Iterator[CapturedFrame]:
    d = captures_dir()
    if d is None:
        pytest.skip("no captured Kafka frames found")
    for path in sorted(d.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            o = json.loads(line)
            yield CapturedFrame(
                path.stem,
                o["conn"],
                o["seq"],
                o["dir"],
                o["api_key"],
                o["api_version"],
                o["correlation_id"],
                base64.b64decode(o["frame"]),
            )
