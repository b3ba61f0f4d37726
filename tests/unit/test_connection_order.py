from kanal.net.connection import _sent_before


def test_sent_before_survives_correlation_id_wrap() -> None:
    assert _sent_before(5, 6) and not _sent_before(6, 5) and not _sent_before(5, 5)
    assert _sent_before(0x7FFFFFFF, 1)  # 1 was allocated after the wrap
    assert not _sent_before(1, 0x7FFFFFFF)
