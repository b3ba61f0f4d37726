"""Capturing through the gateway (tap, redaction, ``kanal capture``) and the ``kanal conformance``
command, without a live broker: the scripted broker stands in for it."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import yaml

from kanal.cli import main
from kanal.conformance.capture import REDACTED, CaptureTap, Redactor
from kanal.conformance.frames import C2G, C2S, G2C, G2U, S2C, U2G, Capture, Frame, read_frames
from kanal.conformance.replay import Case, load_case, run_case
from kanal.embedded.tansu import TansuBroker, free_port, free_port_block
from kanal.protocol.api import request_class, response_class
from kanal.protocol.entities import build
from kanal.protocol.messages import decode_request, decode_response, encode_request, encode_response
from kanal.protocol.records import RecordSet

ROOT = Path(__file__).resolve().parents[2]
KAFKA = ROOT / "conformance" / "captures" / "kafka"
CASES = ROOT / "conformance" / "cases"


@pytest.mark.parametrize("redact", [False, True], ids=["plain", "redacted"])
def test_a_capture_taken_by_the_gateway_replays_green(tmp_path: Path, redact: bool) -> None:
    """Replay the rdkafka capture with a capture tap on the gateway, then replay what the tap
    wrote: a gateway-side capture (c2g/g2u/u2g/g2c) is a golden case of its own."""
    out = io.BytesIO()
    tap = CaptureTap(out, redact_sasl=redact, redact_records=redact)
    assert run_case(load_case(KAFKA / "rdkafka.jsonl"), tap=tap).ok
    path = tmp_path / "through-gateway.jsonl"
    path.write_bytes(out.getvalue())

    frames = read_frames(path)
    assert {f.dir for f in frames} == {C2G, G2U, U2G, G2C}
    assert {f.node for f in frames} == {111}
    capture = Capture.read(path)
    assert capture.gateway_side and len(capture.client) == 15
    produce = [f for f in frames if f.dir == C2G and f.api_key == 0]
    assert len(produce) == 15
    assert all(f.redacted == (("records",) if redact else ()) for f in produce)
    result = run_case(Case("through-gateway", path))
    assert result.ok, result.report()
    assert result.responses == 81


def test_records_redaction_masks_keys_values_and_header_values() -> None:
    request = next(f for f in read_frames(KAFKA / "rdkafka.jsonl") if f.dir == C2S and f.api_key == 0)
    fetch = next(
        f for f in read_frames(KAFKA / "rdkafka.jsonl") if f.dir == S2C and f.api_key == 1 and len(f.data) > 1000
    )
    redactor = Redactor(records=True)
    for frame in (request, fetch):
        redacted = redactor(frame)
        assert redacted.redacted == ("records",)
        if frame.is_request:
            _, before_body = decode_request(frame.data)
            _, after_body = decode_request(redacted.data)
            pairs = list(
                zip(
                    *[[p.records for t in b.topic_data for p in t.partition_data] for b in (before_body, after_body)],
                    strict=True,
                )
            )
        else:
            before = decode_response(1, 16, frame.data)
            after = decode_response(1, 16, redacted.data)
            pairs = list(
                zip(*[[p.records for t in b.responses for p in t.partitions] for b in (before, after)], strict=True)
            )
        seen = 0
        for old, new in pairs:
            old_records = [r for _, r in RecordSet.parse(old)]
            new_records = [r for _, r in RecordSet.parse(new)]
            assert len(old_records) == len(new_records)
            for a, b in zip(old_records, new_records, strict=True):
                assert b.value == b"*" * len(a.value or b"") and b.key == (None if a.key is None else b"*" * len(a.key))
                assert [(k, v) for k, v in b.headers] == [(k, b"*" * len(v or b"")) for k, v in a.headers]
                seen += 1
        assert seen > 0


def test_sasl_redaction() -> None:
    redactor = Redactor(sasl=True)
    auth = encode_request(build(request_class(36, 2), auth_bytes=b"\x00alice\x00secret"), 3, "client")
    answer = encode_response(build(response_class(36, 2), auth_bytes=b"server-final"), 3)
    frames = [
        Frame(1, 0, C2S, 0, 36, 2, 3, bytes(auth)),
        Frame(1, 1, S2C, 0, 36, 2, 3, bytes(answer)),
    ]
    out = [redactor(f) for f in frames]
    assert decode_request(out[0].data)[1].auth_bytes == REDACTED
    assert decode_response(36, 2, out[1].data).auth_bytes == REDACTED
    assert all(f.redacted == ("sasl",) for f in out)
    assert b"secret" not in b"".join(f.data for f in out)

    # SaslHandshake v0: the raw token that follows (no Kafka header) is replaced whole
    handshake = encode_request(build(request_class(17, 0), mechanism="PLAIN"), 1, "client")
    raw_token = b"\x00alice\x00secret"
    metadata = encode_request(build(request_class(3, 1), topics=None), 2, "client")
    labelled = [
        Frame(2, 0, C2S, 0, 17, 0, 1, bytes(handshake)),
        Frame(2, 1, C2S, 0, None, None, None, raw_token),
        Frame(2, 2, S2C, 0, None, None, None, b""),
        Frame(2, 3, C2S, 0, 3, 1, 2, bytes(metadata)),
    ]
    out = [redactor(f) for f in labelled]
    assert out[0].data == bytes(handshake)  # mechanism names only
    assert out[1].data == REDACTED and out[2].data == REDACTED
    assert out[3].data == bytes(metadata)


def test_conformance_command_exit_codes_and_diffs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A fresh capture needs no case file: the replay applies the gateway's documented rewrites itself,
    # the ApiVersions floors included (from the gateway's own version table).
    (tmp_path / "aiokafka.jsonl").write_bytes((KAFKA / "aiokafka.jsonl").read_bytes())
    assert main(["conformance", "run", str(tmp_path)]) == 0
    assert "PASS aiokafka" in capsys.readouterr().out

    # A policy changes answers: undocumented differences fail, and --suggest writes the expectations.
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "policy.jsonl").write_bytes((KAFKA / "kafkapython.jsonl").read_bytes())
    (policy / "partition_policy.py").write_text((CASES / "partition-policy" / "partition_policy.py").read_text())
    golden = yaml.safe_load((CASES / "partition-policy" / "partition-policy.case.yaml").read_text())
    golden["capture"] = "policy.jsonl"
    (policy / "policy.case.yaml").write_text(yaml.safe_dump({**golden, "expect": []}))
    assert main(["conformance", "run", str(policy), "--suggest"]) == 1
    out = capsys.readouterr().out
    assert "FAIL policy:" in out
    assert "partition_responses[index=1].error_code: expected 0 (none), got 87 (invalid_record)" in out
    assert "# to document these differences, add to" in out
    assert "0 passed, 1 failed" in out

    (policy / "policy.case.yaml").write_text(yaml.safe_dump(golden))
    assert main(["conformance", "run", str(policy)]) == 0
    assert "PASS policy" in capsys.readouterr().out

    (policy / "policy.case.yaml").write_text("expect: [{path: a, value: 1}]\n")
    assert main(["conformance", "run", str(policy)]) == 2
    assert "needs a reason" in capsys.readouterr().err
    assert main(["conformance", "run", str(tmp_path / "nowhere")]) == 2


def test_stale_expectations_fail() -> None:
    case = load_case(CASES / "partition-policy" / "partition-policy.case.yaml")
    case.expectations[0].api_key = 3  # now aimed at Metadata, where no such path exists
    result = run_case(case)
    assert any(line.startswith("expectation never applied (stale?)") for line in result.failures)


@pytest.mark.integration
def test_kanal_capture_command(tmp_path: Path, tansu: TansuBroker) -> None:
    """``kanal capture`` in a child process in front of a real broker (it runs the gateway exactly
    like ``kanal run``, admin services included): a client's ApiVersions and Metadata are recorded on
    both sides, and SIGTERM ends the capture cleanly."""
    capture = Capture.read(KAFKA / "rdkafka.jsonl")
    requests = [e.request for e in capture.client[1]]  # ApiVersions v3, Metadata v12
    output = tmp_path / "live.jsonl"

    async def scenario() -> None:
        port = free_port_block(1)
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT / "core"),
            "KAFKA_BOOTSTRAP_SERVERS": tansu.bootstrap,
            "GATEWAY_BIND_HOST": "127.0.0.1",
            "GATEWAY_ADVERTISED_HOST": "127.0.0.1",
            "GATEWAY_PORT_START": str(port),
            "GATEWAY_PORT_COUNT": "1",
            "GATEWAY_MIN_BROKERID": str(tansu.node_id),
            "GATEWAY_HTTP_PORT": str(free_port()),
        }
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "kanal", "capture", "--output", str(output), "--redact-records"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert process.stdout is not None
        banner = b""
        try:
            with trio.fail_after(30):
                while b"capturing to" not in banner:
                    chunk = await process.stdout.receive_some()
                    assert chunk, banner.decode()
                    banner += chunk
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            for request in requests:
                await stream.send_all(len(request.data).to_bytes(4, "big") + request.data)
            received = b""
            with trio.fail_after(10):
                while len(_frames(received)) < len(requests):
                    received += await stream.receive_some()
            await stream.aclose()
            process.send_signal(signal.SIGTERM)
            rest = b""
            with trio.fail_after(30):
                while chunk := await process.stdout.receive_some():
                    rest += chunk
                assert await process.wait() == 0, (banner + rest).decode()
            assert b"frames written to" in rest
        finally:
            if process.returncode is None:
                process.kill()

    trio.run(scenario)
    frames = read_frames(output)
    for direction in (C2G, G2U, U2G, G2C):  # both requests were sent at once: directions interleave
        assert [f.api_key for f in frames if f.dir == direction] == [18, 3]
    assert frames[0].data == requests[0].data and frames[0].node == tansu.node_id


def _frames(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos + 4 <= len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        if pos + 4 + size > len(data):
            break
        out.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return out
