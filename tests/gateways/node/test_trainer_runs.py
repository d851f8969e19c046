"""Which trainer run a gateway serves (gateways/node/trainer_runs.py): a reconnect and the restart of a
dead run get in, another run is refused with what to do, a checkpoint resumes only where the job stopped;
and while the trainer is dead the node pushes empty contributions for it, so the rounds go on."""

from __future__ import annotations

from gateways.config import GatewayConfig
from gateways.node import GatewayNode, ToTrainer
from gateways.node.trainer_runs import TrainerRuns
from gateways.rounds.config import RoundConfig
from wanrt.payload import SparsePayload
from wanrt.protocol import Notice, Push


def test_verdicts_tell_a_restart_from_another_run() -> None:
    runs = TrainerRuns(grace_s=2.0)
    assert runs.verdict("r1", None, 0, -1, served=False).kind == "first"
    runs.admit("r1", runs.verdict("r1", None, 0, -1, served=False))
    runs.connected()
    assert runs.verdict("r1", None, 5, 4).kind == "same"  # a reconnect
    busy = runs.verdict("r2", None, 5, 4)
    assert busy.problem is not None and busy.retry and "connected" in busy.problem
    runs.left(clean=False, reason="reset", next_push=6, now=10.0)
    assert runs.verdict("r2", None, 6, 5).kind == "replace"  # the dead run's restart
    runs.admit("r2", runs.verdict("r2", None, 6, 5))
    runs.connected()
    runs.left(clean=True, reason="bye", next_push=40, now=20.0)  # the run finished here
    done = runs.verdict("r3", None, 40, 39)
    assert done.problem is not None and not done.retry and "finished here at iteration 40" in done.problem
    assert runs.verdict("r3", 40, 40, 39).kind == "resume"  # a checkpoint of where it stopped
    wrong = runs.verdict("r3", 30, 40, 39)
    assert wrong.problem is not None and "iteration 30" in wrong.problem
    assert runs.replaced == 1


def test_a_fresh_gateway_resuming_checks_the_checkpoint_iteration() -> None:
    runs = TrainerRuns(grace_s=2.0)
    assert runs.verdict("r1", 30, None, -1, served=False).retry  # not joined yet: asked again
    assert runs.verdict("r1", 30, 30, 29, served=False).problem is None
    bad = runs.verdict("r1", 30, 0, -1, served=False)
    assert bad.problem is not None and "--resume-at 30" in bad.problem
    # a new run (no checkpoint) where gateways resumed from state files and nobody has parameters
    stale = runs.verdict("r1", None, 303, 300, served=False)
    assert stale.problem is not None and "state files" in stale.problem
    assert runs.verdict("r1", None, 303, 300, served=False, resync_pending=True).problem is None
    assert runs.verdict("r1", None, 303, 300, served=False, reconnect=True).problem is None


def test_empty_pushes_fill_two_rounds_past_the_newest_result_and_stay_below_an_offer() -> None:
    runs = TrainerRuns(grace_s=2.0)
    runs.connected()
    runs.left(clean=False, reason="reset", next_push=5, now=10.0)
    layers = {0: (4, (8, 1)), 1: (3, (16, 1))}
    assert runs.fill(11.0, 4, layers) == []  # within the grace: a reconnect comes back sooner
    assert runs.due() == 12.0
    got = runs.fill(12.0, 4, layers)
    assert got == [(5, 0, (8, 1)), (6, 0, (8, 1)), (4, 1, (16, 1)), (5, 1, (16, 1)), (6, 1, (16, 1))]
    runs.offered = 6
    assert runs.fill(12.0, 10, {0: (6 - 2, (8, 1))}) == [(5, 0, (8, 1))]


def _node() -> GatewayNode:
    cfg = GatewayConfig(site="a", job="j", secret="x" * 32, rounds=RoundConfig(topology="star"))
    node = GatewayNode(cfg, 0.0)
    node.start(0.0)  # no peers: runs the job alone from iteration 0
    node.trainer_model_problem({"run": "r1"})
    node.trainer_connected(1)
    node.pop_actions()
    return node


def test_a_node_pushes_for_its_dead_trainer_and_lets_its_restart_in_after_every_result() -> None:
    node = _node()
    p = SparsePayload.empty(0, 8, 1)
    for it in range(3):
        node.trainer_push(1, Push("j", it, 0, 0, "a", p), 1.0)
    node.trainer_disconnected(1, "connection reset", clean=False, now=2.0)
    node.tick(3.0)
    assert node.status()["trainer_run"]["empty_pushes"] == 0  # within the grace
    node.tick(4.5)
    run = node.status()["trainer_run"]
    assert run["empty_pushes"] > 0 and run["state"] == "gone"
    welcome = node.trainer_welcome_info({"run": "r2"})
    start = welcome["restart_from"]
    assert start > 3 and "refused" not in welcome
    assert node.trainer_model_problem({"run": "r2"}) is None
    node.trainer_connected(2)
    out = [a.msg for a in node.pop_actions() if isinstance(a, ToTrainer)]
    assert any(isinstance(m, Notice) and m.kind == "resync" and m.info["iteration"] == start for m in out)
    # the new run's first push is the site's next one: no conflict with the empty pushes
    node.trainer_push(2, Push("j", start, 0, 0, "a", p), 5.0)
    # another run now is refused, and the Welcome already says so (wanrt.init raises it)
    info = node.trainer_welcome_info({"run": "r3"})
    assert "connected" in info["refused"] and info["retry"] is True
