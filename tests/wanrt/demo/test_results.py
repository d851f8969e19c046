"""Ratios point the documented way, the table shows both runs, the JSON carries the promised keys."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from wanrt.demo.results import CurvePoint, RunResult, compare, format_table, write_json


def result(mode: str, *, tta: float | None, its: int, train_s: float, sent: int, loss: float) -> RunResult:
    return RunResult(
        mode=mode,
        iterations=its,
        target_loss=0.1,
        tta_s=tta,
        iters_to_target=None if tta is None else its,
        train_s=train_s,
        final_loss=loss,
        final_accuracy=0.95,
        curve=(CurvePoint(0.0, 0, 2.3, 0.1), CurvePoint(train_s, its, loss, 0.95)),
        step_times=tuple((i, train_s * i / its) for i in range(1, its + 1)),
        wan_bytes_sent=sent,
        wan_bytes_received=sent,
        bytes_sent_per_site={"a": sent},
        rounds_completed={"a": its},
        distinct_final_models=1,
    )


def test_ratios_favour_the_faster_cheaper_run() -> None:
    dense = result("dense", tta=60.0, its=100, train_s=60.0, sent=1_000_000, loss=0.1)
    wanrt = result("wanrt", tta=20.0, its=120, train_s=20.0, sent=10_000, loss=0.09)
    c = compare(dense, wanrt)
    assert c.tta_speedup == pytest.approx(3.0)
    assert c.iter_speedup == pytest.approx((120 / 20.0) / (100 / 60.0))
    assert c.bytes_ratio == pytest.approx(100.0)
    assert c.bytes_per_iter_ratio == pytest.approx(120.0)
    assert c.final_loss_ratio == pytest.approx(0.9)
    assert c.iters_to_target_ratio == pytest.approx(1.2)
    table = format_table(c)
    assert "3.00× faster" in table and "100.00× fewer" in table and "dense (DDP-like)" in table


def test_a_run_that_missed_the_target_has_no_tta_ratio_and_says_so(tmp_path: Path) -> None:
    dense = result("dense", tta=None, its=400, train_s=100.0, sent=5, loss=0.5)
    wanrt = result("wanrt", tta=10.0, its=100, train_s=10.0, sent=0, loss=0.1)
    c = compare(dense, wanrt)
    assert c.tta_speedup is None and c.bytes_ratio is None  # nothing divided by zero
    assert "not reached" in format_table(c)
    path = tmp_path / "r.json"
    write_json(path, c.to_json({"config": {"sites": 3}}))
    data = json.loads(path.read_text())
    for key in ("tta_speedup", "iter_speedup", "final_loss_ratio", "bytes_ratio", "dense", "wanrt", "config"):
        assert key in data
    assert data["dense"]["reached_target"] is False and data["wanrt"]["curve"][1]["iteration"] == 100


def test_steady_iteration_time_skips_the_warm_up() -> None:
    r = result("dense", tta=None, its=10, train_s=10.0, sent=1, loss=1.0)
    r = dataclasses.replace(r, step_times=((1, 5.0), (2, 6.0), (3, 6.5), (4, 7.0), (5, 7.5)))
    assert r.steady_iteration_s(warmup=2) == pytest.approx(0.5)  # (7.5 - 6.0) / 3, not 7.5 / 5
    with pytest.raises(ValueError, match="warm-up"):
        r.steady_iteration_s(warmup=5)
