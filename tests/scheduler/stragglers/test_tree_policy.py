"""The scheduler's latency tree (STAR §IV-D2) on synthetic gateway telemetry, time passed in: a slow site
moves to a leaf, noise never re-plans, and ``site_costs`` is announced only when the tree's shape changes."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest

from scheduler.stragglers.daemon_policy import SiteStragglerPolicy
from scheduler.stragglers.site_config import SiteStragglerConfig
from scheduler.stragglers.tree import latency_tree, tree_depths
from scheduler.stragglers.tree_policy import SETTLE_ROUNDS, LatencyTreePolicy, TreeSettings
from wanrt.config import from_mapping
from wanrt.errors import ConfigError
from wanrt.protocol.job_settings import JobSettings, PlanSettings

SITES = ("a", "b", "c", "d", "e")
#: the gateways' name-order binary tree with root a
NAME_TREE: dict[str, str | None] = {"a": None, "b": "a", "c": "a", "d": "b", "e": "b"}
PAYLOAD = 250_000.0  # bytes per tree edge and direction per round


class Job:
    """Cumulative per-link counters of a job running ``tree`` (each edge moves one payload each way per
    round at the slower end's rate, times a noise factor), reported like ``GatewayNode.telemetry``."""

    def __init__(self, caps: Mapping[str, float], tree: Mapping[str, str | None], noise: float, seed: int):
        self.caps = dict(caps)
        self.tree = dict(tree)
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        self.frontier = 0.0
        self.bytes: dict[tuple[str, str], float] = {}
        self.busy: dict[tuple[str, str], float] = {}

    def step(self, rounds: int) -> None:
        self.frontier += rounds
        for c, p in self.tree.items():
            if p is None:
                continue
            for src, dst in ((c, p), (p, c)):
                rate = min(self.caps[src], self.caps[dst]) * (1 + self.noise * self.rng.uniform(-1, 1))
                self.bytes[(src, dst)] = self.bytes.get((src, dst), 0.0) + PAYLOAD * rounds
                self.busy[(src, dst)] = self.busy.get((src, dst), 0.0) + 8 * PAYLOAD * rounds / rate

    def report(self, site: str) -> dict[str, float]:
        m = {"frontier": self.frontier, "trainer.iteration": self.frontier}
        for (src, dst), b in self.bytes.items():
            if src == site:
                m[f"link.{dst}.busy_bytes"] = b
                m[f"link.{dst}.busy_s"] = self.busy[(src, dst)]
                m[f"link.{dst}.bytes_sent"] = b
        return m


def _run(policy: LatencyTreePolicy, job: Job, t0: float, ticks: int) -> list[tuple[float, dict[str, str]]]:
    """``ticks`` seconds of 2 rounds per second; every decision the policy makes (none is committed)."""
    out = []
    for k in range(ticks):
        now = t0 + k
        job.step(2)
        for s in SITES:
            policy.observe(s, job.report(s), now)
        v = policy.decide(now)
        if v is not None:
            out.append((now, v))
    return out


def _commit(policy: LatencyTreePolicy, job: Job, values: PlanSettings) -> None:
    eff = int(job.frontier) + 5
    policy.committed(values, eff)
    costs = dict(values.site_costs or {})
    job.tree = latency_tree(costs, 2)


def test_a_slow_interior_site_becomes_a_leaf() -> None:
    caps = dict.fromkeys(SITES, 20e6) | {"b": 4e6}
    job = Job(caps, NAME_TREE, 0.05, 1)
    policy = LatencyTreePolicy(SITES)
    decisions = _run(policy, job, 0.0, 10)
    assert decisions, "the name-order tree puts b above d and e: the policy must speak"
    costs = dict(decisions[0][1].site_costs or {})
    assert max(costs, key=lambda s: costs[s]) == "b"
    parents = latency_tree(costs, 2)
    assert all(p != "b" for p in parents.values())  # b has no children
    assert tree_depths(parents)["b"] >= 1
    # d and e only ever talked to b: their own links were never the limit, so they are not blamed
    assert costs["d"] == costs["a"] and costs["e"] == costs["a"]


def test_a_slow_root_steps_down() -> None:
    caps = dict.fromkeys(SITES, 20e6) | {"a": 4e6}
    policy = LatencyTreePolicy(SITES)
    decisions = _run(policy, Job(caps, NAME_TREE, 0.05, 2), 0.0, 10)
    assert decisions
    parents = latency_tree(dict(decisions[0][1].site_costs or {}), 2)
    assert parents["a"] is not None and all(p != "a" for p in parents.values())


@pytest.mark.parametrize("seed", range(5))
def test_noise_never_re_plans_a_tree_whose_slow_site_is_already_a_leaf(seed: int) -> None:
    caps = dict.fromkeys(SITES, 20e6) | {"e": 4e6}  # e is a leaf in name order
    policy = LatencyTreePolicy(SITES)
    assert _run(policy, Job(caps, NAME_TREE, 0.15, seed), 0.0, 60) == []
    assert policy.last is not None and not policy.last.announced
    # nor does equal noise on every link (no slow site at all)
    quiet = LatencyTreePolicy(SITES)
    assert _run(quiet, Job(dict.fromkeys(SITES, 20e6), NAME_TREE, 0.15, seed), 0.0, 60) == []


def test_announced_once_then_only_when_the_shape_changes() -> None:
    caps = dict.fromkeys(SITES, 20e6) | {"b": 4e6}
    job = Job(caps, NAME_TREE, 0.1, 3)
    policy = LatencyTreePolicy(SITES)
    first = _run(policy, job, 0.0, 10)
    assert first
    # until the commit the wish is repeated (the scheduler node keeps the newest): costs wander with the
    # noise, the shape does not
    shapes = {frozenset(latency_tree(dict(v.site_costs or {}), 2).items()) for _, v in first}
    assert len(shapes) == 1
    _commit(policy, job, first[0][1])
    assert policy.running == job.tree
    # the new tree runs: measured costs wander with the noise, the shape is kept
    assert _run(policy, job, 10.0, 60) == []
    # now d's link degrades too, and d sits above others in the running tree: one new shape
    interior = [s for s in SITES if s != "b" and any(p == s for p in job.tree.values()) and job.tree[s]]
    assert interior, "the running tree has an interior non-root site"
    job.caps[interior[0]] = 2e6
    # the first wish may come from a window only half past the change (a cost between old and new): its
    # tree is corrected once more at most, then the tree stays
    now, commits = 70.0, 0
    while (wish := _run(policy, job, now, 20)) and commits < 3:
        _commit(policy, job, wish[0][1])
        commits += 1
        now += 20.0
    assert 1 <= commits <= 2
    assert all(p != interior[0] for p in job.tree.values())
    assert _run(policy, job, now, 40) == []


def test_measurements_restart_after_a_commit() -> None:
    """A window spanning the switch would mix the two trees' traffic: nothing is decided until every site
    has a link measured past the new tree's effective iteration (+ SETTLE_ROUNDS)."""
    caps = dict.fromkeys(SITES, 20e6) | {"b": 4e6}
    job = Job(caps, NAME_TREE, 0.0, 4)
    policy = LatencyTreePolicy(SITES)
    (_, values), *_ = _run(policy, job, 0.0, 5)
    _commit(policy, job, values)
    assert policy.site_costs(5.0) is None  # every rate was dropped
    settle = (5 + SETTLE_ROUNDS) // 2  # ticks of 2 rounds until the new tree's windows may start
    _run(policy, job, 5.0, settle - 1)
    assert policy.site_costs(5.0 + settle) is None
    ticks = settle + 6  # then a window's min_busy_s (0.2 s a tick on the fast links)
    _run(policy, job, 5.0 + settle, 6)
    assert policy.site_costs(5.0 + ticks) is not None


def test_no_decision_before_every_site_has_a_measured_link() -> None:
    job = Job(dict.fromkeys(SITES, 20e6) | {"b": 4e6}, NAME_TREE, 0.0, 5)
    policy = LatencyTreePolicy(SITES)
    for now in range(5):
        job.step(2)
        for s in ("a", "b", "c"):  # d and e report nothing: their links' senders are unknown
            policy.observe(s, job.report(s), float(now))
    # b reports its links to d and e, so every site has an edge: the policy may decide
    assert policy.site_costs(4.0) is not None
    lonely = LatencyTreePolicy((*SITES, "f"))
    for now in range(5):
        job.step(2)
        for s in SITES:
            lonely.observe(s, job.report(s), float(now))
    assert lonely.site_costs(4.0) is None and lonely.decide(4.0) is None  # f never measured


def test_old_measurements_expire() -> None:
    job = Job(dict.fromkeys(SITES, 20e6) | {"b": 4e6}, NAME_TREE, 0.0, 6)
    policy = LatencyTreePolicy(SITES, TreeSettings(max_age_s=10.0))
    _run(policy, job, 0.0, 5)
    assert policy.site_costs(5.0) is not None
    assert policy.site_costs(100.0) is None


def test_a_star_moves_only_its_root() -> None:
    star = {s: (None if s == "a" else "a") for s in SITES}
    caps = dict.fromkeys(SITES, 20e6) | {"a": 4e6}
    policy = LatencyTreePolicy(SITES, TreeSettings(kind="star"))
    decisions = _run(policy, Job(caps, star, 0.05, 7), 0.0, 10)
    # every link touches a: each reads a's rate and nothing proves who is slow — the policy stays put
    assert decisions == []


def test_the_daemon_policy_announces_site_costs_in_latency_tree_mode() -> None:
    cfg = SiteStragglerConfig(modes=("latency_tree",))
    policy = SiteStragglerPolicy(SITES, cfg)
    assert policy.tree is not None
    job = Job(dict.fromkeys(SITES, 20e6) | {"b": 4e6}, NAME_TREE, 0.05, 8)
    values = None
    for now in range(10):
        job.step(2)
        for s in SITES:
            policy.observe(s, job.report(s), float(now))
        values = policy.decide(float(now)) or values
    assert values is not None and values == JobSettings(plan=PlanSettings(site_costs=values.plan.site_costs))
    policy.committed(values.overlay(JobSettings(density=0.1)), 30)
    assert policy.tree.running == latency_tree(dict(values.plan.site_costs or {}), 2)
    # while a parent–child plan runs (a ring with attached stragglers) there are no layers to order: an
    # interior site of the committed tree degrading would re-plan it, but not now
    job.tree = dict(policy.tree.running)
    interior = next(s for s in SITES if job.tree[s] is not None and s in job.tree.values())
    policy.plan.committed(PlanSettings(topology="parent_child", stragglers=("c",), t_w_s=0.0))
    job.caps[interior] = 1e6
    for now in range(40, 80):
        job.step(2)
        for s in SITES:
            policy.observe(s, job.report(s), float(now))
        assert policy.decide(float(now)) is None
    policy.plan.committed(PlanSettings(topology="tree", stragglers=()))  # back to the base plan: it may speak
    wishes = []
    for now in range(80, 100):
        job.step(2)
        for s in SITES:
            policy.observe(s, job.report(s), float(now))
        wishes.append(policy.decide(float(now)))
    assert any(w is not None and w.plan.site_costs is not None for w in wishes)
    # off by default: the existing policy never sees the links
    assert SiteStragglerPolicy(SITES).tree is None


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ({"modes": ["latency_tree"], "base_topology": "ring"}, "base_topology"),
        ({"tree_arity": 0}, "tree_arity"),
        ({"tree_gain": 1.0}, "tree_gain"),
        ({"tree_slow_ratio": 1.0}, "tree_slow_ratio"),
        ({"tree_min_busy_s": 0.0}, "tree_min_busy_s"),
        ({"tree_max_age_s": 0.1}, "tree_max_age_s"),
    ],
)
def test_bad_tree_settings_name_their_key(table: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_mapping(SiteStragglerConfig, table, section="scheduler.stragglers")
    assert err.value.key is not None and err.value.key.endswith(key)


def test_tree_settings_load_from_toml_tables() -> None:
    cfg = from_mapping(
        SiteStragglerConfig,
        {"modes": ["adjust_bs", "latency_tree"], "tree_gain": 0.3, "base_topology": "star"},
        section="scheduler.stragglers",
    )
    assert cfg.modes == ("adjust_bs", "latency_tree") and cfg.tree_gain == 0.3
