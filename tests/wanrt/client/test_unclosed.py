"""A trainer that forgets ``ctx.close()`` is warned at exit, naming the consequence (issue 21: it exited 0
with no word, and its final parameters differed from the other sites')."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import sys, torch, torch.distributed as dist
import wanrt
from tools.harness.fake_gateway import FakeGateway, run_in_thread

import atexit
KEY = b"0123456789abcdef-test-secret"
gw = FakeGateway(f"unix://{sys.argv[1]}/gw.sock", sites=("a",), job="j", secret=KEY)
atexit.register(lambda: print("pushes at exit", gw.pushes, flush=True))  # runs after wanrt's (LIFO)
with run_in_thread(gw):
    dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}/store", rank=0, world_size=1)
    ctx = wanrt.init(gw.url, site="a", job="j", secret=KEY)
    model = torch.nn.Linear(4, 2)
    opt = wanrt.SparseOptimizer(model.named_parameters(), "sgd", lr=0.1, ctx=ctx)
    for _ in range(3):
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    if sys.argv[2] == "close":
        ctx.close()
    print("done", flush=True)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ending", ["close", "forget"])
def test_exit_without_close_warns_with_the_consequence(tmp_path: Path, ending: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANRT_KERNELS": "numpy"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), ending],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
        check=False,
    )
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr[-2000:]
    warned = "UnclosedContextWarning" in proc.stderr
    assert warned == (ending == "forget"), proc.stderr[-2000:]
    if warned:
        assert "site a exits after 3 iterations without ctx.close()" in proc.stderr
        assert "final parameters differ" in proc.stderr
    # either way every push reached the gateway: no other site waits for this one's last iteration
    assert "pushes at exit 6" in proc.stdout, proc.stdout  # 3 iterations x 2 layers
