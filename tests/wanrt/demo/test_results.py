"""Ratios point the documented way, the table shows both runs, the JSON carries the promised keys."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from wanrt.demo.results import CurvePoint, DecisionPoint, RunResult, compare, format_table, write_json


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


def _adaptive(tta: float | None, its: int, train_s: float, sent: int) -> RunResult:
    from wanrt.demo.results import DecisionPoint

    base = result("adaptive", tta=tta, its=its, train_s=train_s, sent=sent, loss=0.1)
    decisions = (
        DecisionPoint(0.5, "tick", None, None, None, None),
        DecisionPoint(1.0, "commit", 1, 10, {"density": 0.1, "batch_size@a": 48, "staleness": 1}, 1e8, None),
        DecisionPoint(1.5, "tick", 1, 10, None, 6e7, "lower"),
        DecisionPoint(2.0, "commit", 2, 20, {"density": 0.05, "batch_size@a": 40, "staleness": 1}, 6e7),
        # committed too late: its iteration was never reached
        DecisionPoint(2.5, "commit", 3, its + 5, {"density": 0.5, "batch_size@a": 8, "staleness": 0}, 6e7),
    )
    return dataclasses.replace(
        base,
        settings={"density": 0.02, "staleness": 1, "batch": 32},
        final_batch={"a": 40, "b": 32},
        decisions=decisions,
    )


def test_three_arms_add_the_adaptive_column_its_ratios_and_the_adaptive_vs_fixed_row(tmp_path: Path) -> None:
    dense = result("dense", tta=60.0, its=100, train_s=60.0, sent=1_000_000, loss=0.1)
    fixed = result("wanrt", tta=20.0, its=120, train_s=20.0, sent=10_000, loss=0.09)
    fixed = dataclasses.replace(fixed, settings={"density": 0.02, "staleness": 1, "batch": 32})
    adaptive = _adaptive(16.0, 110, 16.0, 40_000)
    c = compare(dense, fixed, adaptive)
    assert c.adaptive_vs_fixed_tta == pytest.approx(20.0 / 16.0)
    assert c.adaptive_tta_speedup == pytest.approx(60.0 / 16.0)
    assert c.adaptive_iters_to_target_ratio == pytest.approx(1.1)
    assert c.adaptive_vs_fixed_iters == pytest.approx(110 / 120)
    assert c.adaptive_bytes_ratio == pytest.approx(25.0)
    assert c.tta_speedup == pytest.approx(3.0)  # the fixed arm's keys are unchanged
    table = format_table(c)
    head, rule, *rows = table.splitlines()
    assert "wanrt fixed" in head and "wanrt adaptive" in head and "adaptive vs dense" in head
    assert len(rule.split()) == 6  # label, three arms, two ratio columns
    last = rows[-1]
    assert last.startswith("adaptive vs fixed") and "1.25× faster" in last
    assert "3.75× faster" in table  # adaptive vs dense, time to target
    settings = next(r for r in rows if r.startswith("density, batch"))
    assert "0.05, a 40 b 32" in settings and "0.02, 32" in settings  # the late commit is not in force
    assert "2 committed" in table
    data = c.to_json({"config": {}})
    for key in (
        "adaptive_vs_fixed_tta",
        "adaptive_tta_speedup",
        "adaptive_iters_to_target_ratio",
        "adaptive_bytes_ratio",
        "adaptive",
        "tta_speedup",
        "iters_to_target_ratio",
    ):
        assert key in data, key
    a = data["adaptive"]
    assert a["decisions_committed"] == 2 and a["final_settings"]["density"] == 0.05
    assert a["decisions"][2]["bandwidth_step"] == "lower"
    write_json(tmp_path / "r.json", data)  # every value is JSON
    assert json.loads((tmp_path / "r.json").read_text())["adaptive"]["final_batch"] == {"a": 40, "b": 32}


def test_an_adaptive_arm_slower_than_the_fixed_one_says_so() -> None:
    dense = result("dense", tta=60.0, its=100, train_s=60.0, sent=1_000_000, loss=0.1)
    fixed = result("wanrt", tta=10.0, its=120, train_s=10.0, sent=10_000, loss=0.09)
    c = compare(dense, fixed, _adaptive(15.0, 130, 15.0, 40_000))
    assert c.adaptive_vs_fixed_tta == pytest.approx(10.0 / 15.0)
    assert "1.50× slower" in format_table(c).splitlines()[-1]
    missed = compare(dense, fixed, _adaptive(None, 400, 40.0, 40_000))
    assert missed.adaptive_vs_fixed_tta is None and "n/a" in format_table(missed).splitlines()[-1]


def test_without_the_scheduler_the_table_keeps_its_two_run_form() -> None:
    dense = result("dense", tta=60.0, its=100, train_s=60.0, sent=1_000_000, loss=0.1)
    fixed = result("wanrt", tta=20.0, its=120, train_s=20.0, sent=10_000, loss=0.09)
    c = compare(dense, fixed)
    head = format_table(c).splitlines()[0]
    assert "wanrt vs dense" in head and "adaptive" not in format_table(c)
    data = c.to_json()
    assert data["adaptive"] is None and data["adaptive_vs_fixed_tta"] is None


def test_the_plot_maps_decisions_to_the_time_their_iteration_began(tmp_path: Path) -> None:
    from wanrt.demo.plot import plot_loss_vs_time, settings_over_time

    adaptive = dataclasses.replace(
        _adaptive(16.0, 110, 16.0, 40_000), link_trace=((0.0, 1e8), (5.0, 3e7)), final_batch={}
    )
    timeline = settings_over_time(adaptive)
    # step_times: iteration i ends at 16 * i / 110 s; iteration 10 begins when step 10 ends
    assert [round(t, 3) for t, _ in timeline] == [0.0, round(16 * 10 / 110, 3), round(16 * 20 / 110, 3)]
    assert timeline[0][1]["density"] == 0.02 and timeline[-1][1]["batch_size@a"] == 40
    dense = result("dense", tta=60.0, its=100, train_s=60.0, sent=1_000_000, loss=0.1)
    fixed = result("wanrt", tta=20.0, its=120, train_s=20.0, sent=10_000, loss=0.09)
    png = plot_loss_vs_time(compare(dense, fixed, adaptive), tmp_path / "p.png", title="t")
    assert png.stat().st_size > 10_000


def test_loss_spike_ratio_is_the_worst_rise_after_iteration_20_over_the_best_before_it() -> None:
    losses = [(0, 2.3), (10, 2.5), (20, 0.6), (25, 0.5), (30, 1.0), (35, 0.2), (40, 0.25)]
    curve = tuple(CurvePoint(float(i), i, loss, 0.5) for i, loss in losses)
    spiky = dataclasses.replace(
        result("wanrt", tta=None, its=40, train_s=4.0, sent=1, loss=0.25), curve=curve
    )
    # the rise 2.3 -> 2.5 at iteration 10 is leaving the initialisation, not counted; 1.0 / 0.5 is the worst
    assert spiky.loss_spike_ratio == pytest.approx(2.0)
    calm = result("dense", tta=None, its=40, train_s=4.0, sent=1, loss=0.2)
    assert calm.loss_spike_ratio == pytest.approx(0.2 / 2.3)  # never above its best: below 1
    data = compare(calm, spiky).to_json()
    assert data["loss_spike_ratio"] == {"dense": pytest.approx(0.2 / 2.3), "wanrt": pytest.approx(2.0)}
    assert "loss spike" in format_table(compare(calm, spiky))


def test_bw_tracking_error_is_the_median_relative_error_outside_two_seconds_after_each_step() -> None:
    trace = ((0.0, 100e6), (5.0, 30e6), (10.0, 30e6))  # the last row repeats a rate: no step
    ticks = [(1.0, 100e6), (3.0, 90e6), (4.0, 80e6), (6.0, 100e6), (8.0, 36e6), (9.0, 33e6), (11.0, 30e6)]
    decisions = tuple(DecisionPoint(t, "tick", None, None, None, est) for t, est in ticks)
    base = result("adaptive", tta=None, its=10, train_s=12.0, sent=1, loss=0.3)
    r = dataclasses.replace(base, decisions=decisions, link_trace=trace)
    # ticks at 1 s (the start's prior) and 6 s (inside 2 s after the step) are left out:
    # errors 0.1, 0.2, 0.2, 0.1, 0.0 -> median 0.1
    assert r.bw_tracking_error == pytest.approx(0.1)
    every_2s = tuple((2.0 * i, 50e6 if i % 2 else 100e6) for i in range(7))  # the demo's 2 s holds
    assert dataclasses.replace(r, link_trace=every_2s).bw_tracking_error is None
    assert base.bw_tracking_error is None  # no trace, no key
    assert compare(base, base, r).to_json()["bw_tracking_error"] == pytest.approx(0.1)


def test_a_dense_arm_stopped_at_its_budget_gives_a_labelled_lower_bound() -> None:
    dense = dataclasses.replace(
        result("dense", tta=None, its=30, train_s=61.0, sent=10**9, loss=0.9), budget_s=60.0
    )
    wanrt = result("wanrt", tta=20.0, its=150, train_s=20.0, sent=10**7, loss=0.1)
    adaptive = result("adaptive", tta=10.0, its=150, train_s=10.0, sent=10**7, loss=0.1)
    c = compare(dense, wanrt, adaptive)
    assert c.tta_speedup is None  # dense never reached the target: no exact ratio
    assert c.tta_speedup_at_least == pytest.approx(61.0 / 20.0)
    assert c.adaptive_tta_speedup_at_least == pytest.approx(6.1)
    table = format_table(c)
    assert "≥ 3.05× faster (lower bound)" in table and "stopped at its budget" in table
    data = c.to_json()
    assert data["tta_speedup_at_least"] == pytest.approx(3.05) and data["dense"]["budget_s"] == 60.0
    # a dense arm that reached its target (or had no budget) gives no bound
    assert compare(dataclasses.replace(dense, budget_s=None), wanrt).tta_speedup_at_least is None


def test_a_decisions_line_carries_its_reason_to_the_result_and_the_plot(tmp_path: Path) -> None:
    from wanrt.demo.plot import plot_loss_vs_time
    from wanrt.demo.runner import _decision_point

    line = {
        "kind": "commit",
        "monotonic": 12.5,
        "decision": 3,
        "effective_iteration": 40,
        "values": {"density": 0.005},
        "bandwidth_estimate_bps": 27e6,
        "reason": "bandwidth_change",
        "plan": {"bandwidth_bps": 27e6},
    }
    d = _decision_point(line, t_go=10.0)
    assert (d.t, d.reason, d.values) == (2.5, "bandwidth_change", {"density": 0.005})
    assert _decision_point({**line, "reason": None}, t_go=10.0).reason is None  # an old file's line
    base = _adaptive(16.0, 110, 16.0, 40_000)
    adaptive = dataclasses.replace(base, decisions=(*base.decisions, d), final_batch={})
    dense = result("dense", tta=60.0, its=100, train_s=60.0, sent=1_000_000, loss=0.1)
    fixed = result("wanrt", tta=20.0, its=120, train_s=20.0, sent=10_000, loss=0.09)
    assert plot_loss_vs_time(compare(dense, fixed, adaptive), tmp_path / "p.png", title="t").is_file()


def test_a_budget_stopped_dense_arm_takes_its_iterations_to_target_from_the_unshaped_replay() -> None:
    dense = dataclasses.replace(
        result("dense", tta=None, its=8, train_s=61.0, sent=10**9, loss=1.5), budget_s=60.0
    )
    wanrt = result("wanrt", tta=30.0, its=110, train_s=30.0, sent=10**7, loss=0.1)
    adaptive = result("adaptive", tta=20.0, its=120, train_s=20.0, sent=10**7, loss=0.1)
    replay = result("dense", tta=40.0, its=100, train_s=40.0, sent=10**9, loss=0.09)
    c = compare(dense, wanrt, adaptive, replay)
    assert c.dense_iters_to_target == 100 and c.dense_iters_to_target_source == "unshaped replay"
    assert c.iters_to_target_ratio == pytest.approx(1.1)
    assert c.adaptive_iters_to_target_ratio == pytest.approx(1.2)
    # time comes only from the shaped arm: the replay's 40 s is not a time to target
    assert c.tta_speedup is None and c.tta_speedup_at_least == pytest.approx(61.0 / 30.0)
    data = c.to_json()
    assert data["dense_iters_to_target"] == 100 and data["dense_iters_to_target_source"] == "unshaped replay"
    assert data["adaptive_iters_to_target_ratio"] == pytest.approx(1.2)
    assert data["dense_replay"]["iters_to_target"] == 100
    assert "100 (unshaped replay)" in format_table(c)
    # a replay that hit its cap before the target gives no count and no ratio
    missed = result("dense", tta=None, its=200, train_s=80.0, sent=10**9, loss=0.2)
    c = compare(dense, wanrt, adaptive, missed)
    assert c.dense_iters_to_target is None and c.dense_iters_to_target_source is None
    assert c.iters_to_target_ratio is None and c.adaptive_iters_to_target_ratio is None
    assert c.to_json()["adaptive_iters_to_target_ratio"] is None
    # a dense arm that reached the target itself is its own source, whatever a replay said
    reached = result("dense", tta=50.0, its=90, train_s=50.0, sent=10**9, loss=0.1)
    c = compare(reached, wanrt, adaptive, replay)
    assert c.dense_iters_to_target == 90 and c.dense_iters_to_target_source == "dense arm"
