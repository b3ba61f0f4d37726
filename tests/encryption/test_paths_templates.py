"""Field paths and key id templates, as operators write them."""

from __future__ import annotations

import pytest
from kanal_encryption.paths import PathError, parse_path
from kanal_encryption.templates import RecordView, TemplateError, parse_template


@pytest.mark.parametrize(
    ("text", "steps"),
    [("a", ("a",)), ("a.b.c", ("a", "b", "c")), ("list[0].x", ("list", 0, "x")), ("m[1][2]", ("m", 1, 2))],
)
def test_paths_parse_into_steps(text: str, steps: tuple[object, ...]) -> None:
    assert parse_path(text).steps == steps


@pytest.mark.parametrize("text", ["", ".a", "a.", "a..b", "[0]", "a[x]", "a[0"])
def test_bad_paths_are_refused(text: str) -> None:
    with pytest.raises(PathError, match="field path"):
        parse_path(text)


def test_a_path_reads_and_replaces_a_field() -> None:
    document = {"card": {"number": "4111", "tags": [{"x": 1}]}}
    path = parse_path("card.tags[0].x")
    assert path.get(document) == (True, 1)
    path.set(document, "sealed")
    assert document["card"]["tags"][0]["x"] == "sealed"  # type: ignore[index]
    assert parse_path("card.missing").get(document) == (False, None)
    assert parse_path("card.tags[5]").get(document) == (False, None)


def test_a_template_reads_topic_key_header_and_value() -> None:
    template = parse_template("k-{{record.topic}}-{{ record.key }}-{{record.header.tenant}}-{{record.value.user.id}}")
    record = RecordView("orders", b"alice", {"tenant": b"blue"}, {"user": {"id": 42}})
    assert template.render(record) == "k-orders-alice-blue-42"
    assert template.constant is None and template.reads_key and template.headers == {"tenant"}
    assert [p.text for p in template.value_paths] == ["user.id"]
    assert parse_template("plain").constant == "plain"


def test_a_template_names_what_a_record_lacks() -> None:
    template = parse_template("{{record.header.tenant}}")
    with pytest.raises(TemplateError, match="no header 'tenant'"):
        template.render(RecordView("t", None, {}, None))
    with pytest.raises(TemplateError, match="no key"):
        parse_template("{{record.key}}").render(RecordView("t", None, {}, None))


@pytest.mark.parametrize("text", ["{{record.partition}}", "{{topic}}", "a-{{record.key"])
def test_unknown_placeholders_are_refused(text: str) -> None:
    with pytest.raises(TemplateError, match="key id"):
        parse_template(text)
