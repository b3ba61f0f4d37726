import json
import logging

import pytest

from kanal.logs import JsonFormatter, configure_logging


def test_json_lines_carry_connection_fields(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json", "info")
    logging.getLogger("kanal.test").warning(
        "closing client %s: %s",
        "10.0.0.1:5000",
        "bad frame",
        extra={"connection_id": 7, "client_id": "rdkafka", "api_key": "Produce"},
    )
    line = capsys.readouterr().err.strip().splitlines()[-1]
    entry = json.loads(line)
    assert entry["message"] == "closing client 10.0.0.1:5000: bad frame"
    assert (entry["level"], entry["logger"], entry["connection_id"], entry["client_id"], entry["api_key"]) == (
        "WARNING",
        "kanal.test",
        7,
        "rdkafka",
        "Produce",
    )
    assert entry["time"].endswith("Z")
    logging.getLogger().handlers.clear()


def test_exceptions_are_included() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, __file__, 1, "failed", (), __import__("sys").exc_info()
        )
    assert "ValueError: boom" in json.loads(JsonFormatter().format(record))["exception"]


def test_text_lines_name_the_connections_principal(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("text", "info")
    log = logging.getLogger("kanal.test")
    log.warning("closing client %s: %s", "10.0.0.1:5000", "bad frame", extra={"principal": "orders-app"})
    log.warning("closing client %s: %s", "10.0.0.2:5000", "bad frame", extra={"principal": None})
    first, second = capsys.readouterr().err.strip().splitlines()[-2:]
    assert first.endswith("closing client 10.0.0.1:5000: bad frame [principal=orders-app]")
    assert second.endswith("closing client 10.0.0.2:5000: bad frame")  # anonymous: nothing added
    logging.getLogger().handlers.clear()
