"""How the console's topic page shows keys and values (:mod:`kanal.admin.console.records_view`)."""

from __future__ import annotations

from kanal.admin.console.records_view import MAX_SHOWN, framed_schema_id, show_bytes, show_decoded


def test_json_is_pretty_printed() -> None:
    shown = show_bytes(b'{"a": [1, 2], "b": "\xc3\xa9"}')
    assert shown.kind == "json" and shown.text == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": "é"\n}'
    assert show_bytes(b"42").kind == "json" and show_bytes(b"true").kind == "json"


def test_text_that_is_not_json_stays_text() -> None:
    assert show_bytes(b"{not json").kind == "text"
    assert show_bytes("line one\nline two\tü".encode()).text == "line one\nline two\tü"
    assert show_bytes(b"nope").kind == "text"  # starts like null, is not


def test_binary_is_a_hex_preview_naming_a_schema_id() -> None:
    framed = bytes([0, 0, 0, 1, 2, 0x80, 0x81])
    assert framed_schema_id(framed) == 258
    assert show_bytes(framed).text == "schema id 258, 7 bytes: 00 00 00 01 02 80 81"
    assert show_bytes(b"\x01\x02\xff").text == "3 bytes: 01 02 ff"
    assert show_bytes(b"bell\x07").kind == "binary"  # control characters are not text
    big = show_bytes(bytes(range(256)) * 2)
    assert big.cut and big.text.count(" ") < 100
    assert framed_schema_id(b"\x00ab") is None and framed_schema_id(None) is None


def test_long_values_are_cut_and_null_is_null() -> None:
    shown = show_bytes(b"x" * (MAX_SHOWN + 10))
    assert shown.cut and len(shown.text) == MAX_SHOWN
    assert show_bytes(None).kind == "null"
    assert show_decoded("avro", {"id": 1}).text == '{\n  "id": 1\n}'
