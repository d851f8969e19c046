"""tools/bench_e2e.py's longer warm-up for the cheap arms: which arms get it, which window is timed, and
that the short-warm-up figure of the same run is still reported beside the key."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))

import bench_e2e  # noqa: E402

from tests.wanrt.demo.test_bench_e2e_report import run  # noqa: E402


def test_only_wanrt_and_compute_only_skip_the_longer_warm_up() -> None:
    plan = bench_e2e.make_plan(False, 3, 5, 2, True)
    assert bench_e2e.warmup_for(plan, "ddp") == 3 and bench_e2e.warmup_for(plan, "dense") == 3
    assert bench_e2e.warmup_for(plan, "wanrt") == bench_e2e.WARMUP_CHEAP
    assert bench_e2e.warmup_for(plan, "local") == bench_e2e.WARMUP_CHEAP
    longer = bench_e2e.make_plan(False, 25, 5, 2, True)  # an explicit --warmup beyond it wins everywhere
    assert bench_e2e.warmup_for(longer, "wanrt") == 25 and bench_e2e.warmup_for(longer, "ddp") == 25


def test_the_window_is_the_mean_of_the_measured_iterations_after_the_warm_up() -> None:
    # slow start (gateways loading their kernels), then 0.4 s per iteration
    times, t = [], 0.0
    for i in range(40):
        t += 0.7 if i < 6 else 0.4
        times.append((i, t))
    r = dataclasses.replace(run("wanrt", 40, 10.0), step_times=tuple(times))
    assert bench_e2e._window_s(r, 10, 20) == pytest.approx(0.4)
    assert bench_e2e._window_s(r, 3, 20) == pytest.approx((2 * 0.7 + 18 * 0.4) / 20)
    assert r.steady_iteration_s(warmup=10) == pytest.approx(0.4)


def test_the_report_keeps_the_short_warm_up_figure_and_keys_on_the_long_one() -> None:
    plan = bench_e2e.make_plan(False, 3, 5, 2, True)
    conv = [
        {"ddp": run("ddp", 100, 50.0), "dense": run("dense", 100, 80.0), "wanrt": run("wanrt", 100, 10.0)}
    ]
    plan = dataclasses.replace(plan, seeds=(0,))
    times = {
        b: {"ddp": 5.0, "dense": 8.0, "wanrt": 0.25, "wanrt_warmup_short": 0.3} for b, _ in plan.bandwidths
    }
    out = bench_e2e.report(
        plan, bench_e2e.Measured(conv, 300_000, times, 10_000_000, [1.0], local_s=0.2), 1.0
    )
    assert out["tta_speedup_vs_ddp_100mbit"] == pytest.approx(5.0 / 0.25)
    assert out["iter_s_wanrt_100mbit_warmup_short"] == pytest.approx(0.3)
    assert out["timing"]["warmup_wanrt_and_local"] == bench_e2e.WARMUP_CHEAP
