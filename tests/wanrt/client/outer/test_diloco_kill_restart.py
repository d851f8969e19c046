"""DiLoCo as processes against real gateways (tools/real_job.py, tools/outer_trainer.py): site b's trainer
is killed with SIGKILL once and launched again with the same command; it rejoins the running job, fetches
the job's parameters and the outer optimizer's momentum from site a (docs/kill_restart.md), and from the
outer step it installed them on, every outer step leaves both sites with the same digest of the job's
parameters (the anchors) — as does every outer step before the kill (issue 23:
``sites_identical_after_outer_step``). DiLoCo synchronous, overlapped (staleness 1: the local copies
differ while updates fly, the anchors do not) and streaming (2 fragments, α 0.5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.real_job import RealJob

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("staleness", "fragments"), [(0, 1), (1, 1), (1, 2)], ids=["diloco", "overlapped", "streaming"]
)
def test_parameters_are_identical_after_every_outer_step_with_one_trainer_killed(
    tmp_path: Path, staleness: int, fragments: int
) -> None:
    args = [
        "--outer-steps", "70", "--sync-every", str(4 * fragments), "--compute-s", "0.02",
        "--deadline-s", "30", "--density", "0.25", "--wire-dtype", "int8", "--staleness", str(staleness),
        "--fragments", str(fragments), "--mixing", "0.5" if fragments > 1 else "0",
    ]  # fmt: skip
    with RealJob(tmp_path, trainer_module="tools.outer_trainer") as job:
        job.start_gateways()
        for site in job.sites:
            job.start_trainer(site, *args)
        assert job.wait_iteration("b", 8, 90), job.trainer_log("b")[-3000:]
        job.kill_trainer("b")
        job.start_trainer("b", *args)  # the same command, as torchrun --max-restarts would
        codes = job.wait_trainers(150)
        assert codes == {"a": 0, "b": 0}, (job.trainer_log("a")[-3000:], job.trainer_log("b")[-3000:])
        a_recs, b_recs = job.records("a"), job.records("b")
        a_res, b_res = job.result("a"), job.result("b")
    assert a_res is not None and b_res is not None
    assert b_res["resyncs"] == 1 and b_res["first_iteration"] >= 8  # rejoined the running job
    assert a_res["digest"] == b_res["digest"]  # after close: every update applied, the model = the job's
    a_at = {r["it"]: r["digest"] for r in a_recs}
    assert sorted(a_at) == list(range(1, 71))  # a never stopped: a record per outer step
    pids = sorted({r["pid"] for r in b_recs}, key=[r["pid"] for r in b_recs].index)
    assert len(pids) == 2
    first = [r for r in b_recs if r["pid"] == pids[0]]
    second = [r for r in b_recs if r["pid"] == pids[1]]
    # the first process: the job's parameters from the start
    assert len(first) >= 8 and all(r["digest"] == a_at[r["it"]] for r in first)
    # the replacement: its own initial parameters until the snapshot is in, then the job's at every step
    joined = [r for r in second if r["resyncs"] == 1]
    assert joined and joined[-1]["it"] == 70
    mismatched = [r["it"] for r in joined if r["digest"] != a_at[r["it"]]]
    assert mismatched == [], mismatched
    assert [r["it"] for r in joined] == list(range(joined[0]["it"], 71))
