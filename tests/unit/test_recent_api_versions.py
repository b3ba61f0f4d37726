"""RecentAnswers: ApiVersions answers kept per broker and version for a while, on bytes."""

from __future__ import annotations

from kanal.protocol.api_versions import RecentAnswers

# correlation id 7, error code 0, then the rest of a body (its content does not matter here)
OK = bytes.fromhex("00000007") + b"\x00\x00" + b"rest-of-the-body"
UNSUPPORTED = bytes.fromhex("00000007") + b"\x00\x23" + b"v0-body"


def test_an_answer_is_given_again_with_the_new_correlation_id_until_it_is_too_old() -> None:
    now = [100.0]
    answers = RecentAnswers(ttl=30.0, clock=lambda: now[0])
    assert answers.get(1, 3, 9) is None
    answers.learn(1, 3, bytearray(OK))
    again = answers.get(1, 3, 9)
    assert again == bytes.fromhex("00000009") + OK[4:]
    again[10:] = b"changed"  # a copy: what one client's writer does to it reaches no other client
    assert answers.get(1, 3, 10) == bytes.fromhex("0000000a") + OK[4:]
    assert answers.get(2, 3, 9) is None and answers.get(1, 4, 9) is None  # per broker, per version
    now[0] += 30.5
    assert answers.get(1, 3, 9) is None  # the next client asks the broker, which refreshes it


def test_only_successful_answers_are_kept() -> None:
    answers = RecentAnswers()
    answers.learn(1, 4, UNSUPPORTED)
    answers.learn(1, 4, b"\x00\x00")  # too short to be an answer
    assert answers.get(1, 4, 1) is None
