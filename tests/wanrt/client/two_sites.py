"""Launching S sites x W trainer processes for the end-to-end tests (see train_worker.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]


def launch(
    tmp: Path, *, sites: tuple[str, ...], world: int, args: list[str], timeout: float = 120.0
) -> dict[tuple[str, int], dict[str, Any]]:
    """Run every trainer to completion; return each one's JSON result keyed by (site, rank)."""
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        # the NumPy reference kernels: four processes JIT-compiling the fused path would dominate the run
        # time, and the kernels' own tests check every path against the reference
        WANRT_KERNELS="numpy",
    )
    cmd = [
        sys.executable,
        "-m",
        "tests.wanrt.client.train_worker",
        f"--sites={','.join(sites)}",
        f"--world={world}",
        f"--out={tmp}",
        *args,
    ]
    with (tmp / "trainers.log").open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    results: dict[tuple[str, int], dict[str, Any]] = {}
    for site in sites:
        for rank in range(world):
            out = tmp / f"{site}{rank}.json"
            if out.exists():
                results[(site, rank)] = json.loads(out.read_text())
            else:
                tail = (tmp / "trainers.log").read_text(errors="replace")[-3000:]
                results[(site, rank)] = {"error": {"type": "no-result", "message": tail}}
    return results
