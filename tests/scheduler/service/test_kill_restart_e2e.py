"""KILL_RESTART end to end (issue 10): a real scheduler daemon (``policy = "stragglers"``,
``kill_restart = true``), two real gateway daemons, and real trainers (wanrt.init, gloo, sparse path),
each site's under its own real torchrun (the scenario: tools/harness/kill_restart_scenario.py).
One rank of site a runs
on a "bad node": every iteration of its first start sleeps inside its batch. The scheduler must see that
rank as a persistent straggler from the per-rank telemetry and order it restarted for one iteration every
site agrees on; every rank of site a must leave through RestartRequested at that iteration, torchrun must
start the worker group again, and the new processes must take over at that iteration with the job's
current parameters (a parameter resync), train to the end with site b and end with b's parameters
exactly; no second restart, no round lost.

Two shapes: one rank per site (the rank is compared with every rank of the job) and two ranks at site a
(compared with its site's other rank; the whole worker group restarts).
"""

from __future__ import annotations

from pathlib import Path

from tools.harness.kill_restart_scenario import STEPS, Run, run_scenario


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
        # every iteration it pushed before its snapshot was installed was pushed empty (its gradients,
        # computed at its own initial parameters, never reached site b), none after
        assert second["discarded_steps"] == second["params_iteration"] - effective >= 1, second
        assert second["digest"] == r["b0-0"]["digest"]
    assert r["b0-0"]["ended"] == "done" and r["b0-0"]["end_iteration"] == STEPS
    assert r["b0-0"]["discarded_steps"] == 0
    assert run.gateway_a["restart"] == {"order": None, "replaced": 1}
    # no round lost: site b's gateway finished every round of the job
    assert run.frontier_b == STEPS - 1


async def test_a_straggler_rank_alone_at_its_site_is_restarted_by_torchrun_and_rejoins(
    tmp_path: Path,
) -> None:
    _check(await run_scenario(tmp_path, nproc_a=1, slow_rank=0), 1, 0)


async def test_a_straggler_rank_among_its_sites_ranks_restarts_the_worker_group(tmp_path: Path) -> None:
    _check(await run_scenario(tmp_path, nproc_a=2, slow_rank=1), 2, 1)
