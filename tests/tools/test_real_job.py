"""What a user of the public client sees when processes die, as processes (tools/real_job.py): two sites,
``wanrt job init``'s files, a ``wanrt gateway`` per site, one trainer per site (tools/real_trainer.py:
torch, ``wanrt.init``, ``wanrt.SparseOptimizer`` with Adam).

* a trainer killed with SIGKILL and launched again with the same command rejoins the running job, fetches
  the parameters and optimizer state from the other site, and every site ends with the same parameters;
  the other site trains on meanwhile (its update deadline is short here: a stall would fail it);
* a new run against gateways whose run finished is refused at ``wanrt.init`` with one message;
* a job stopped at iteration N (``ctx.close()``, checkpoint) and resumed from the checkpoint — against the
  same gateways, and against fresh ones started with ``--resume-at N`` — ends with the very parameters of
  an uninterrupted run (staleness 0: every step applies its own iteration's update, so the runs are
  deterministic and the comparison is bit for bit).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.real_job import RealJob

pytestmark = pytest.mark.slow

STEPS = 60


def test_a_killed_trainer_restarted_rejoins_and_a_new_run_is_refused_at_init(tmp_path: Path) -> None:
    # long enough for the relaunched process (python, torch) to come back before site a is done
    args = ["--steps", "300", "--compute-s", "0.05", "--deadline-s", "30"]
    with RealJob(tmp_path) as job:
        job.start_gateways()
        for site in job.sites:
            job.start_trainer(site, *args)
        assert job.wait_iteration("b", 15, 60), job.trainer_log("b")
        job.kill_trainer("b")
        job.start_trainer("b", *args)  # the same command, as torchrun --max-restarts would
        codes = job.wait_trainers(120)
        assert codes == {"a": 0, "b": 0}, (job.trainer_log("a")[-3000:], job.trainer_log("b")[-3000:])
        a, b = job.result("a"), job.result("b")
        assert a is not None and b is not None
        assert b["first_iteration"] > 15 and b["resyncs"] == 1  # rejoined the running job, resynced
        assert a["digest"] == b["digest"]  # parameters and optimizer state fetched: identical at the end
        assert "a new trainer run replaces run" in job.gateway_log("b")
        # the job's run finished at both sites: a new run of the same command is refused at init
        before = len(job.trainer_log("a"))
        proc = job.start_trainer("a", *args)
        assert proc.wait(60) != 0
        out = job.trainer_log("a")[before:]
        assert "RunRefused" in out and "finished here at iteration" in out, out[-3000:]
        assert out.count("Traceback") == 1 and "ctx = wanrt.init(" in out  # one traceback, from init


def _run(job: RealJob, *args: str, checkpoints: dict[str, Path] | None = None) -> dict[str, str]:
    for site in job.sites:
        resume = [] if checkpoints is None else ["--resume", str(checkpoints[site])]
        job.start_trainer(site, *args, *resume)
    codes = job.wait_trainers(120)
    assert codes == dict.fromkeys(job.sites, 0), [job.trainer_log(s)[-3000:] for s in job.sites]
    out = {}
    for site in job.sites:
        r = job.result(site)
        assert r is not None
        out[site] = r["digest"]
    return out


def test_a_job_stopped_at_n_and_resumed_from_its_checkpoint_ends_as_an_uninterrupted_one(
    tmp_path: Path,
) -> None:
    common = ["--staleness", "0", "--steps", str(STEPS)]
    with RealJob(tmp_path / "full") as job:
        job.start_gateways()
        full = _run(job, *common)
    assert len(set(full.values())) == 1
    ck = {s: tmp_path / f"ck-{s}.pt" for s in ("a", "b")}
    with RealJob(tmp_path / "stopped") as job:
        job.start_gateways()
        for site in job.sites:
            job.start_trainer(site, *common, "--save-at", "30", "--checkpoint", str(ck[site]))
        assert job.wait_trainers(120) == {"a": 0, "b": 0}
        halfway = {s: job.result(s) for s in job.sites}
        assert all(r is not None and r["iteration"] == 30 for r in halfway.values())
        # the gateways stay up: the resumed run is let in where the job stopped
        # (each site its own checkpoint: the error-feedback residuals are the site's own)
        assert _run(job, *common, checkpoints=ck) == full
        # the whole job stopped: fresh gateways started at the checkpoint's iteration
        for site in job.sites:
            job.stop_gateway(site)
        job.start_gateways("--resume-at", "30")
        assert _run(job, *common, checkpoints=ck) == full
        assert all(r is not None and r["first_iteration"] == 30 for r in map(job.result, job.sites))
