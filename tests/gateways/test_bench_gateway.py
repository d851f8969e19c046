"""tools/bench_gateway.py runs end to end in its smallest configuration and writes sane JSON.

Correctness only: the smoke sizes are far too small for the numbers to mean anything, so nothing here is a
timing target — only that every headline key is present, finite and within physical bounds, and that the
gateways involved shut down cleanly.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "tools" / "bench_gateway.py"

KEYS = (
    "goodput_ratio_vs_raw",
    "edf_first_layer_speedup",
    "straggler_iter_reduction",
    "bursty_overhead",
    "tree32_rounds_per_s",
    "tree32_rss_mb",
)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_smoke_run_writes_every_key(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "headline keys" in proc.stdout
    data = json.loads(out.read_text())
    keys = data["keys"]
    assert set(KEYS) <= set(keys)
    for key in KEYS:
        assert math.isfinite(keys[key]), key

    g = data["goodput"]
    # both paths moved the same wire bytes; neither can beat the shaped rate by more than its initial burst
    assert 0 < g["wire_bytes"] <= 1.1 * g["payload_bytes"]
    assert 0.2 < g["gateway_vs_rate"] < 2.0 and 0.2 < g["raw_vs_rate"] < 2.0
    assert 0.1 < keys["goodput_ratio_vs_raw"] < 10

    e = data["edf"]
    assert keys["edf_first_layer_speedup"] > 0
    for row in e["rows"].values():
        for policy in ("fifo", "edf"):
            t = row[policy]
            assert 0 < t["first_b"] <= t["all_b"] + 1e-9  # layer 0 is one of "all layers"
            assert 0 < t["first_a"] <= t["all_a"] + 1e-9

    s = data["straggler"]
    assert -1 < keys["straggler_iter_reduction"] < 1 and -1 < keys["bursty_overhead"] < 1
    for run in s["emulated"].values():
        for arm in ("baseline", "ours"):
            times = run[arm]["iteration_s"]
            assert times and all(t > run["compute_s"] for t in times)  # an iteration includes its compute
        assert run["baseline"]["reallocations"] == 0  # the baseline runs with the allocator disabled
    # the fluid model is deterministic: seed 002's straggler case must come out clearly faster
    assert s["model"]["paper"]["3_links"]["straggler"] < -0.3

    t = data["tree"]
    assert keys["tree32_rounds_per_s"] > 0
    assert 10 < keys["tree32_rss_mb"] < 2000  # an interpreter with numpy is tens of MB, never GBs
    for variant in t["variants"].values():
        assert variant["rounds"] > 0
        assert variant["exit_codes"] == [0], variant["gateway_errors"]
        assert not variant["trainer_errors"]
