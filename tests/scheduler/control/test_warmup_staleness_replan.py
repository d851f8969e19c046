"""Density warm-up schedule, the staleness decision both ways, and when to re-plan."""

from __future__ import annotations

import pytest

from scheduler.control.config import SchedulerConfig
from scheduler.control.replan import ReplanPolicy
from scheduler.control.staleness import choose_staleness
from scheduler.control.warmup import DensityWarmup


def test_warmup_decays_geometrically_in_stages_to_the_target() -> None:
    w = DensityWarmup(SchedulerConfig(warmup_iterations=200, warmup_start_density=0.25, warmup_stages=4))
    target = 0.0025
    seen = [w.density(i, target) for i in range(0, 260, 10)]
    assert seen[0] == pytest.approx(0.25)  # dense-ish first
    assert seen == sorted(seen, reverse=True)  # never more density later
    assert len(set(seen)) == 5  # four stages, then the target
    assert w.density(199, target) == pytest.approx(0.25 * (0.01) ** 0.75)
    assert w.density(200, target) == target and w.density(10_000, target) == target
    assert [w.stage(i) for i in (0, 49, 50, 150, 199, 200)] == [0, 0, 1, 3, 3, None]
    assert [w.stage_start(k) for k in range(4)] == [0, 50, 100, 150]


def test_warmup_never_compresses_more_than_the_search_and_can_be_off() -> None:
    w = DensityWarmup(SchedulerConfig(warmup_start_density=0.1))
    assert w.density(0, 0.5) == 0.5  # a fast link wants more density than the warm-up's start
    off = DensityWarmup(SchedulerConfig(warmup_iterations=0))
    assert off.density(0, 0.01) == 0.01 and off.stage(0) is None


def test_staleness_one_when_the_exchange_is_a_large_share_of_the_iteration() -> None:
    c = choose_staleness(compute_s=0.3, exchange_s=0.3, g=0.2, staleness_penalty=0.02)
    assert c.staleness == 1
    assert c.tta_stale0 == pytest.approx(0.6 * 1.18) and c.tta_stale1 == pytest.approx(0.3 * 1.2)
    assert c.gain > 0.4


def test_staleness_zero_when_communication_is_already_negligible() -> None:
    c = choose_staleness(compute_s=0.3, exchange_s=0.003, g=0.2, staleness_penalty=0.02)
    assert c.staleness == 0 and c.gain < 0


def test_staleness_zero_when_the_profile_says_staleness_costs_more_than_it_saves() -> None:
    # the overlap saves 1/3 of the time, but staleness costs 60 % more loss-to-go
    c = choose_staleness(compute_s=0.2, exchange_s=0.1, g=0.7, staleness_penalty=0.6)
    assert c.staleness == 0
    # the same timing with a cheap staleness: 1
    assert choose_staleness(compute_s=0.2, exchange_s=0.1, g=0.7, staleness_penalty=0.01).staleness == 1


def test_staleness_uses_the_configured_default_and_min_gain() -> None:
    cfg = SchedulerConfig(staleness_penalty_default=0.0, staleness_min_gain=0.05)
    # 4 % saving is below the 5 % threshold -> 0; 20 % -> 1
    assert (
        choose_staleness(compute_s=1.0, exchange_s=0.04, g=0.0, staleness_penalty=None, config=cfg).staleness
        == 0
    )
    assert (
        choose_staleness(compute_s=1.0, exchange_s=0.25, g=0.0, staleness_penalty=None, config=cfg).staleness
        == 1
    )


def test_replan_initially_on_bandwidth_change_and_periodically() -> None:
    p = ReplanPolicy(
        SchedulerConfig(replan_period_s=30, replan_bandwidth_change=0.05, replan_min_interval_s=1)
    )
    assert p.reason(0.0, 100e6) == "initial"
    p.planned(0.0, 100e6)
    assert p.reason(0.5, 50e6) is None  # within the minimum interval
    assert p.reason(5.0, 103e6) is None
    assert p.reason(5.0, 106e6) == "bandwidth_change"
    assert p.reason(5.0, 94e6) == "bandwidth_change"
    assert p.reason(30.0, 100e6) == "periodic"
    p.planned(30.0, 106e6)
    assert p.reason(31.0, 106e6) is None
