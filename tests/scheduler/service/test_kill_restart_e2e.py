"""KILL_RESTART end to end (issue 10): a real scheduler daemon (``policy = "stragglers"``,
``kill_restart = true``), two real gateway daemons, and two real trainers (wanrt.init, gloo, sparse path)
each under real torchrun. Site a's trainer runs on a "bad node": every iteration of its first start sleeps
inside its batch. The scheduler must see its rank as a persistent straggler from the per-rank telemetry,
order it restarted for one iteration every site agrees on; the trainer must leave through
RestartRequested at that iteration, torchrun must start it again, and the new process must take over at
the next iteration with the job's current parameters (a parameter resync), train to the end with site b,
and end with b's parameters exactly; no second restart.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

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
    site: str, gateway: str, secret: Path, out: Path, slow: float
) -> asyncio.subprocess.Process:
    env = dict(os.environ, OMP_NUM_THREADS="1", WANRT_KERNELS="numpy", PYTHONPATH=str(REPO))
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        "--nproc-per-node=1",
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
        f"--out={out}",
    ]
    log = (out / f"torchrun-{site}.log").open("wb")
    return await asyncio.create_subprocess_exec(*cmd, cwd=REPO, env=env, stdout=log, stderr=log)


def _results(out: Path, site: str) -> dict[int, dict[str, object]]:
    found = {}
    for p in out.glob(f"{site}-*.json"):
        found[int(p.stem.split("-")[1])] = json.loads(p.read_text())
    return found


def _log(out: Path, site: str) -> str:
    p = out / f"torchrun-{site}.log"
    return p.read_text(errors="replace")[-4000:] if p.exists() else ""


async def test_a_persistent_straggler_rank_is_restarted_by_torchrun_and_rejoins_with_the_jobs_parameters(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "job.key"
    secret.write_text(SECRET + "\n")
    with short_dir() as tmp:
        stragglers = SiteStragglerConfig(
            # windows of seconds: the test's job lives for half a minute (the paper's are minutes)
            # λ 1.8: with two ranks a ratio is at most 2, and a loaded machine can make the healthy rank's
            # millisecond batches look 3× slower than the other's (λ 1.5) for a moment; the slow one is ≈ 1.95
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
                    "a": await _torchrun("a", configs["a"].trainer_listen, secret, tmp_path, SLOW_S),
                    "b": await _torchrun("b", configs["b"].trainer_listen, secret, tmp_path, 0.0),
                }
                try:
                    async with asyncio.timeout(120):
                        codes = {s: await p.wait() for s, p in procs.items()}
                finally:
                    for p in procs.values():
                        if p.returncode is None:
                            p.kill()
                            await p.wait()
                status_a = cluster.daemons["a"].node.status()
                frontier_b = cluster.daemons["b"].node.status()["frontier"]
        finally:
            sched.request_stop()
            await asyncio.wait_for(sched_task, 20)

    a, b = _results(tmp_path, "a"), _results(tmp_path, "b")
    assert codes == {"a": 0, "b": 0}, (codes, a, b, _log(tmp_path, "a")[-2000:], _log(tmp_path, "b")[-2000:])

    # the scheduler ordered exactly one restart: site a's only rank, and committed it once
    restarts = list(sched.node.restarts)
    assert [(r["site"], r["rank"]) for r in restarts] == [("a", 0)], (restarts, list(policy.ranks.history))
    assert policy.ranks.restarts == {"a/0": 1}
    effective = restarts[0]["effective_iteration"]
    lines = [json.loads(x) for x in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    ordered = [x for x in lines if x["kind"] == "commit" and "restart@a" in x["values"]]
    assert [(x["values"]["restart@a"], x["effective_iteration"]) for x in ordered] == [(0, effective)]

    # the first process left through RestartRequested at that iteration; torchrun started a second one
    assert set(a) == {0, 1} and set(b) == {0}, (a, b)
    assert a[0]["ended"] == "restart" and a[0]["iteration"] == effective and a[0]["rank"] == 0, a[0]
    assert a[1]["ended"] == "done" and b[0]["ended"] == "done", (a, b)
    # the new process took over at the order's iteration (nothing pushed twice, nothing skipped) ...
    assert a[1]["start_iteration"] == effective, (a[1], effective)
    assert a[1]["end_iteration"] == b[0]["end_iteration"] == STEPS
    # ... fetched the job's parameters once, and ended with exactly the other site's parameters
    assert a[1]["resyncs"] == 1, a[1]
    assert a[1]["digest"] == b[0]["digest"]
    assert status_a["restart"] == {"order": None, "replaced": 1}
    # no round lost: site b's gateway finished every round of the job
    assert frontier_b == STEPS - 1
