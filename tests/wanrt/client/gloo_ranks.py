"""Run one script as the ranks of a gloo site, each in its own process (torch.distributed's env:// rendezvous
on a free loopback port), and return what each printed last as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.wanrt.client.conftest import free_port

ROOT = Path(__file__).resolve().parents[3]


def run_gloo_ranks(script: str, world_size: int = 2, timeout: float = 180) -> list[Any]:
    """``script`` gets its rank as ``sys.argv[1]``; a rank that fails fails the test with its stderr."""
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(world_size),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(r)],
            env={**env, "RANK": str(r)},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world_size)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs
