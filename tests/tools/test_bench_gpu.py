"""tools/bench_gpu.py runs (on CPU: every section, small sizes) and says so when it cannot use a GPU.

The GPU figures themselves come from ``tools/gpu_check.sh`` on a GPU machine; here the script must not
crash, must compute every key from its own measurements, and must keep CPU numbers away from the targets.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import bench_gpu  # noqa: E402


def _run(tmp_path: Path, *args: str) -> dict[str, object]:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_gpu.py"), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    data: dict[str, object] = json.loads(out.read_text())
    data["_stdout"] = done.stdout
    return data


def test_cpu_smoke_run_computes_every_kernel_key(tmp_path: Path) -> None:
    data = _run(tmp_path, "--device", "cpu", "--quick", "--no-e2e")
    keys = data["keys"]
    assert isinstance(keys, dict)
    for key in bench_gpu.TARGETS:
        if key != "gpu_comm_overhead_ratio":
            assert key in keys and math.isfinite(keys[key]) and keys[key] >= 0, key
    assert data["skipped"] is None and data["errors"] == {}
    assert all(v is None for v in data["met"].values())  # type: ignore[union-attr]
    assert "gpu_compress_vs_torch_topk" in str(data["_stdout"])  # the table


@pytest.mark.slow
def test_cpu_smoke_run_includes_the_two_site_run(tmp_path: Path) -> None:
    data = _run(tmp_path, "--device", "cpu", "--quick")
    e2e = data["e2e"]
    assert isinstance(e2e, dict)
    assert e2e["gpu_comm_overhead_ratio"] > 0 and e2e["gpu_e2e_compute_iter_s"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_cuda_it_says_skipped_and_exits_zero(tmp_path: Path) -> None:
    data = _run(tmp_path, "--quick")
    assert data["skipped"] and data["keys"] == {}
    assert str(data["_stdout"]).startswith("skipped: ")


def test_targets_are_judged_in_their_direction() -> None:
    assert bench_gpu._met("gpu_compress_vs_torch_topk", 2.5) is True
    assert bench_gpu._met("gpu_compress_vs_torch_topk", 1.5) is False
    assert bench_gpu._met("gpu_d2h_bytes_ratio", 0.011) is True
    assert bench_gpu._met("gpu_d2h_bytes_ratio", 0.2) is False
    assert bench_gpu._met("gpu_comm_overhead_ratio", float("nan")) is None
