"""The operator guide documents every setting the gateway accepts."""

from pathlib import Path

from kanal.config.settings import OPTIONS

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "operator-guide.md"


def test_every_setting_is_in_the_operator_guide() -> None:
    text = GUIDE.read_text()
    missing = [o.env for o in OPTIONS if f"`{o.env}`" not in text]
    assert not missing, f"undocumented settings: {missing}"
