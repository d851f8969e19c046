"""The chaos soak's safety keys (issue 11), from a real ``tools/chaos_soak.py --quick`` run: six gateway
daemons and trainers through seeded kills, restarts, partitions, bandwidth drops, a malicious peer and
unauthenticated control requests. Whatever else the soak measures (waits, memory, resync time: numbers,
not correctness), these must hold on every seed: nothing lost, nothing counted twice, no forged message and
no unauthenticated change accepted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAFETY = ("pushes_lost", "pushes_double_counted", "forged_accepted", "unauthenticated_changes_accepted")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_quick_soak_keeps_every_safety_guarantee(tmp_path: Path) -> None:
    seed = 1
    out = tmp_path / "chaos.json"
    env = {**os.environ, "WANRT_KERNELS": "numpy"}
    proc = subprocess.run(
        [sys.executable, "tools/chaos_soak.py", "--quick", "--seed", str(seed), "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    for key in SAFETY:
        assert result[key] == 0, f"seed {seed}: {key} = {result[key]}\n{proc.stdout}"
    # the accounting really ran: pushes were made and every push's mass is in the results
    assert result["pushes"] > 0 and result["sum_mismatch_layers"] == 0
    # and the faults really happened: every event kind ran, gateways were restarted and rejoined
    kinds = {row["kind"] for row in result["event_rows"]}
    assert kinds == {"kill1", "kill2", "trainer_kill", "partition", "bw_drop", "malicious", "control"}
    assert result["authenticated_change_applied"] == 1  # the token works: the refusals were not blanket
    # every restart that missed rounds fetched the job's parameters, and every site ends with the same ones
    assert result["param_resyncs_done"] == result["param_resyncs_needed"] > 0
    assert result["ranks_identical_at_end"] == 1
    # liveness keys (stuck_rounds, resync_s, max_silent_wait_s) are not asserted: a partition currently
    # wedges the job (docs/chaos.md); they are measured and reported by the tool
