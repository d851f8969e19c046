"""Who ends the process group: wanrt when wanrt.init created it, the user when the user did."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.wanrt.client.conftest import free_port

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import sys, torch, torch.distributed as dist, wanrt
from tests.wanrt.client.fake_link import scripted
user_made = sys.argv[1] == "user"
if user_made:
    dist.init_process_group("gloo")
secret = b"0123456789abcdef-secret"
ctx = wanrt.client.init("mem://gw", site="a", job="j", secret=secret, link_factory=scripted())
model = torch.nn.Linear(4, 2)
opt = wanrt.SparseOptimizer(model.named_parameters(), "sgd", lr=0.1, ctx=ctx)
model(torch.ones(1, 4)).sum().backward()
opt.step()
ctx.close()
print("initialized after close:", dist.is_initialized())
if user_made:
    dist.destroy_process_group()
"""


def _run(mode: str) -> str:
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "RANK": "0",
        "WORLD_SIZE": "1",
    }
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_a_group_wanrt_created_is_ended_by_close() -> None:
    assert "initialized after close: False" in _run("wanrt")


def test_a_group_the_user_created_is_left_to_the_user() -> None:
    assert "initialized after close: True" in _run("user")
