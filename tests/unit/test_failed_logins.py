"""The brute-force guard: failed logins per client host over a sliding minute."""

from __future__ import annotations

from kanal.net.authentication import FailedLogins


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_host_is_blocked_at_the_limit_until_its_failures_age_out() -> None:
    clock = Clock()
    failed = FailedLogins(3, clock=clock)
    for _ in range(2):
        failed.failed("10.0.0.1")
    assert not failed.blocked("10.0.0.1")
    clock.now += 30
    failed.failed("10.0.0.1")
    assert failed.blocked("10.0.0.1") and not failed.blocked("10.0.0.2")  # other hosts are not affected
    clock.now += 30  # the first two are a minute old now
    assert not failed.blocked("10.0.0.1")


def test_zero_means_no_limit_and_the_hosts_remembered_are_bounded() -> None:
    clock = Clock()
    unlimited = FailedLogins(0, clock=clock)
    for _ in range(100):
        unlimited.failed("10.0.0.1")
    assert not unlimited.blocked("10.0.0.1")
    bounded = FailedLogins(1, hosts=2, clock=clock)
    for host in ("a", "b", "c"):
        bounded.failed(host)
    assert not bounded.blocked("a") and bounded.blocked("b") and bounded.blocked("c")  # "a" was forgotten
