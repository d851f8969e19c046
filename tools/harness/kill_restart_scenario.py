"""The KILL_RESTART job of test_kill_restart_e2e.py and tools/bench_kill_restart.py (issue 10).

A real scheduler daemon (``policy = "stragglers"``, ``kill_restart = true``, windows of seconds), two real
gateway daemons in this process, and each site's trainers (kill_restart_trainer.py) under their own real
torchrun (``--max-restarts=1``); one rank of site a sleeps ``SLOW_S`` inside every batch of its first start.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduler.daemon_config import SchedulerDaemonConfig
from scheduler.service.daemon import SchedulerDaemon
from scheduler.service.policies import make_policy
from scheduler.stragglers.config import DetectionConfig
from scheduler.stragglers.daemon_policy import SiteStragglerPolicy
from scheduler.stragglers.site_config import SiteStragglerConfig
from tools.harness.daemon_cluster import JOB, SECRET, TEST_TIMEOUTS, running, short_dir, site_configs

REPO = Path(__file__).resolve().parents[2]
STEPS = 90
SLOW_S = 0.3


async def _torchrun(
    site: str, nproc: int, gateway: str, secret: Path, out: Path, slow: float, slow_rank: int
) -> asyncio.subprocess.Process:
    env = dict(os.environ, OMP_NUM_THREADS="1", WANRT_KERNELS="numpy", PYTHONPATH=str(REPO))
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--max-restarts=1",
        "--monitor-interval=0.1",
        "-m",
        "tools.harness.kill_restart_trainer",
        f"--gateway={gateway}",
        f"--site={site}",
        f"--job={JOB}",
        f"--secret-file={secret}",
        f"--steps={STEPS}",
        f"--slow-s={slow}",
        f"--slow-rank={slow_rank}",
        f"--out={out}",
    ]
    log = (out / f"torchrun-{site}.log").open("wb")
    return await asyncio.create_subprocess_exec(*cmd, cwd=REPO, env=env, stdout=log, stderr=log)


@dataclass
class Run:
    """What one run left: exit codes, every trainer's JSON, the scheduler's orders and decisions file."""

    codes: dict[str, int]
    results: dict[str, dict[str, Any]]  # "<site><rank>-<restart count>" -> the trainer's JSON
    restarts: list[dict[str, Any]]  # the scheduler node's committed orders
    policy: SiteStragglerPolicy
    decisions: list[dict[str, Any]]
    gateway_a: dict[str, Any]
    frontier_b: int
    logs: str


async def run_scenario(tmp_path: Path, nproc_a: int, slow_rank: int) -> Run:
    """Run the job once in ``tmp_path`` (the trainers' JSON, logs and the decisions file stay there)."""
    secret = tmp_path / "job.key"
    secret.write_text(SECRET + "\n")
    with short_dir() as tmp:
        stragglers = SiteStragglerConfig(
            # windows of seconds: the test's job lives for half a minute (the paper's are minutes). λ 1.8:
            # with two ranks a ratio is at most 2, and a loaded machine can make a healthy rank's millisecond
            # batches look 3× slower than the other's (λ 1.5) for a moment; the bad node's is ≈ 1.95
            detection=DetectionConfig(slowness=1.8, short_s=2.0, long_s=4.0, min_coverage=0.5),
            kill_restart=True,
            # no cooldown and restarts to spare: only the new process being fast keeps it from a second one
            restart_cooldown_s=0.0,
            max_restarts=3,
        )
        cfg = SchedulerDaemonConfig(
            job=JOB,
            sites=("a", "b"),
            secret=SECRET,
            listen=f"unix://{tmp}/sched.sock",
            policy="stragglers",
            stragglers=stragglers,
            decide_interval_s=0.2,
            reply_timeout_s=5.0,
            announce_margin=6,
            timeouts=TEST_TIMEOUTS,
        )
        policy = make_policy(cfg)
        assert isinstance(policy, SiteStragglerPolicy)
        configs = site_configs(tmp, "ab", scheduler=f"unix://{tmp}/sched.sock", telemetry_interval_s=0.1)
        sched = SchedulerDaemon(cfg, policy=policy, decisions_file=tmp_path / "decisions.jsonl")
        sched_task = asyncio.create_task(sched.run())
        try:
            await sched.wait_for(lambda: sched._listener is not None)
            async with running(configs) as cluster:
                procs = {
                    "a": await _torchrun(
                        "a", nproc_a, configs["a"].trainer_listen, secret, tmp_path, SLOW_S, slow_rank
                    ),
                    "b": await _torchrun("b", 1, configs["b"].trainer_listen, secret, tmp_path, 0.0, 0),
                }
                try:
                    async with asyncio.timeout(120):
                        codes = {s: await p.wait() for s, p in procs.items()}
                finally:
                    for p in procs.values():
                        if p.returncode is None:
                            p.kill()
                            await p.wait()
                gateway_a = cluster.daemons["a"].node.status()
                frontier_b = cluster.daemons["b"].node.status()["frontier"]
        finally:
            sched.request_stop()
            await asyncio.wait_for(sched_task, 20)
    results = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*-*.json")}
    decisions = [json.loads(x) for x in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    logs = "".join((tmp_path / f"torchrun-{s}.log").read_text(errors="replace")[-2000:] for s in "ab")
    return Run(codes, results, list(sched.node.restarts), policy, decisions, gateway_a, frontier_b, logs)
