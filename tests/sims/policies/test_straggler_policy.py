"""StragglerPolicy outputs: which typed decisions come out for which telemetry."""

from __future__ import annotations

import pytest

from scheduler.stragglers import (
    Action,
    AdjustBatch,
    AdjustLr,
    BackupWorkers,
    DetectionConfig,
    KillRestart,
    LinkConfig,
    ModeConfig,
    NoAction,
    ParentChild,
    PolicyConfig,
    TreeRebuild,
)
from sims.policies.straggler_policy import StragglerPolicy
from wanrt.config import from_mapping
from wanrt.errors import ConfigError, LocalProtocolError

RANKS = ["r0", "r1", "r2", "r3"]
CFG = PolicyConfig(detection=DetectionConfig(short_s=60.0, long_s=600.0))


def run_ranks(policy: StragglerPolicy, t0: float, t1: float, rate: dict[str, float]) -> float:
    """Each rank processes its current batch at ``rate[r]`` samples/s (default 100), reporting each second."""
    t = t0
    while t < t1:
        t += 1.0
        for r, b in policy.batch_sizes.items():
            policy.observe_rank(r, t, b / rate.get(r, 100.0))
    return t


def test_starts_with_an_even_split() -> None:
    policy = StragglerPolicy(RANKS, 402, cfg=CFG)
    assert policy.batch_sizes == {"r0": 101, "r1": 101, "r2": 100, "r3": 100}


def test_balanced_ranks_get_none() -> None:
    policy = StragglerPolicy(RANKS, 400, cfg=CFG)
    t = run_ranks(policy, 0.0, 120.0, {})
    out = policy.decide_ranks(t)
    assert [d.action for d in out] == [Action.NONE]


def test_transient_straggler_gets_adjust_bs() -> None:
    policy = StragglerPolicy(RANKS, 400, cfg=CFG)
    t = run_ranks(policy, 0.0, 600.0, {})
    t = run_ranks(policy, t, t + 60.0, {"r1": 25.0})  # 4× slower for a minute
    out = policy.decide_ranks(t)
    assert [d.action for d in out] == [Action.ADJUST_BS]
    adj = out[0]
    assert isinstance(adj, AdjustBatch)
    assert sum(adj.batch.values()) == 400
    assert adj.batch["r1"] < 100 < adj.batch["r0"]
    assert adj.predicted_bpt_s < adj.previous_bpt_s
    assert "transient" in adj.reason
    assert policy.batch_sizes == dict(adj.batch)


def test_adjust_bs_is_undone_after_recovery() -> None:
    """Ours: the stale allocation is rebalanced once the straggler recovers (AntDT alone never would)."""
    policy = StragglerPolicy(RANKS, 400, cfg=CFG)
    t = run_ranks(policy, 0.0, 60.0, {"r1": 25.0})
    policy.decide_ranks(t)
    t = run_ranks(policy, t, t + 120.0, {})
    out = policy.decide_ranks(t)
    assert isinstance(out[0], AdjustBatch)
    assert "lower" in out[0].reason
    assert out[0].batch == {"r0": 100, "r1": 100, "r2": 100, "r3": 100}


def test_persistent_straggler_is_killed_when_the_cluster_is_idle() -> None:
    policy = StragglerPolicy(RANKS, 400, cfg=CFG)
    t = run_ranks(policy, 0.0, 600.0, {"r2": 20.0})
    busy = policy.decide_ranks(t, cluster_pending_s=3600.0)
    assert Action.KILL_RESTART not in [d.action for d in busy]
    out = policy.decide_ranks(t + 1.0)
    kills = [d for d in out if isinstance(d, KillRestart)]
    assert [k.member for k in kills] == ["r2"]
    # restarted: its history is gone and it is not killed again during the cooldown
    t = run_ranks(policy, t + 1.0, t + 400.0, {"r2": 20.0})
    assert Action.KILL_RESTART not in [d.action for d in policy.decide_ranks(t)]


def test_kill_restart_can_be_disabled() -> None:
    cfg = PolicyConfig(detection=CFG.detection, kill_restart=False)
    policy = StragglerPolicy(RANKS, 400, cfg=cfg)
    t = run_ranks(policy, 0.0, 600.0, {"r2": 20.0})
    assert Action.KILL_RESTART not in [d.action for d in policy.decide_ranks(t)]


SITES = ["a", "b", "c", "d"]


def test_mode_switch_emits_x_order_and_lr() -> None:
    policy = StragglerPolicy(RANKS, 400, sites=SITES, lr=0.1, cfg=CFG)
    out = policy.decide_mode(0.0, {"a": 1.0, "b": 1.0, "c": 1.0, "d": 3.0})  # φ = 0: no noise
    assert [d.action for d in out] == [Action.BACKUP_WORKERS, Action.ADJUST_LR]
    bw, lr = out
    assert isinstance(bw, BackupWorkers) and isinstance(lr, AdjustLr)
    assert (bw.mode, bw.order) == ("x_order", 1)
    assert lr.lr == {s: pytest.approx(0.1 / 4) for s in SITES}
    # same predictions again: nothing to do
    assert [d.action for d in policy.decide_mode(1.0, {"a": 1.0, "b": 1.0, "c": 1.0, "d": 3.0})] == [
        Action.NONE
    ]
    # the straggler is gone: back to BSP with the SSGD learning rate
    back = policy.decide_mode(2.0, dict.fromkeys(SITES, 1.0))
    assert isinstance(back[0], BackupWorkers) and back[0].mode == "bsp"
    assert isinstance(back[1], AdjustLr) and back[1].lr == dict.fromkeys(SITES, 0.1)


def test_parent_child_with_its_wait() -> None:
    cfg = PolicyConfig(mode=ModeConfig(modes=("bsp", "parent_child"), max_wait_s=1.0))
    policy = StragglerPolicy(RANKS, 400, sites=SITES, cfg=cfg)
    for _ in range(3):
        policy.observe_gradient_norms([1.0 + 1000 / 100] * 4, [100] * 4, 1.0 + 1000 / 400, 400)  # φ ≈ 1000
    assert policy.noise.phi == pytest.approx(1000.0)
    predicted = {"a": 0.30, "b": 0.30, "c": 0.30, "d": 0.60}
    child = {"d": 0.32}  # off the ring, d only ships to its parent: 20 ms behind the ring
    out = policy.decide_mode(0.0, predicted, child_s=child, link_costs={("b", "d"): 0.001})
    pc = out[0]
    assert isinstance(pc, ParentChild)
    assert pc.ring == ("a", "b", "c")
    assert pc.parents == {"d": "b"}  # the cheapest link among the least-loaded ring members
    assert pc.wait_s == pytest.approx(0.02)
    assert isinstance(out[1], AdjustLr)
    assert out[1].lr["a"] == pytest.approx(0.1)  # d's gradient arrives within t_w: y = N


def test_switch_gain_keeps_a_nearly_equal_mode() -> None:
    cfg = PolicyConfig(mode=ModeConfig(switch_gain=0.5))
    policy = StragglerPolicy(RANKS, 400, sites=SITES, cfg=cfg)
    out = policy.decide_mode(0.0, {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.3})
    assert [d.action for d in out] == [Action.NONE]
    assert "switch_gain" in out[0].reason


def test_mode_falls_back_to_the_sites_windows() -> None:
    policy = StragglerPolicy(RANKS, 400, sites=SITES, cfg=CFG)
    for t in range(1, 31):
        for s in SITES:
            policy.observe_site(s, float(t), 3.0 if s == "c" else 1.0)
    out = policy.decide_mode(30.0)
    assert isinstance(out[0], BackupWorkers)
    assert "c" not in out[0].groups[0]


def test_tree_rebuilds_only_when_it_changes() -> None:
    policy = StragglerPolicy(RANKS, 400, cfg=CFG)
    costs = {"a": 0.01, "b": 0.05, "c": 0.02, "d": 0.30}
    out = policy.decide_tree(0.0, costs)
    assert isinstance(out[0], TreeRebuild)
    assert out[0].parents["a"] is None
    assert out[0].costs[0] == ("a", 0.01)
    assert [d.action for d in policy.decide_tree(1.0, costs)] == [Action.NONE]


def test_wan_wide_slowdown_is_reported_not_acted_on() -> None:
    cfg = PolicyConfig(detection=CFG.detection, links=LinkConfig(short_s=10.0, long_s=100.0))
    policy = StragglerPolicy(RANKS, 400, links=["x", "y"], cfg=cfg)
    run_ranks(policy, 0.0, 90.0, {})
    for k in range(1, 91):
        policy.observe_links(float(k), {"x": 0.1, "y": 0.1})
    for k in range(91, 101):
        policy.observe_links(float(k), {"x": 0.3, "y": 0.3})
    out = policy.decide(100.0)
    assert [d.action for d in out] == [Action.NONE]
    assert isinstance(out[0], NoAction) and "all links slow" in out[0].reason


def test_decide_merges_everything() -> None:
    policy = StragglerPolicy(RANKS, 400, sites=SITES, cfg=CFG)
    t = run_ranks(policy, 0.0, 60.0, {"r3": 20.0})
    out = policy.decide(t, predicted_s={"a": 1.0, "b": 1.0, "c": 1.0, "d": 3.0}, costs={"a": 0.1, "b": 0.2})
    assert [d.action for d in out] == [Action.ADJUST_BS, Action.BACKUP_WORKERS, Action.ADJUST_LR, Action.TREE]


def test_unknown_members_and_bad_config() -> None:
    policy = StragglerPolicy(RANKS, 400, cfg=CFG)
    with pytest.raises(LocalProtocolError):
        policy.observe_rank("zz", 1.0, 1.0)
    with pytest.raises(ConfigError):
        StragglerPolicy([], 10)
    with pytest.raises(ConfigError) as exc:
        from_mapping(PolicyConfig, {"batch": {"solver": "lp"}}, section="scheduler.stragglers")
    assert exc.value.fields["key"] == "scheduler.stragglers.batch.solver"
