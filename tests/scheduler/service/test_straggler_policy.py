"""The scheduler daemon's straggler policy (``policy = "stragglers"``): config, the policy on telemetry, and
its wiring through the scheduler node's two-phase announce."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.daemon_config import SchedulerDaemonConfig, load_scheduler_config
from scheduler.node import SchedulerNode
from scheduler.service.policies import make_policy
from scheduler.stragglers.config import BatchConfig, DetectionConfig
from scheduler.stragglers.daemon_policy import SiteStragglerPolicy
from scheduler.stragglers.site_config import SiteStragglerConfig
from wanrt.errors import ConfigError
from wanrt.protocol import Telemetry
from wanrt.protocol.scheduler.messages import Announce, AnnounceReply

SITES = ("a", "b", "c")
#: short windows, so a few seconds of reports fill them
FAST = SiteStragglerConfig(
    detection=DetectionConfig(slowness=1.5, short_s=2.0, long_s=4.0, min_coverage=0.5),
    batch=BatchConfig(rebalance_gain=0.1),
)


def report(
    site: str, it: int, compute_s: float, per_rank: int = 32, world: int = 1, **extra: float
) -> dict[str, float]:
    """Telemetry as a gateway forwards it: its trainer's last iteration under ``trainer.*``."""
    return {
        "frontier": float(it),
        "trainer.iteration": float(it),
        "trainer.compute_s": compute_s,
        "trainer.iteration_s": compute_s + 0.01,
        "trainer.batch_size": float(per_rank),
        "trainer.world_size": float(world),
        **extra,
    }


def feed(policy: SiteStragglerPolicy, times: dict[str, float], t0: float, t1: float, it0: int = 0) -> int:
    """One report per site every 0.25 s from t0 to t1; each report a new iteration."""
    it = it0
    t = t0
    while t <= t1:
        for s, c in times.items():
            policy.observe(s, report(s, it, c), t)
        it += 1
        t += 0.25
    return it


# -- configuration ---------------------------------------------------------------------------------------


def _toml(tmp: Path, extra: str) -> Path:
    p = tmp / "job.toml"
    p.write_text(
        '[scheduler]\njob = "j"\nsites = ["a", "b", "c"]\nsecret = "' + "s" * 32 + '"\n'
        'policy = "stragglers"\n' + extra
    )
    return p


def test_the_stragglers_policy_and_its_tables_load_from_toml(tmp_path: Path) -> None:
    cfg = load_scheduler_config(
        _toml(
            tmp_path,
            '[scheduler.stragglers]\ntrigger = "transient"\n'
            "[scheduler.stragglers.detection]\nshort_s = 2.0\nlong_s = 4.0\nslowness = 1.3\n"
            "[scheduler.stragglers.batch]\nmin_batch = 4\nrebalance_gain = 0.2\n",
        )
    )
    assert cfg.policy == "stragglers"
    assert cfg.stragglers.trigger == "transient"
    assert (cfg.stragglers.detection.short_s, cfg.stragglers.detection.long_s) == (2.0, 4.0)
    assert cfg.stragglers.detection.slowness == 1.3
    assert (cfg.stragglers.batch.min_batch, cfg.stragglers.batch.rebalance_gain) == (4, 0.2)
    policy = make_policy(cfg)
    assert isinstance(policy, SiteStragglerPolicy)
    assert policy.cfg == cfg.stragglers and policy.sites == SITES


def test_defaults_are_antdts_values() -> None:
    cfg = SchedulerDaemonConfig(job="j", sites=SITES, secret="s" * 32, policy="stragglers")
    d = cfg.stragglers.detection
    assert (d.slowness, d.short_s, d.long_s) == (1.5, 300.0, 600.0)  # λ and AntDT's 5 / 10 minutes
    assert cfg.stragglers.trigger == "persistent"


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ("[scheduler.stragglers.detection]\nslowness = 1.1\n", "scheduler.stragglers.detection.slowness"),
        ("[scheduler.stragglers.detection]\nwindow = 3\n", "scheduler.stragglers.detection.window"),
        ('[scheduler.stragglers]\ntrigger = "always"\n', "scheduler.stragglers.trigger"),
        ("[scheduler.stragglers.batch]\nmin_batch = 0\n", "scheduler.stragglers.batch.min_batch"),
    ],
)
def test_a_bad_straggler_setting_names_its_key(tmp_path: Path, table: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_scheduler_config(_toml(tmp_path, table))
    assert err.value.fields["key"] == key


def test_an_unknown_policy_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError) as err:
        SchedulerDaemonConfig(job="j", sites=SITES, secret="s" * 32, policy="antdt")
    assert err.value.fields["key"] == "policy" and "stragglers" in str(err.value)


# -- the policy ------------------------------------------------------------------------------------------


def test_a_persistent_straggler_site_gets_eq3s_split_with_the_global_batch_kept() -> None:
    p = SiteStragglerPolicy(SITES, FAST)
    feed(p, {"a": 0.1, "b": 0.1, "c": 0.3}, 0.0, 4.0)
    values = p.decide(4.0)
    assert values is not None
    batch = {s: values[f"batch_size@{s}"] for s in SITES}
    assert sum(batch.values()) == 96  # Σ B_i = B (AntDT Eq. 3)
    # v = (320, 320, 106.7) samples/s: B_i ∝ v_i → 41.1, 41.1, 13.7; the slowest BPT ~0.129 s, not 0.3
    assert abs(batch["a"] - batch["b"]) <= 1 and batch["c"] < min(batch["a"], batch["b"])
    assert abs(batch["c"] - 96 / 7) <= 1
    bpt = {"a": batch["a"] / 320, "b": batch["b"] / 320, "c": batch["c"] / (32 / 0.3)}
    assert max(bpt.values()) < 0.14
    assert sum(values[f"batch_weight@{s}"] for s in SITES) == pytest.approx(3.0)
    assert values["batch_weight@c"] == pytest.approx(batch["c"] * 3 / 96)
    assert p.last_report is not None and p.last_report.persistent == ["c"]
    assert p.last_action is not None and p.last_action.previous_bpt_s == pytest.approx(0.3)


def test_no_decision_before_the_long_window_is_covered_or_without_a_straggler() -> None:
    p = SiteStragglerPolicy(SITES, FAST)
    feed(p, {"a": 0.1, "b": 0.1, "c": 0.3}, 0.0, 1.0)
    assert p.decide(1.0) is None  # 1 s of a 4 s window: not yet persistent (min_coverage 0.5)
    q = SiteStragglerPolicy(SITES, FAST)
    feed(q, {"a": 0.1, "b": 0.11, "c": 0.12}, 0.0, 6.0)
    assert q.decide(6.0) is None  # the spread of a healthy job is no straggler
    r = SiteStragglerPolicy(SITES, FAST)
    feed(r, {"a": 0.1, "b": 0.1}, 0.0, 6.0)
    assert r.decide(6.0) is None  # site c never reported: nothing to allocate by


def test_transient_trigger_acts_on_the_short_window() -> None:
    cfg = SiteStragglerConfig(detection=FAST.detection, batch=FAST.batch, trigger="transient")
    p = SiteStragglerPolicy(SITES, cfg)
    feed(p, {"a": 0.1, "b": 0.1, "c": 0.3}, 0.0, 1.0)
    values = p.decide(1.0)
    assert values is not None and values["batch_size@c"] < values["batch_size@a"]


def test_a_repeated_iteration_is_one_sample() -> None:
    p = SiteStragglerPolicy(SITES, FAST)
    for t in (0.0, 0.25, 0.5):
        p.observe("a", report("a", 7, 0.1), t)  # the gateway re-reports its trainer's last iteration
    p.observe("a", report("a", 8, 0.1), 0.75)
    assert p.detector.throughput("a", 0.75) == pytest.approx(320.0)
    assert len(p.detector._members["a"].bpt_long) == 2


def test_reports_without_trainer_measurements_are_ignored() -> None:
    p = SiteStragglerPolicy(SITES, FAST)
    p.observe("a", {"frontier": 3.0}, 0.0)
    p.observe("a", report("a", 1, float("nan")), 0.0)
    p.observe("a", report("a", 2, 0.0), 0.0)
    p.observe("zz", report("zz", 1, 0.1), 0.0)  # not a site of this job
    assert p.detector.throughput("a", 0.0) is None


def test_per_rank_batches_count_the_sites_world_size() -> None:
    p = SiteStragglerPolicy(("a", "b"), FAST)
    t, it = 0.0, 0
    while t <= 4.0:
        p.observe("a", report("a", it, 0.1, per_rank=16, world=2), t)  # 32 samples in 0.1 s
        p.observe("b", report("b", it, 0.4, per_rank=32, world=1), t)  # 32 samples in 0.4 s
        t, it = t + 0.25, it + 1
    values = p.decide(4.0)
    assert values is not None
    samples = values["batch_size@a"] * 2 + values["batch_size@b"]
    assert abs(samples - 64) <= 2  # per-rank rounding at a two-rank site
    assert values["batch_size@a"] * 2 > 3 * values["batch_size@b"]  # Eq. 3: ~4:1 in samples


def test_after_commit_small_changes_are_not_announced_and_recovery_rebalances() -> None:
    p = SiteStragglerPolicy(SITES, FAST)
    it = feed(p, {"a": 0.1, "b": 0.1, "c": 0.3}, 0.0, 4.0)
    values = p.decide(4.0)
    assert values is not None
    p.committed(values, 20)
    split = {s: int(values[f"batch_size@{s}"]) for s in SITES}
    # the sites now run the new split at the same per-sample speed: nothing more to gain
    t, n = 4.25, it
    while t <= 8.0:
        for s, per_sample in (("a", 0.1 / 32), ("b", 0.1 / 32), ("c", 0.3 / 32)):
            p.observe(s, report(s, n, per_sample * split[s], per_rank=split[s]), t)
        t, n = t + 0.25, n + 1
    assert p.decide(8.0) is None
    # site c recovers: Eq. 3 over the new throughputs moves back towards the even split
    while t <= 14.0:
        for s in SITES:
            p.observe(s, report(s, n, 0.1 / 32 * split[s], per_rank=split[s]), t)
        t, n = t + 0.25, n + 1
    back = p.decide(14.0)
    assert back is not None
    assert {back[f"batch_size@{s}"] for s in SITES} == {32}


def test_a_manual_split_is_what_the_policy_starts_from() -> None:
    p = SiteStragglerPolicy(SITES, FAST)
    p.committed({"batch_size@a": 40, "batch_size@b": 40, "batch_size@c": 16, "density": 0.1}, 5)
    assert p._running == {"a": 40, "b": 40, "c": 16}
    p.committed({"density": 0.2}, 9)  # no split in it: the running one stays
    assert p._running == {"a": 40, "b": 40, "c": 16}


# -- through the scheduler node ----------------------------------------------------------------------


def test_the_node_announces_the_split_to_every_gateway_for_one_iteration() -> None:
    cfg = SchedulerDaemonConfig(
        job="j",
        sites=SITES,
        secret="s" * 32,
        policy="stragglers",
        stragglers=FAST,
        decide_interval_s=0.5,
        announce_margin=6,
    )
    policy = make_policy(cfg)
    node = SchedulerNode(cfg, 0.0, policy=policy)
    for s in SITES:
        node.gateway_up(s, 0.0)
    t, it = 0.0, 0
    prepares: list[tuple[str, Announce]] = []
    while t <= 6.0 and not prepares:
        for s, c in (("a", 0.1), ("b", 0.1), ("c", 0.3)):
            node.on_message(s, Telemetry(s, it, report(s, it, c)), t)
        node.tick(t)
        prepares = [
            (a.site, a.msg)
            for a in node.pop_actions()
            if isinstance(a.msg, Announce) and a.msg.phase == "prepare"
        ]
        t, it = t + 0.25, it + 1
    assert {s for s, _ in prepares} == set(SITES)
    (decision,) = {m.decision for _, m in prepares}
    (effective,) = {m.effective_iteration for _, m in prepares}
    assert effective == it - 1 + cfg.announce_margin
    values = prepares[0][1].values
    assert values["batch_size@c"] < values["batch_size@a"]
    for s in SITES:
        node.on_message(s, AnnounceReply(decision, True, it), t)
    commits = [a for a in node.pop_actions() if isinstance(a.msg, Announce) and a.msg.phase == "commit"]
    assert len(commits) == 3 and node.current is not None and node.current.values == values
    assert isinstance(policy, SiteStragglerPolicy) and policy._running is not None
