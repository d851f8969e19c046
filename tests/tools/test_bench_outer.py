"""tools/bench_outer.py: the keys from the arms' records (synthetic), and its ``--quick`` form end to end on
real daemons and trainers (the JSON it writes, the table it prints)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench_outer import RATES, TARGETS, format_table, keys_of, main, verdict


def _arm(iters: int | None, wan: int, *, tta: float | None = 1.0, link: float = 1e8) -> dict[str, Any]:
    return {
        "iters_to_target": iters,
        "tta_s": tta,
        "iterations": iters or 10,
        "train_s": 1.0,
        "final_loss": 0.1,
        "test_accuracy": 0.95,
        "wan_bytes_sent": wan,
        "bytes_per_iteration": wan / (iters or 10),
        "distinct_final_models": 1,
        "link_bps": link,
    }


def test_the_low_bit_iteration_ratios_are_against_the_fp32_arm_at_the_first_rate() -> None:
    arms = {
        "dense": _arm(100, 10_000_000, link=1e9),
        "per_step_100mbit": _arm(100, 100_000),
        "per_step_10mbit": _arm(100, 100_000, link=1e7),
        "per_step_int8": _arm(105, 30_000),
        "per_step_int4": _arm(112, 20_000),
        "per_step_int2": _arm(None, 10_000),
    }
    keys = keys_of(arms, {"bytes_per_selected_int8": 1.13})
    assert keys["iters_vs_fp32_int8"] == pytest.approx(1.05)
    assert keys["iters_vs_fp32_int4"] == pytest.approx(1.12)
    assert keys["iters_vs_fp32_int2"] is None  # not reached: no ratio
    assert keys["per_step_bytes_to_target_vs_dense_100mbit"] == pytest.approx(100.0)
    assert (
        keys["diloco_bytes_to_target_vs_dense"] is None
        and "diloco_bytes_to_target_vs_dense" in keys["missing"]
    )
    assert verdict("iters_vs_fp32_int8", 1.05) == "met" and verdict("iters_vs_fp32_int4", 1.12) == "NOT met"
    table = format_table({"arms": arms, "keys": keys})
    assert "iters_vs_fp32_int4" in table and "NOT met" in table and "no outer-loop arm" in table
    assert set(TARGETS) >= {"bytes_per_selected_2bit", "sites_identical_after_outer_step"} and len(RATES) == 2


def test_the_outer_keys_pick_the_cheapest_accurate_diloco_arm_and_the_best_fixed_mode() -> None:
    arms = {
        "dense": _arm(100, 30_000_000, link=1e9) | {"test_accuracy": 0.96},
        "per_step_100mbit": _arm(100, 1_000_000, tta=20.0),
        "per_step_10mbit": _arm(100, 1_000_000, tta=80.0, link=1e7),
        "diloco_100mbit": _arm(10, 70_000, tta=16.0),
        "auto_100mbit": _arm(20, 80_000, tta=17.0),
        "diloco_10mbit": _arm(10, 60_000, tta=25.0, link=1e7) | {"test_accuracy": 0.955},
        "auto_10mbit": _arm(8, 50_000, tta=20.0, link=1e7),
        "diloco_10mbit_h64": _arm(4, 20_000, tta=30.0, link=1e7) | {"test_accuracy": 0.94},  # 2 points off
    }
    keys = keys_of(arms, {})
    assert keys["diloco_bytes_arm"] == "diloco_10mbit"  # h64 sent less but lost 2 points of accuracy
    assert keys["diloco_bytes_to_target_vs_dense"] == pytest.approx(500.0)
    assert keys["diloco_tta_vs_per_step_10mbit"] == pytest.approx(80.0 / 20.0)  # the best outer arm: auto
    assert keys["auto_mode_tta_vs_best_fixed_100mbit"] == pytest.approx(16.0 / 17.0)
    assert keys["auto_mode_tta_vs_best_fixed_10mbit"] == pytest.approx(25.0 / 20.0)
    assert keys["diloco_test_acc_minus_dense"]["diloco_10mbit_h64"] == pytest.approx(-0.02)
    table = format_table({"arms": arms, "keys": keys})  # a dict-valued and a str-valued key print too
    assert "diloco_10mbit_h64 -0.020" in table and "diloco_bytes_arm" in table


@pytest.mark.slow
def test_quick_runs_on_real_daemons_and_writes_its_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "outer.json"
    assert main(["--quick", "--json", str(out), "--out", str(tmp_path / "runs")]) == 0
    data = json.loads(out.read_text())
    fixed = {"dense", "per_step_100mbit", "per_step_10mbit"}
    outer = {"diloco_100mbit", "auto_100mbit", "diloco_10mbit", "auto_10mbit", "diloco_10mbit_h32"}
    assert set(data["arms"]) == fixed | outer | {"exact_sums_10mbit"}
    for arm in data["arms"].values():
        assert arm["iters_to_target"] is not None and arm["distinct_final_models"] == 1
    assert data["kill_restart"]["restarted"] and data["keys"]["sites_identical_after_outer_step"] == 1.0
    keys = data["keys"]
    assert keys["bytes_per_selected_2bit"] <= 0.40 and keys["bytes_per_selected_int8"] <= 1.15
    assert keys["per_step_bytes_to_target_vs_dense_10mbit"] > 1.0  # sparse per-step sends less than dense
    # the gateways re-code results in 2 bits (the diloco arm) against exact fp32 sums: fewer bytes per round
    arms = data["arms"]
    assert arms["diloco_10mbit"]["rounds"]["result_coding"] == "wire"
    assert arms["exact_sums_10mbit"]["rounds"] == {}
    per_round = {
        k: arms[k]["wan_bytes_sent"] / arms[k]["iterations"] for k in ("diloco_10mbit", "exact_sums_10mbit")
    }
    assert per_round["diloco_10mbit"] < 0.5 * per_round["exact_sums_10mbit"], per_round
    assert keys["recoded_bytes_vs_exact_sums"] is not None
    assert data["kill_restart"]["rounds"]["result_coding"] == "wire"
    assert "bytes_per_selected_4bit" in capsys.readouterr().out
