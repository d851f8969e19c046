"""tools/bench_scheduler_daemons.py reads the estimate's error where it says it does: at the 10th decide
tick and the 10th estimator update after each step of the link, against the rate in force then."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from wanrt.demo.results import DecisionPoint, RunResult

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))

import bench_scheduler_daemons as bd


def _run(decisions: tuple[DecisionPoint, ...], steps: tuple[tuple[int, float], ...] = ()) -> RunResult:
    return RunResult(
        mode="adaptive",
        iterations=100,
        target_loss=1e-6,
        tta_s=None,
        iters_to_target=None,
        train_s=30.0,
        final_loss=1.0,
        final_accuracy=0.5,
        curve=(),
        step_times=steps,
        wan_bytes_sent=1,
        wan_bytes_received=1,
        bytes_sent_per_site={},
        rounds_completed={},
        distinct_final_models=1,
        decisions=decisions,
        link_trace=((0.0, 100e6), (10.0, 30e6), (20.0, 100e6)),
    )


def test_errors_at_the_tenth_tick_and_update_after_each_step() -> None:
    ticks = []
    for k in range(60):  # a tick every 0.5 s; the estimate is updated on every other tick
        t = 0.25 + 0.5 * k
        est = 50e6 if t < 10 else (33e6 if t < 20 else 80e6)
        ticks.append(DecisionPoint(t, "tick", 1, 5, None, est, "lower" if k % 2 == 0 else None))
    ticks.append(DecisionPoint(12.0, "commit", 2, 30, {"density": 0.1}, 33e6))  # not a tick: not counted
    steps = bd.estimate_errors(_run(tuple(ticks)))["steps"]
    assert [s["to_bps"] for s in steps] == [30e6, 100e6]
    first, second = steps
    assert first["ticks"] == 20 and first["updates"] == 10
    assert first["error_at_tick"] == pytest.approx(0.1)  # 33 vs 30
    assert first["seconds_to_tick"] == pytest.approx(4.75)  # the 10th tick after 10 s is at 14.75 s
    assert first["error_at_update"] == pytest.approx(0.1) and first["seconds_to_update"] == pytest.approx(
        9.25
    )
    assert second["error_at_tick"] == pytest.approx(0.2) and second["error_at_phase_end"] == pytest.approx(
        0.2
    )


def test_too_few_ticks_after_a_step_give_no_error() -> None:
    few = tuple(DecisionPoint(10.5 + k, "tick", 1, 5, None, 30e6, "hold") for k in range(5))
    first, second = bd.estimate_errors(_run(few))["steps"]
    assert first["error_at_tick"] is None and first["error_at_phase_end"] == pytest.approx(0.0)
    assert second["ticks"] == 0 and second["error_at_phase_end"] is None


def test_steady_time_uses_the_steps_after_the_given_time() -> None:
    r = dataclasses.replace(_run(()), step_times=((1, 1.0), (2, 3.0), (3, 4.0), (4, 5.0), (5, 6.0)))
    assert bd._steady_s(r, 3.5) == pytest.approx(1.0)  # (6 - 4) / (5 - 3)
    with pytest.raises(ValueError):
        bd._steady_s(r, 5.5)
