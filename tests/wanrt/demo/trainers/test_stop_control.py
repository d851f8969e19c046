"""Every trainer stops before the same iteration, however far apart they are when the stop is decided."""

from __future__ import annotations

import multiprocessing

from wanrt.demo.trainers.stop_control import StopControl


def make(runs: int = 2) -> StopControl:
    return StopControl(multiprocessing.get_context("spawn"), runs)


def test_max_iters_bounds_a_run_that_never_reaches_its_target() -> None:
    stops = make()
    stops.arm(0, 3)
    assert [stops.may_start(0, i) for i in range(5)] == [True, True, True, False, False]


def test_the_stop_lands_after_the_furthest_iteration_begun_so_laggards_catch_up() -> None:
    stops = make()
    stops.arm(1, 100)
    # site a's trainer is at iteration 7, site b's is two behind (partial staleness lets it lag)
    for i in range(8):
        assert stops.may_start(1, i)
    for i in range(6):
        assert stops.may_start(1, i)
    assert stops.stop_soon(1) == 8
    assert not stops.may_start(1, 8)  # the leader stops ...
    assert stops.may_start(1, 6) and stops.may_start(1, 7)  # ... the laggard runs up to the same point
    assert not stops.may_start(1, 8)
    assert stops.stop_soon(1) == 8  # asking again does not move it


def test_a_stop_before_anyone_started_means_no_iteration_and_runs_are_independent() -> None:
    stops = make()
    stops.arm(0, 10)
    stops.arm(1, 10)
    assert stops.stop_soon(0) == 0
    assert not stops.may_start(0, 0)
    assert stops.may_start(1, 0)
    stops.arm(0, 4)  # re-arming resets a slot for the next run
    assert stops.may_start(0, 3) and stops.stop_at(0) == 4
