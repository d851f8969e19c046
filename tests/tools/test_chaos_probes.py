"""Issue 21's probes against real daemons (``tools/chaos_probes.py``): every user mistake fails fast at
every site with its own message, and none of the three attacks works (a claimed frontier lifting the join
bound, a pre-authentication flood from 8 hosts blocking a rejoin, a closed link's buffers outliving it).
The rejoin times are numbers, not correctness: only "blocked" (more than twice the quiet time) fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mistakes_fail_fast_and_the_three_attacks_are_closed(tmp_path: Path) -> None:
    out = tmp_path / "probes.json"
    env = {**os.environ, "WANRT_KERNELS": "numpy", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "tools/chaos_probes.py", "--json", str(out), "--work-dir", str(tmp_path / "work")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["mistakes_failing_fast"] == "all", json.dumps(result["mistakes"], indent=1)[:4000]
    assert result["forged_join_accepted"] == 0, result["forged_join"]
    assert result["preauth_flood_blocks_rejoin"] == 0, (result["rejoin_quiet_s"], result["rejoin_flood_s"])
    assert result["closed_link_buffer_mb"] <= 64
    assert result["attack_peak_mb"] <= 64  # nothing is allocated at the announced size either
