"""tools/gpu_check.sh and its summary (tools/gpu_summary.py): on a machine without a GPU the script still
runs end to end (every cuda-marked test collected and skipped with its reason, the benchmark skipped), so
the one call a GPU machine gets is known not to break on the script itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import gpu_summary  # noqa: E402

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.a" name="test_ok" time="0.1"/>
<testcase classname="tests.a" name="test_bad" time="0.1"><failure message="boom">x</failure></testcase>
<testcase classname="tests.b" name="test_skip" time="0"><skipped message="no CUDA device"/></testcase>
</testsuite></testsuites>"""


def test_summary_counts_tests_and_judges_keys(tmp_path: Path) -> None:
    (tmp_path / "cuda-tests.xml").write_text(JUNIT)
    bench = {
        "device_name": "NVIDIA H200",
        "torch": "2.11",
        "skipped": None,
        "keys": {"gpu_compress_vs_torch_topk": 2.5, "gpu_d2h_bytes_ratio": 0.2},
        "targets": {"gpu_compress_vs_torch_topk": ">= 2", "gpu_d2h_bytes_ratio": "<= 0.05"},
        "met": {"gpu_compress_vs_torch_topk": True, "gpu_d2h_bytes_ratio": False},
        "notes": [],
    }
    (tmp_path / "bench_gpu.json").write_text(json.dumps(bench))
    counts = gpu_summary.read_junit(tmp_path / "cuda-tests.xml")
    assert counts is not None
    assert (counts.tests, counts.passed, counts.failures, counts.skipped) == (3, 1, 1, 1)
    text = gpu_summary.render(counts, gpu_summary.read_bench(tmp_path / "bench_gpu.json"))
    assert "FAILED tests.a::test_bad" in text and "NO" in text and "yes" in text
    assert gpu_summary.main([str(tmp_path)]) == 1  # a failed test fails the check


def test_summary_without_outputs_says_what_is_missing(tmp_path: Path) -> None:
    text = gpu_summary.render(None, None)
    assert "did not finish" in text
    assert gpu_summary.main([str(tmp_path)]) == 1


@pytest.mark.slow
def test_gpu_check_runs_end_to_end_without_a_gpu(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the script would run the real benchmark")
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu_check.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "OUT"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = (tmp_path / "summary.txt").read_text()
    assert "skipped: no CUDA device" in summary
    assert "collected" in summary and "0 failed" in summary
    assert {p.name for p in tmp_path.iterdir()} >= {
        "env.txt",
        "cuda-tests.xml",
        "bench_gpu.json",
        "summary.txt",
    }
