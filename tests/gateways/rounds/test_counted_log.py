"""The peers' counted contributions as ranges of iterations (gateways.rounds.counted_log)."""

from __future__ import annotations

from gateways.rounds.counted_log import CountedLog


def test_contiguous_runs_cost_one_range_whatever_their_length_and_order() -> None:
    log = CountedLog(since=0, max_ranges=8, skip="a")
    for it in range(10_000):
        log.add(0, (("a", it), ("b", it)))
    assert log.ranges() == 1  # b's run; a (this site) is not recorded
    log.add(0, (("c", 5),))
    log.add(0, (("c", 7),))
    log.add(0, (("c", 6),))  # fills the gap: one range again
    log.add(0, (("c", 4),))
    assert log.counted("c", 0, until=100, limit=100) == (0, (4, 5, 6, 7))
    assert log.ranges() == 2


def test_an_outcome_lists_what_was_counted_below_the_join_and_from_where_it_is_complete() -> None:
    log = CountedLog(since=10, max_ranges=8)
    for it in (*range(10, 20), *range(30, 40)):  # an outage between 20 and 30
        log.add(1, (("b", it),))
    since, its = log.counted("b", 1, until=35, limit=100)
    assert since == 10 and its == (*range(10, 20), *range(30, 35))
    # bounded: the newest (what a rejoining site left with), complete from the oldest listed on
    assert log.counted("b", 1, until=35, limit=7) == (18, (18, 19, 30, 31, 32, 33, 34))
    assert log.counted("x", 1, until=35, limit=7) == (10, ())  # nothing counted: known from the start
    assert log.counted("x", 1, until=4, limit=7) == (4, ())


def test_past_max_ranges_the_oldest_is_forgotten_and_the_record_starts_after_it() -> None:
    log = CountedLog(since=0, max_ranges=3)
    for it in (0, 2, 4, 6):  # four separate runs
        log.add(0, (("b", it),))
    assert log.ranges() == 3
    since, its = log.counted("b", 0, until=10, limit=10)
    assert since == 1 and its == (2, 4, 6)  # 1 is still known not counted; 0 no longer known
