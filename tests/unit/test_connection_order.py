from kanal.net.connection import _sent_before


def test_sent_before_survives_correlation_id_wrap() -> None:
    assert _sent_before(5, 6) and not _sent_before(6, 5) and not _sent_before(5, 5)
    assert _sent_before(0x7FFFFFFF, 1)  # 1 was allocated after the wrap
    assert not _sent_before(1, 0x7FFFFFFF)


def test_tail_of_chunks() -> None:
    from kanal.net.connection import _tail

    chunks: list[bytes | bytearray] = [b"abcd", bytearray(b"efg"), b"hij"]
    assert [bytes(_tail(chunks, n)) for n in (0, 3, 4, 6, 10)] == [b"abcdefghij", b"defghij", b"efghij", b"ghij", b""]
