"""`wanrt demo --quick` end to end, as a user runs it: real gateway daemons, the real scheduler daemon,
gloo trainers, shaped links.

Checks what the demo claims, not how fast this machine is: all three runs trained (the loss fell, held-out
accuracy far above the 10 % of chance), wanrt sent fewer WAN bytes than the dense baseline, every rank of
every site ended with the same parameters, the scheduler committed decisions and the batch sizes it chose
reached every site's data loader, and the plot and JSON exist with the documented keys.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow


def test_quick_demo_trains_both_ways_and_wanrt_sends_fewer_bytes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result_json = tmp_path / "result.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "wanrt",
            "demo",
            "--quick",
            "--no-progress",
            "--out",
            str(out),
            "--json",
            str(result_json),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(result_json.read_text())
    for key in ("tta_speedup", "iter_speedup", "final_loss_ratio", "bytes_ratio", "dense", "wanrt", "config"):
        assert key in data, key
    for key in (
        "adaptive",
        "adaptive_vs_fixed_tta",
        "adaptive_tta_speedup",
        "adaptive_iters_to_target_ratio",
    ):
        assert key in data, key
    for mode in ("dense", "wanrt", "adaptive"):
        run = data[mode]
        assert run["iterations"] >= 10
        assert run["final_loss"] < 0.7 * run["curve"][0]["loss"], (mode, run["final_loss"])
        assert run["final_accuracy"] > 0.5, (mode, run["final_accuracy"])
        assert run["wan_bytes_sent"] > 0
        assert run["distinct_final_models"] == 1, f"{mode}: ranks ended with different parameters"
    assert data["bytes_ratio"] > 1.0
    assert data["wanrt"]["wan_bytes_sent"] < data["dense"]["wan_bytes_sent"]
    assert Path(data["plot"]).stat().st_size > 10_000
    assert "time to loss" in proc.stdout and "plot:" in proc.stdout and "adaptive vs fixed" in proc.stdout
    adaptive = data["adaptive"]
    assert adaptive["decisions_committed"] >= 1, adaptive["decisions"]
    assert any(d["bandwidth_estimate_bps"] for d in adaptive["decisions"]), (
        "no estimate in the decisions file"
    )
    assert adaptive["link_trace"], "the fluctuating link's trace is missing"
    final = adaptive["final_settings"]
    for site, batch in adaptive["final_batch"].items():
        # what the loader drew in the last iteration is what the last decision in force said
        assert batch == final.get(f"batch_size@{site}", final["batch"]), (site, batch, final)
    cfg = data["config"]
    fixed = data["wanrt"]
    assert fixed["final_batch"] == {"a": cfg["batch"], "b": cfg["batch"]}
    assert fixed["samples"] == fixed["iterations"] * cfg["batch"] * cfg["sites"] * cfg["ranks"]
