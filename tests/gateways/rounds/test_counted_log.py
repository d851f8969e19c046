"""The peers' counted contributions as ranges of iterations (gateways.rounds.counted_log)."""

from __future__ import annotations

from gateways.rounds.counted_log import CountedLog
from wanrt.protocol.peer.contrib_ids import as_ids


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


def _all(sites: list[str], it: int) -> tuple[tuple[str, int], ...]:
    return tuple((s, it) for s in sites)


def test_results_naming_many_sites_extend_one_run_per_layer() -> None:
    sites = [f"s{i:03d}" for i in range(40)]
    log = CountedLog(since=0, max_ranges=8, skip="s000")
    for it in range(100):
        log.add(0, as_ids(_all(sites, it)))
    assert log.ranges() == 1  # one run for the whole layer, not one range per site
    assert log.counted("s017", 0, until=100, limit=5) == (95, (95, 96, 97, 98, 99))
    assert log.counted("zz", 0, until=100, limit=5) == (0, ())


def test_a_site_missing_from_a_result_is_not_listed_for_it_and_a_late_result_goes_per_site() -> None:
    sites = [f"s{i:03d}" for i in range(20)]
    log = CountedLog(since=0, max_ranges=8)
    for it in range(10):
        log.add(0, as_ids(_all(sites, it)))
    log.add(0, as_ids(_all(sites[:-1], 10)))  # s019 late in round 10: a new run without it
    log.add(0, as_ids(_all(sites, 11)))
    log.add(0, as_ids(_all(sites, 12)))
    log.add(0, as_ids((("s019", 10), *_all(sites[:5], 9))))  # a late result: older than the newest run
    assert log.counted("s019", 0, until=13, limit=100) == (0, tuple(range(13)))
    assert log.counted("s000", 0, until=13, limit=100) == (0, tuple(range(13)))
    assert log.counted("s018", 0, until=11, limit=3) == (8, (8, 9, 10))


def test_past_max_ranges_the_oldest_run_is_forgotten() -> None:
    sites = [f"s{i:03d}" for i in range(20)]
    log = CountedLog(since=0, max_ranges=2)
    for it in (0, 2, 4):  # three separate runs (gaps between them)
        log.add(0, as_ids(_all(sites, it)))
    assert log.counted("s003", 0, until=10, limit=10) == (1, (2, 4))
