"""kio round trips over every captured frame: equal decoded messages, and equal bytes except where
the broker wrote tagged fields holding defaults (which kio omits; see ARCHITECTURE.md)."""

from kafka_captures import frames

from kanal.protocol.messages import decode_request, decode_response, encode_request, encode_response

# (api key, version) pairs whose captured responses carry default-valued tagged fields.
_TAGGED_DEFAULTS = {(18, 3), (18, 4), (1, 16), (19, 7)}


def test_every_captured_frame_round_trips() -> None:
    checked = 0
    for f in frames():
        if f.direction == "c2s":
            header, body = decode_request(f.frame)
            again = encode_request(body, header.correlation_id, header.client_id)
            assert bytes(again) == f.frame, (f.file, f.conn, f.seq)
        else:
            body = decode_response(f.api_key, f.api_version, f.frame)
            again = encode_response(body, f.correlation_id)
            assert decode_response(f.api_key, f.api_version, again) == body
            if (f.api_key, f.api_version) not in _TAGGED_DEFAULTS:
                assert bytes(again) == f.frame, (f.file, f.conn, f.seq, f.api_key, f.api_version)
        checked += 1
    assert checked == 311
