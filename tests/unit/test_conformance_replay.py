"""Replay edge cases: requests without responses, a gateway that sends what the capture lacks, a
response that never comes, and the scripted broker's synthesized answers."""

from __future__ import annotations

import io
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from kanal.conformance.capture import CaptureTap
from kanal.conformance.frames import C2S, G2U, U2G, Capture, Frame, read_frames, write_frames
from kanal.conformance.replay import Case, load_case, run_case
from kanal.conformance.scripted_broker import ScriptedBroker, convert
from kanal.protocol.api import response_class
from kanal.protocol.messages import decode_request, decode_response, encode_request

ROOT = Path(__file__).resolve().parents[2]
KAFKA = ROOT / "conformance" / "captures" / "kafka"


def test_produce_with_acks_0_is_forwarded_and_later_requests_still_answered(tmp_path: Path) -> None:
    """kafka-python conn 4 (ApiVersions, InitProducerId, Produce) with the Produce turned into
    acks=0 (no response in the capture) followed by the ApiVersions request again."""
    frames = [f for f in read_frames(KAFKA / "kafkapython.jsonl") if f.conn == 4]
    produce = next(f for f in frames if f.dir == C2S and f.api_key == 0)
    header, body = decode_request(produce.data)
    fire_and_forget = bytes(encode_request(replace(body, acks=0), header.correlation_id, header.client_id))
    kept = [f for f in frames if f.api_key != 0]
    again = [
        replace(f, seq=f.seq + 10, correlation_id=99, data=f.data[:4] + (99).to_bytes(4, "big") + f.data[8:])
        if f.dir == C2S
        else replace(f, seq=f.seq + 10, correlation_id=99, data=(99).to_bytes(4, "big") + f.data[4:])
        for f in frames
        if f.api_key == 18
    ]
    capture = [*kept, replace(produce, data=fire_and_forget), *again]
    path = tmp_path / "acks0.jsonl"
    write_frames(path, capture)
    (tmp_path / "acks0.case.yaml").write_text((KAFKA / "kafkapython.case.yaml").read_text())
    result = run_case(load_case(path))
    assert result.ok, result.report()
    assert result.responses == 3 and result.upstream_requests == 4


def test_a_fetch_pending_at_close_is_held_and_the_connection_released() -> None:
    capture = Capture.read(KAFKA / "aiokafka.jsonl")
    assert [e.response is None for e in capture.client[8]][-1]  # the last Fetch of conn 8
    result = run_case(load_case(KAFKA / "aiokafka.jsonl"))
    assert result.ok and result.seconds < 5  # no waiting for the held Fetch


def gateway_capture(tmp_path: Path) -> list[Frame]:
    out = io.BytesIO()
    assert run_case(load_case(KAFKA / "aiokafka.jsonl"), tap=CaptureTap(out)).ok
    path = tmp_path / "g.jsonl"
    path.write_bytes(out.getvalue())
    return read_frames(path)


def test_a_request_the_capture_cannot_answer_is_reported(tmp_path: Path) -> None:
    """A gateway-side capture whose upstream side lacks conn 2's CreateTopics: when the gateway
    forwards it, the scripted broker has nothing to answer and says so."""
    frames = [f for f in gateway_capture(tmp_path) if not (f.conn == 2 and f.api_key == 19 and f.dir in (G2U, U2G))]
    path = tmp_path / "missing.jsonl"
    write_frames(path, frames)
    case = Case("missing", path, timeout=2.0)
    result = run_case(case)
    assert not result.ok
    text = "\n".join(result.failures)
    assert "CreateTopics v3 response #4 (conn 2 seq 7): the gateway closed the connection instead of answering" in text
    assert (
        "scripted broker: CreateTopics v3 request upstream on conn 2: no captured CreateTopics v3 request of "
        "this connection is left to answer it"
    ) in text


def test_a_response_that_never_comes_times_out_with_its_label(tmp_path: Path) -> None:
    """The upstream side of conn 3 lost its Metadata answer: the broker holds the request, the
    client waits, and the runner reports the missing response after the case's timeout."""
    frames = [f for f in gateway_capture(tmp_path) if not (f.conn == 3 and f.api_key == 3 and f.dir == U2G)]
    path = tmp_path / "late.jsonl"
    write_frames(path, frames)
    result = run_case(Case("late", path, timeout=0.5))
    assert "Metadata v5 response #6 (conn 3 seq 7): no response within 0.5 s" in result.failures


def test_synthesized_answers_for_the_gateways_own_calls() -> None:
    broker = ScriptedBroker(Capture.read(KAFKA / "aiokafka.jsonl"))  # ApiVersions v0, Metadata v5 captured
    broker.address = ("127.0.0.1", 4242)
    versions = broker._api_versions(3)
    assert type(versions) is response_class(18, 3) and len(versions.api_keys) > 30
    metadata = broker._metadata(12)
    assert type(metadata) is response_class(3, 12)
    assert [(b.node_id, b.host, b.port) for b in metadata.brokers] == [(111, "127.0.0.1", 4242)]
    assert "cap-aiokafka" in {t.name for t in metadata.topics}
    # a v5 Metadata response re-expressed at v12 and back keeps every shared field
    captured = next(f for f in broker.capture.upstream_responses() if f.api_key == 3)
    v5 = decode_response(3, 5, captured.data)
    assert convert(convert(v5, response_class(3, 12)), response_class(3, 5)) == v5


def test_a_port_block_taken_meanwhile_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    import kanal.conformance.replay as replay_module

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        blocks = iter([busy.getsockname()[1]])
        real = replay_module.free_port_block
        monkeypatch.setattr(replay_module, "free_port_block", lambda n: next(blocks, None) or real(n))
        assert run_case(load_case(KAFKA / "aiokafka.jsonl")).ok
