"""The demo's table against real DDP: ratios oriented as documented, every arm present, the JSON keys."""

from __future__ import annotations

import pytest

from wanrt.demo.ddp_results import ddp_headline, ddp_json, format_ddp_table
from wanrt.demo.results import CurvePoint, RunResult, compare


def run(mode: str, *, tta: float | None, its: int, train_s: float, sent: int) -> RunResult:
    return RunResult(
        mode=mode, iterations=its, target_loss=0.1, tta_s=tta, iters_to_target=None if tta is None else its,
        train_s=train_s, final_loss=0.1, final_accuracy=0.9, curve=(CurvePoint(0.0, 0, 2.0, 0.1),),
        step_times=(), wan_bytes_sent=sent, wan_bytes_received=sent, bytes_sent_per_site={"a": sent, "b": 0},
        rounds_completed={}, distinct_final_models=1,
    )  # fmt: skip


def test_ratios_against_ddp_for_every_arm() -> None:
    ddp = run("ddp", tta=40.0, its=100, train_s=40.0, sent=100_000_000)
    dense = run("dense", tta=80.0, its=100, train_s=80.0, sent=120_000_000)
    wanrt = run("wanrt", tta=10.0, its=120, train_s=10.0, sent=2_400_000)
    adaptive = run("adaptive", tta=None, its=400, train_s=30.0, sent=4_000_000)
    c = compare(dense, wanrt, adaptive)
    out = ddp_json(ddp, c)
    assert out["tta_speedup_vs_ddp"] == pytest.approx(4.0)
    assert out["dense_tta_speedup_vs_ddp"] == pytest.approx(0.5)
    assert out["adaptive_tta_speedup_vs_ddp"] is None  # never reached the target
    assert out["iters_to_target_ratio_vs_ddp"] == pytest.approx(1.2)
    assert out["bytes_per_iter_ratio_vs_ddp"] == pytest.approx(1e6 / 2e4)
    assert out["ddp"]["mode"] == "ddp"
    table = format_ddp_table(ddp, c)
    assert "real DDP (gloo)" in table and "4.00× faster" in table and "0.50× faster" in table
    assert "4.00× faster than real DDP" in ddp_headline(ddp, c)


def test_headline_says_slower_when_ddp_wins() -> None:
    ddp = run("ddp", tta=2.0, its=80, train_s=2.0, sent=1)
    wanrt = run("wanrt", tta=4.0, its=95, train_s=4.0, sent=1)
    c = compare(run("dense", tta=5.0, its=80, train_s=5.0, sent=1), wanrt)
    assert "2.00× slower than real DDP" in ddp_headline(ddp, c)
