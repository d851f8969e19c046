"""KILL_RESTART end to end (issue 10): a real scheduler daemon (``policy = "stragglers"``,
``kill_restart = true``), two real gateway daemons, and real trainers (wanrt.init, gloo, sparse path),
each site's under its own real torchrun. One rank of site a runs on a "bad node": every iteration of its
first start sleeps inside its batch. The scheduler must see that rank as a persistent straggler from the
per-rank telemetry and order it restarted for one iteration every site agrees on; every rank of site a
must leave through RestartRequested at that iteration, torchrun must start the worker group again, and the
new processes must take over at that iteration with the job's current parameters (a parameter resync),
train to the end with site b and end with b's parameters exactly; no second restart, no round lost.

Two shapes: one rank per site (the rank is compared with every rank of the job) and two ranks at site a
(compared with its site's other rank; the whole worker group restarts).
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
from tests.gateways.service.daemon_cluster import JOB, SECRET, TEST_TIMEOUTS, running, short_dir, site_configs

REPO = Path(__file__).resolve().parents[3]
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
        "tests.scheduler.service.kill_restart_trainer",
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
    codes: dict[str, int]
    results: dict[str, dict[str, Any]]  # "<site><rank>-<restart count>" -> the trainer's JSON
    restarts: list[dict[str, Any]]  # the scheduler node's committed orders
    policy: SiteStragglerPolicy
    decisions: list[dict[str, Any]]
    gateway_a: dict[str, Any]
    frontier_b: int
    logs: str


async def _run(tmp_path: Path, nproc_a: int, slow_rank: int) -> Run:
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


def _check(run: Run, nproc_a: int, slow_rank: int) -> None:
    r = run.results
    assert run.codes == {"a": 0, "b": 0}, (run.codes, r, run.logs)
    # the scheduler ordered exactly one restart, of the slow rank, and committed it once
    assert [(x["site"], x["rank"]) for x in run.restarts] == [("a", slow_rank)], (
        run.restarts,
        list(run.policy.ranks.history),
    )
    assert run.policy.ranks.restarts == {f"a/{slow_rank}": 1}
    effective = run.restarts[0]["effective_iteration"]
    ordered = [x for x in run.decisions if x["kind"] == "commit" and "restart@a" in x["values"]]
    assert [(x["values"]["restart@a"], x["effective_iteration"]) for x in ordered] == [(slow_rank, effective)]
    # every rank of a's first worker group left through RestartRequested at that iteration; torchrun
    # started a second group, which ran to the end
    a_ranks = range(nproc_a)
    assert set(r) == {f"a{k}-{g}" for k in a_ranks for g in (0, 1)} | {"b0-0"}, sorted(r)
    for k in a_ranks:
        first, second = r[f"a{k}-0"], r[f"a{k}-1"]
        assert first["ended"] == "restart" and first["iteration"] == effective, first
        assert first["named"] == slow_rank
        assert second["ended"] == "done", second
        # the new processes took over at the order's iteration (nothing pushed twice, nothing skipped) ...
        assert second["start_iteration"] == effective, (second, effective)
        assert second["end_iteration"] == STEPS
        # ... installed the job's parameters once, and ended with exactly the other site's parameters
        assert second["resyncs"] == 1, second
        assert second["digest"] == r["b0-0"]["digest"]
    assert r["b0-0"]["ended"] == "done" and r["b0-0"]["end_iteration"] == STEPS
    assert run.gateway_a["restart"] == {"order": None, "replaced": 1}
    # no round lost: site b's gateway finished every round of the job
    assert run.frontier_b == STEPS - 1


async def test_a_straggler_rank_alone_at_its_site_is_restarted_by_torchrun_and_rejoins(
    tmp_path: Path,
) -> None:
    _check(await _run(tmp_path, nproc_a=1, slow_rank=0), 1, 0)


async def test_a_straggler_rank_among_its_sites_ranks_restarts_the_worker_group(tmp_path: Path) -> None:
    _check(await _run(tmp_path, nproc_a=2, slow_rank=1), 2, 1)
