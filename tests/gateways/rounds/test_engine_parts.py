"""The round engine's parts on their own: what each keeps and answers, beside the engine tests that run
them together (tests/gateways/rounds/test_engine.py)."""

from __future__ import annotations

import numpy as np

from gateways.rounds.actions import PeerSuspect
from gateways.rounds.config import RoundConfig
from gateways.rounds.finished import FinishedRounds
from gateways.rounds.forward_bound import ForwardBound
from gateways.rounds.held_messages import HeldMessages
from gateways.rounds.round_timers import RoundTimers
from gateways.rounds.state import EngineStats, OpenRound
from gateways.rounds.topology import PlanSpec, build_plan
from wanrt.payload import SparsePayload
from wanrt.protocol.peer.round_msg import RoundMsg

PLAN = build_plan(PlanSpec(kind="star"), "abc")  # a is the root


def _msg(kind: str, iteration: int, plan_id: int = 1) -> RoundMsg:
    return RoundMsg(kind, iteration, 0, plan_id, None, ())  # type: ignore[arg-type]


def test_held_messages_are_bounded_per_peer_and_a_round_is_taken_in_arrival_order() -> None:
    stats = EngineStats()
    held = HeldMessages(3, stats)
    for it in range(5):
        held.hold("b", _msg("partial", it))
    held.hold("c", _msg("partial", 3))
    assert [m.iteration for m in held.queues["b"]] == [2, 3, 4]  # the oldest went first
    assert (stats.buffered, stats.buffer_dropped) == (6, 2)
    taken = held.take_round((3, 0))
    assert [(p, m.iteration) for p, m in taken] == [("b", 3), ("c", 3)]
    assert [m.iteration for m in held.queues["b"]] == [2, 4] and not held.queues["c"]
    held.prune(3)  # iterations below the floor are settled: dropped and counted
    assert [m.iteration for m in held.queues["b"]] == [4] and stats.buffer_dropped == 3
    assert list(held.take_all()) == ["b", "c"] and not held


def test_a_result_answers_a_re_run_once_per_plan_and_counts_the_rest() -> None:
    stats = EngineStats()
    done = FinishedRounds(0, RoundConfig())
    final = RoundMsg("final", 0, 0, PLAN.plan_id, None, (("a", 0), ("b", 0)))
    assert list(done.record((0, 0), final, PLAN, None, "a")) == ["b", "c"]  # made here: to the children
    assert done.is_settled(0, 0) and not done.is_settled(1, 0) and done.newest_final(0) == 0
    rerun = _msg("partial", 0, plan_id=PLAN.plan_id + 1)
    assert done.reply("b", rerun, stats) is final and stats.final_replies == 1
    assert done.reply("b", rerun, stats) is None and stats.late_inputs == 1  # answered under that plan
    other = RoundMsg("final", 0, 0, 7, None, (("a", 0),))
    assert done.reply("c", other, stats) is None and stats.conflicts == 1


def test_timers_skip_stale_deadlines_and_report_a_silent_peer_once() -> None:
    timers = RoundTimers(suspect_after_s=5.0)
    r = OpenRound(0, 0, PLAN, 0.0, 0.0, 0)
    r.wait_peer, r.wait_since, r.wait_reason = "a", 1.0, "final"
    timers.rearm(r, 3.0)  # gather at 3, suspect at 6: the earlier
    assert r.timer == 3.0 and timers.next({(0, 0): r}) == 3.0
    timers.rearm(r, None)  # gathered: only the suspect time is left; the 3.0 entry is stale now
    assert timers.next({(0, 0): r}) == 6.0
    assert [x.timer for x in timers.expired(6.0, {(0, 0): r})] == [None]  # one round, its deadline cleared
    assert timers.suspect(r, 5.9) is None
    s = timers.suspect(r, 6.0)
    assert isinstance(s, PeerSuspect) and s.peer == "a" and timers.suspect(r, 7.0) is None


def test_the_exact_policy_forwards_everything_and_per_site_keeps_the_rest() -> None:
    values = np.random.default_rng(0).standard_normal(20 * 16).astype(np.float32)
    p = SparsePayload(0, 100 * 16, 16, np.arange(20, dtype=np.int64), values, "fp32")  # 20 of 100 blocks
    assert ForwardBound(RoundConfig()).cap_own(p, 3) == (p, None)
    kept, rest = ForwardBound(RoundConfig(forward_policy="per_site", forward_density=0.05)).cap_own(p, 3)
    assert kept is not None and rest is not None
    assert (kept.nnz_blocks, rest.nnz_blocks) == (2, 18)  # ceil(0.05 * 100 / 3) blocks of the site's own
