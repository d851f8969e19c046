"""tools/bench_stragglers.py --quick runs end to end and writes every key the report cites.

Correctness only: keys present and within their physical ranges; the timing keys are not checked
against targets here (tests never time things).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

KEYS = (
    "seed002_persistent_reduction",
    "seed002_bursty_overhead",
    "seed002_bursty_k1_change",
    "antdt_bpt_spread",
    "star_mode_matches_bruteforce",
    "star_tw_u_shape",
    "zipline_matches_fullgridscan",
    "zipline_ms_n1000_r15",
    "shards_lost",
    "shards_repeated",
    "elastic_wait_reduction",
    "elastic_samples_per_s_gain",
    "adjust_bs_wait_reduction",
    "latency_tree_round_ratio",
    "latency_tree_round_ratio_root",
    "latency_tree_leaf_ratio",
)


def test_quick_run_writes_all_keys(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_stragglers.py"), "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "fluid model" in proc.stdout
    data = json.loads(out.read_text())
    for key in KEYS:
        assert math.isfinite(data[key]), key
    assert set(data["antdt_speedup_by_intensity"]) == {"0.1", "0.3", "0.5", "0.8"}
    assert data["antdt_bpt_spread"] >= 1.0
    assert 0.0 < data["seed002_persistent_reduction"] < 1.0
    assert data["star_mode_match_count"][1] > 0
    assert len(data["star_tw_sweep"]["t_w_ms"]) == len(data["star_tw_sweep"]["time_s"])
    # the slow interior site moved to a leaf; where it already was one the policy stayed silent
    assert data["latency_tree_slow_site_leaf"] == 1 and data["latency_tree_announcements_leaf"] == 0
    assert data["latency_tree_digests_agree"] == 1 and data["latency_tree_gateways_agree"] == 1
    assert data["shards_lost"] == 0 and data["shards_lost_stateless_queue"] > 0
    assert 0.0 < data["elastic_wait_reduction"] <= 1.0 and data["adjust_bs_capped_wait_reduction"] == 0.0
