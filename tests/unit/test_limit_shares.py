"""How a fleet-wide limit is split between the nodes (``kanal_safeguards.limits.shares``), on pure
data: the allocation adds up to the limit whatever the reports say, a skewed load moves the shares
to the busy nodes (and the floor keeps an idle node able to start), members joining, leaving or
going stale are reserved their base share, and a simulated fleet holds the limit from the second
period on, as docs/safeguards-rate-limits.md says."""

from __future__ import annotations

import random

import pytest
from kanal_safeguards.limits.shares import (
    FLOOR,
    HEADROOM,
    IDLE,
    MAX_KEYS,
    STALE_AFTER,
    Demand,
    Report,
    allocate,
    busiest,
    floor_of,
    key_of,
    key_text,
    node_shares,
    usable_reports,
)

LIMIT = 10_000_000.0  # 10 MB/s
LIMITED = Demand(3_000_000.0, True)  # a node whose clients were held: it wants more


def test_without_usage_every_member_has_its_base_share() -> None:
    shares = allocate(LIMIT, {"a": IDLE, "b": IDLE, "c": IDLE})
    assert shares == pytest.approx({"a": LIMIT / 3, "b": LIMIT / 3, "c": LIMIT / 3})


def test_a_skewed_load_goes_to_the_busy_members_and_an_idle_one_keeps_the_floor() -> None:
    # 4 producers on a, 2 on b, none on c: a and b were held at their base share
    shares = allocate(LIMIT, {"a": LIMITED, "b": LIMITED, "c": IDLE})
    floor = FLOOR * LIMIT / 3
    assert shares["c"] == pytest.approx(floor)
    assert shares["a"] == pytest.approx((LIMIT - floor) / 2) == shares["b"]
    assert sum(shares.values()) == pytest.approx(LIMIT)


def test_a_member_not_held_gets_what_it_used_and_some_headroom_the_held_ones_the_rest() -> None:
    shares = allocate(LIMIT, {"a": LIMITED, "b": Demand(2_000_000, False), "c": IDLE})
    assert shares["b"] == pytest.approx(2_000_000 * (1 + HEADROOM))
    assert shares["c"] == pytest.approx(floor_of(LIMIT, 3))
    assert shares["a"] == pytest.approx(LIMIT - shares["b"] - shares["c"])


def test_room_left_when_nobody_is_held_is_split_equally() -> None:
    shares = allocate(LIMIT, {"a": Demand(1_000_000, False), "b": Demand(3_000_000, False)})
    extra = (LIMIT - 4_000_000 * (1 + HEADROOM)) / 2
    assert shares == pytest.approx({"a": 1_100_000 + extra, "b": 3_300_000 + extra})


def test_wants_above_the_fair_level_are_cut_to_it() -> None:
    # b used a lot without being held (the limit was raised, say): it cannot keep more than a fair part
    shares = allocate(LIMIT, {"a": LIMITED, "b": Demand(9_000_000, False)})
    assert shares == pytest.approx({"a": LIMIT / 2, "b": LIMIT / 2})


def test_a_member_without_a_report_is_reserved_its_base_share() -> None:
    shares = allocate(LIMIT, {"a": LIMITED, "b": IDLE, "new": None})
    assert shares["new"] == pytest.approx(LIMIT / 3)
    assert shares["b"] == pytest.approx(floor_of(LIMIT, 3))
    assert sum(shares.values()) == pytest.approx(LIMIT)


@pytest.mark.parametrize("seed", range(200))
def test_the_shares_never_add_up_to_more_than_the_limit(seed: int) -> None:
    rng = random.Random(seed)
    members = rng.randint(1, 7)
    limit = rng.choice([1.0, 7.0, 60.0, 1e6, 1.5e7])
    integral = limit < 100 and rng.random() < 0.7
    choices: list[Demand | None] = [None, IDLE]
    demands = {
        f"n{i}": rng.choice([*choices, Demand(rng.uniform(0, 2 * limit), rng.random() < 0.5)]) for i in range(members)
    }
    shares = allocate(limit, demands, integral=integral, order=str(seed))
    assert set(shares) == set(demands)
    assert all(share >= 0 for share in shares.values())
    if integral:
        assert all(share == int(share) for share in shares.values())
        assert sum(shares.values()) == int(limit)
    else:
        assert sum(shares.values()) == pytest.approx(limit)


def test_counts_are_whole_add_up_exactly_and_an_idle_member_can_still_start() -> None:
    # 10 commits a minute over 3 nodes, all of them on a: b and c keep one each
    shares = allocate(10, {"a": Demand(25, True), "b": IDLE, "c": IDLE}, integral=True, order='"group"')
    assert shares == {"a": 8.0, "b": 1.0, "c": 1.0}
    # no usage: 10 = 4 + 3 + 3, the extra unit somewhere
    even = allocate(10, {"a": IDLE, "b": IDLE, "c": IDLE}, integral=True)
    assert sorted(even.values()) == [3.0, 3.0, 4.0]


def test_a_count_limit_below_the_number_of_members_goes_where_it_is_used() -> None:
    shares = allocate(1, {"a": IDLE, "b": Demand(1, True), "c": IDLE}, integral=True, order='"g"')
    assert shares == {"a": 0.0, "b": 1.0, "c": 0.0}


def report(node: str, limits: dict[str, dict[str, Demand]], *, fallback: bool = False) -> Report:
    return Report(node, 1, fallback, limits)


LIMIT_ID = key_text(("producer-rate-limiting", "produce-10mb", None, None, None))
RULE = key_text(None)


def test_node_shares_follow_the_reports_of_the_live_members() -> None:
    reports = {
        "a": report("a", {LIMIT_ID: {RULE: LIMITED}}),
        "b": report("b", {LIMIT_ID: {RULE: LIMITED}}),
        "c": report("c", {}),  # enforces nothing yet: idle
    }
    shares = {me: node_shares(LIMIT_ID, LIMIT, ["a", "b", "c"], me, reports) for me in "abc"}
    assert sum(s.by_key[RULE] for s in shares.values()) == pytest.approx(LIMIT)
    assert shares["c"].by_key[RULE] == pytest.approx(floor_of(LIMIT, 3))
    # a key nobody reported (a new principal): base shares
    assert all(s.default == pytest.approx(LIMIT / 3) for s in shares.values())


def test_a_member_joining_is_reserved_its_base_share_and_one_leaving_frees_its_share() -> None:
    reports = {"a": report("a", {LIMIT_ID: {RULE: LIMITED}}), "b": report("b", {})}
    two = node_shares(LIMIT_ID, LIMIT, ["a", "b"], "a", reports)
    assert two.by_key[RULE] == pytest.approx(LIMIT - floor_of(LIMIT, 2))

    joined = {me: node_shares(LIMIT_ID, LIMIT, ["a", "b", "c"], me, reports) for me in "abc"}
    assert joined["c"].by_key[RULE] == pytest.approx(LIMIT / 3)  # no report yet: its base share
    assert sum(s.by_key[RULE] for s in joined.values()) == pytest.approx(LIMIT)

    # b left: its report (still in the topic) no longer counts
    assert node_shares(LIMIT_ID, LIMIT, ["a"], "a", reports).by_key == {}
    assert node_shares(LIMIT_ID, LIMIT, ["a"], "a", reports).default == LIMIT  # alone: the whole limit


def test_a_member_that_cannot_follow_the_reports_is_reserved_its_base_share() -> None:
    reports = {"a": report("a", {LIMIT_ID: {RULE: LIMITED}}), "b": report("b", {}, fallback=True)}
    shares = {me: node_shares(LIMIT_ID, LIMIT, ["a", "b"], me, reports) for me in "ab"}
    assert shares["b"].by_key[RULE] == pytest.approx(LIMIT / 2)
    assert shares["a"].by_key[RULE] == pytest.approx(LIMIT / 2)


def test_reports_per_key_are_shared_per_key() -> None:
    alice, bob = key_text(("team-a", "alice")), key_text(("team-a", "bob"))
    reports = {
        "a": report("a", {LIMIT_ID: {alice: LIMITED}}),
        "b": report("b", {LIMIT_ID: {bob: LIMITED, alice: Demand(500_000, False)}}),
    }
    a = node_shares(LIMIT_ID, LIMIT, ["a", "b"], "a", reports)
    b = node_shares(LIMIT_ID, LIMIT, ["a", "b"], "b", reports)
    assert b.by_key[alice] == pytest.approx(550_000) and a.by_key[alice] == pytest.approx(LIMIT - 550_000)
    assert a.by_key[bob] == pytest.approx(floor_of(LIMIT, 2))
    assert a.by_key[bob] + b.by_key[bob] == pytest.approx(LIMIT)


def test_stale_reports_and_reports_of_nodes_gone_are_ignored() -> None:
    now = 100.0
    fresh, stale = now - STALE_AFTER / 2, now - STALE_AFTER - 0.1
    received = {
        "b": (report("b", {}), fresh),
        "c": (report("c", {}), stale),  # killed: no report for a while
        "gone": (report("gone", {}), fresh),  # not a member any more
        "a": (report("a", {"old": {}}), fresh),  # this node's own, read back: its published one counts
    }
    own = (report("a", {}), fresh)
    usable = usable_reports(received, own, ["a", "b", "c"], "a", now)
    assert set(usable) == {"a", "b"} and usable["a"] is own[0]
    assert usable_reports(received, (own[0], stale), ["a", "b"], "a", now).keys() == {"b"}
    # a node that cannot read the topic computes base shares (and says so in its reports)
    assert usable_reports(received, own, ["a", "b"], "a", now, reading=False) == {}


def test_reports_and_keys_survive_the_topic() -> None:
    original = Report("n", 7, False, {LIMIT_ID: {RULE: Demand(1234.5, True), key_text(("v", None)): IDLE}})
    decoded = Report.decode(original.encode())
    assert decoded == original
    assert Report.decode(b"not json") is None and Report.decode(b'{"node": "n"}') is None
    for key in (None, "group-1", ("team-a", "alice"), (None, None)):
        assert key_of(key_text(key)) == key


def test_a_report_carries_the_busiest_keys_the_held_ones_first() -> None:
    demands = {key_text(f"p{i}"): Demand(float(i), False) for i in range(MAX_KEYS + 10)}
    demands[key_text("held")] = Demand(0.5, True)
    kept = busiest(demands)
    assert len(kept) == MAX_KEYS and key_text("held") in kept
    assert key_text("p0") not in kept and key_text(f"p{MAX_KEYS + 9}") in kept


# -- convergence: a fleet simulated period by period


def simulate(wanted: dict[str, float], periods: int, limit: float = LIMIT) -> list[float]:
    """Each period every node lets through min(what its clients want, its share), reports it (held
    when it wanted more), and every node computes its share from those reports. Returns the fleet's
    total per period."""
    members = sorted(wanted)
    reports: dict[str, Report] = {}
    totals = []
    for _ in range(periods):
        shares = {
            m: node_shares(LIMIT_ID, limit, members, m, reports).by_key.get(RULE, limit / len(members)) for m in members
        }
        assert sum(shares.values()) <= limit * (1 + 1e-9)
        used = {m: min(wanted[m], shares[m]) for m in members}
        totals.append(sum(used.values()))
        reports = {m: report(m, {LIMIT_ID: {RULE: Demand(used[m], wanted[m] > shares[m])}}) for m in members}
    return totals


def test_a_skewed_saturating_load_holds_the_limit_from_the_second_period() -> None:
    # 4 producers on a, 2 on b, none on c, each able to push 5 MB/s
    totals = simulate({"a": 20e6, "b": 10e6, "c": 0.0}, periods=6)
    assert totals[0] == pytest.approx(2 * LIMIT / 3)  # per node: two thirds of the limit
    for total in totals[1:]:
        assert LIMIT * (1 - FLOOR) <= total <= LIMIT


def test_a_mixed_load_converges_within_the_headroom() -> None:
    # a is held, b wants less than its base share, c is idle
    totals = simulate({"a": 20e6, "b": 2e6, "c": 0.0}, periods=6)
    for total in totals[1:]:
        assert LIMIT * (1 - FLOOR - HEADROOM * 0.2) <= total <= LIMIT


def test_a_member_growing_from_little_gets_its_fair_part_in_two_periods() -> None:
    members = ["a", "b"]
    reports = {
        "a": report("a", {LIMIT_ID: {RULE: Demand(9e6, True)}}),
        "b": report("b", {LIMIT_ID: {RULE: Demand(0.5e6, False)}}),
    }
    b = node_shares(LIMIT_ID, LIMIT, members, "b", reports).by_key[RULE]
    assert b == pytest.approx(0.55e6)
    # b's clients now want far more: it uses its share and is held; next period it has half
    reports["b"] = report("b", {LIMIT_ID: {RULE: Demand(b, True)}})
    assert node_shares(LIMIT_ID, LIMIT, members, "b", reports).by_key[RULE] == pytest.approx(LIMIT / 2)
