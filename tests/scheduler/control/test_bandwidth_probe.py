"""Paced probing (``bw_probe_every``): once the links measured the link, raises wait for their samples."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.control.bandwidth import BandwidthEstimator
from scheduler.control.config import SchedulerConfig
from wanrt.errors import ConfigError

M = 1e6


def _est(**kw: object) -> BandwidthEstimator:
    cfg = dataclasses.replace(SchedulerConfig(), bw_initial_bps=200 * M, latency_window=16, **kw)  # type: ignore[arg-type]
    return BandwidthEstimator(cfg)


def _hidden_tick(e: BandwidthEstimator, now: float, *, censored: bool = True) -> str:
    """One decide tick whose exchange hid behind compute (idle 0), in the latency mode the demo runs."""
    payload = e.estimate_bps / 8 * 0.05
    return e.update(
        idle=0.0,
        iteration_s=0.1,
        compute_s=0.1,
        bytes_per_iteration=payload,
        overlapped=True,
        now=now,
        latency_s=0.04,
        censored=censored,
    ).kind


def test_a_censored_link_is_probed_once_per_round_of_samples_past_the_prior() -> None:
    e = _est(bw_probe_every=4, bw_probe_gain=2.0)
    e.apply_delivery(30 * M, now=0.0)  # measured at 30 Mbit/s; then the link rises and nothing backlogs
    kinds, estimates = [], []
    for tick in range(1, 6):
        kinds.append(_hidden_tick(e, now=tick))
        estimates.append(e.estimate_bps / M)
    # a raise only every 4th tick (the samples of the raised plan take that long), doubling from the
    # measurement; measured back before the next one
    assert kinds == ["hold", "hold", "hold", "raise", "hold"]
    assert estimates == pytest.approx([30, 30, 30, 60, 60])
    e.apply_delivery(61 * M, now=5.5)  # the raised plan backlogged a link: measured, the probe succeeded
    assert e.estimate_bps == pytest.approx(61 * M) and e.probe_every == 4
    for tick in range(6, 10):
        _hidden_tick(e, now=tick)
    assert e.estimate_bps == pytest.approx(122 * M)


def test_an_unmeasured_probe_is_undone_and_never_raises_the_estimate() -> None:
    # the runaway of the earlier rule: a probe that no link backlogged (and no train timed) was counted as
    # carried and the next one doubled from it, 100 Mbit/s -> 10-20 Gbit/s while the payload stopped growing
    e = _est(bw_probe_every=4, bw_probe_every_max=32, bw_probe_gain=2.0)
    e.apply_delivery(100 * M, now=0.0)
    top, spacings = 0.0, []
    for tick in range(1, 400):
        kind = _hidden_tick(e, now=tick)
        top = max(top, e.estimate_bps)
        if kind == "lower":
            assert e.estimate_bps == pytest.approx(100 * M)  # back to what was measured
            spacings.append(e.probe_every)
    assert top == pytest.approx(200 * M)  # never past one probe's gain over the measurement
    assert spacings[:4] == [8, 16, 32, 32]  # each unmeasured probe backs the next one off
    assert e.estimate_bps in (pytest.approx(100 * M), pytest.approx(200 * M))


def test_a_probe_measured_back_at_the_old_rate_failed_and_the_next_waits_twice_as_long() -> None:
    e = _est(bw_probe_every=4, bw_probe_every_max=16, bw_probe_gain=2.0)
    e.apply_delivery(100 * M, now=0.0)
    for tick in range(1, 5):
        _hidden_tick(e, now=tick)
    assert e.estimate_bps == pytest.approx(200 * M)  # the probe
    e.apply_delivery(98 * M, now=5.0)  # the link backlogged at the probe's plan: it has no more
    assert e.estimate_bps == pytest.approx(98 * M)
    assert e.probe_every == 8
    kinds = [_hidden_tick(e, now=6 + i) for i in range(8)]
    assert kinds == ["hold"] * 7 + ["raise"]
    e.apply_delivery(99 * M, now=20.0)
    assert e.probe_every == 16  # doubling stops at bw_probe_every_max
    e.apply_delivery(30 * M, now=21.0)  # the link moved: probe at the base spacing again
    assert e.probe_every == 4


def test_a_measured_tick_is_not_a_probe_and_pacing_off_is_the_old_slow_start() -> None:
    e = _est(bw_probe_every=4)
    e.apply_delivery(50 * M, now=0.0)
    assert [_hidden_tick(e, now=t, censored=False) for t in range(1, 9)] == ["hold"] * 8
    old = _est(bw_probe_every=0, bw_raise_hold=0)
    old.apply_delivery(50 * M, now=0.0)
    assert [_hidden_tick(old, now=t) for t in range(1, 4)] == ["raise"] * 3  # every tick


def test_probe_knobs_are_validated() -> None:
    for bad in (
        {"bw_probe_every": -1},
        {"bw_probe_gain": 1.0},
        {"bw_probe_every": 8, "bw_probe_every_max": 4},
    ):
        with pytest.raises(ConfigError):
            dataclasses.replace(SchedulerConfig(), **bad)  # type: ignore[arg-type]


def test_a_backed_off_link_that_moved_is_probed_at_the_base_spacing_again() -> None:
    # two probes measured back at 30 (failed: spacing 16); then the link measures 45 (it moved by more
    # than a quarter): the next probe comes after the base spacing, not after 16 ticks
    e = _est(bw_probe_every=4, bw_probe_every_max=32, bw_probe_gain=2.0)
    e.apply_delivery(30 * M, now=0.0)
    now = 0.0
    for _ in range(2):
        while True:
            now += 1
            if _hidden_tick(e, now=now) == "raise":
                break
        e.apply_delivery(30 * M, now=now + 0.5)
    assert e.probe_every == 16
    e.apply_delivery(45 * M, now=now + 0.6)
    assert e.probe_every == 4
    kinds = [_hidden_tick(e, now=now + 1 + i) for i in range(4)]
    assert kinds == ["hold"] * 3 + ["raise"] and e.estimate_bps == pytest.approx(90 * M)
