"""tools/bench_e2e.py's arithmetic, without running anything: the plan per mode, and the keys the report
computes from given measurements (TTA = iterations × seconds per iteration; ratios DDP / wanrt)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))

import bench_e2e  # noqa: E402

from wanrt.demo.results import CurvePoint, RunResult  # noqa: E402


def run(mode: str, its: int, tta: float) -> RunResult:
    return RunResult(
        mode=mode, iterations=its, target_loss=0.1, tta_s=tta, iters_to_target=its, train_s=tta,
        final_loss=0.1,
        final_accuracy=0.9, curve=(CurvePoint(0.0, 0, 2.0, 0.1),), step_times=((1, 0.1), (2, 0.2)),
        wan_bytes_sent=1000 * its, wan_bytes_received=0, bytes_sent_per_site={"a": 1000 * its},
        rounds_completed={}, distinct_final_models=1,
    )  # fmt: skip


def test_full_plan_runs_every_arm_on_namespace_links_without_delay() -> None:
    plan = bench_e2e.make_plan(False, None, None, None, True)
    assert plan.arms == plan.converge_arms == ("ddp", "dense", "wanrt")
    assert plan.convergence.rtt_s == plan.timing.rtt_s == 0.0
    assert plan.convergence.bandwidth_bps == 100e6 and plan.timing.model_hidden == 3200
    assert [b for b, _ in plan.bandwidths] == ["1gbit", "500mbit", "100mbit"]
    legacy = bench_e2e.make_plan(False, None, None, None, False)
    assert legacy.arms == ("dense", "wanrt") and legacy.convergence.rtt_s == 0.040


def test_report_computes_the_ddp_key_from_its_inputs(capsys: pytest.CaptureFixture[str]) -> None:
    plan = bench_e2e.make_plan(False, 3, 5, 2, True)
    conv = [
        {"ddp": run("ddp", 100, 50.0), "dense": run("dense", 110, 80.0), "wanrt": run("wanrt", 120, 10.0)},
        {"ddp": run("ddp", 140, 70.0), "dense": run("dense", 130, 90.0), "wanrt": run("wanrt", 120, 12.0)},
    ]
    times = {b: {"ddp": 5.0, "dense": 8.0, "wanrt": 0.25} for b, _ in plan.bandwidths}
    measured = bench_e2e.Measured(conv, 300_000, times, 10_000_000, [1.0, 2.0], local_s=0.2)
    out = bench_e2e.report(plan, measured, 1.0)
    assert out["ceiling_iter_speedup_vs_ddp_100mbit"] == pytest.approx(25.0)
    assert out["iters_to_target_ddp"] == 120 and out["iters_to_target_wanrt"] == 120
    assert out["tta_speedup_vs_ddp_100mbit"] == pytest.approx((120 * 5.0) / (120 * 0.25))
    assert out["tta_speedup_100mbit"] == pytest.approx((120 * 8.0) / (120 * 0.25))
    assert out["iter_speedup_vs_ddp_100mbit"] == pytest.approx(20.0)
    assert out["tta_measured_speedup_vs_ddp_small"] == pytest.approx(60.0 / 11.0)
    assert out["iters_to_target_estimated_for"] == []
    table = capsys.readouterr().out
    assert "TTA speedup vs DDP" in table and "20.00×" in table


def test_quick_report_says_which_counts_it_did_not_measure(capsys: pytest.CaptureFixture[str]) -> None:
    plan = bench_e2e.make_plan(True, 3, 8, 1, True)
    assert plan.converge_arms == ("ddp", "wanrt") and [b for b, _ in plan.bandwidths] == ["100mbit"]
    conv = [{"ddp": run("ddp", 100, 11.0), "wanrt": run("wanrt", 110, 5.0)}]
    times = {"100mbit": {"ddp": 0.11, "dense": 0.25, "wanrt": 0.045}}
    out = bench_e2e.report(plan, bench_e2e.Measured(conv, 300_000, times, 300_000, [1.0]), 1.0)
    assert out["iters_to_target_estimated_for"] == ["dense"] and out["iters_to_target_dense"] == 100
    assert out["tta_speedup_vs_ddp_100mbit"] == pytest.approx((100 * 0.11) / (110 * 0.045))
    printed = capsys.readouterr().out
    assert "not measured in --quick" in printed and "quick: small model" in printed
