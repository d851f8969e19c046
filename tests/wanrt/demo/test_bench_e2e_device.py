"""tools/bench_e2e.py --device cuda: refused with a reason before anything starts where it cannot run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))

import bench_e2e  # noqa: E402


def test_cuda_with_the_cpu_only_ddp_arm_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_e2e.main(["--quick", "--device", "cuda"]) == 2
    assert "--no-ddp" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_without_a_gpu_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_e2e.main(["--quick", "--no-ddp", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
