"""A committed ``site_costs`` decision re-plans the WAN tree of simulated gateway nodes mid-job: every node
runs the same plan from the same effective iteration (the root moves), and every site's aggregates stay
bit-identical across the switch. Then the scheduler's tree policy in the loop, fed only the nodes' own
telemetry, makes the slow site a leaf."""

from __future__ import annotations

from collections.abc import Mapping

from gateways.rounds.config import RoundConfig
from scheduler.stragglers.daemon_policy import SiteStragglerPolicy
from scheduler.stragglers.site_config import SiteStragglerConfig
from sims.des.results import SimResult
from sims.des.scenario import ComputeSpec, GatewaySpec, LinkOverride, LinkSpec, PayloadSpec, Scenario
from sims.des.scheduled import ScheduledSimulation
from wanrt.protocol.job_settings import JobSettings, PlanSettings

NAMES = ("a", "b", "c", "d", "e")


def _scenario(slow: str, iterations: int) -> Scenario:
    rounds = RoundConfig(topology="tree", round_deadline_s=120.0, t_w_s=120.0, suspect_after_s=120.0)
    return Scenario(
        name="tree-switch",
        seed=3,
        names=NAMES,
        iterations=iterations,
        sample_interval_s=0.0,
        payload=PayloadSpec(layers=2, dense_len=16384, density=0.05),
        compute=ComputeSpec(model="normal", mean_s=0.05, sd_s=0.01, backward_fraction=0.5),
        network=LinkSpec(rate_bps=20e6, delay_s=0.01),
        links=tuple(LinkOverride(rate_bps=4e6, delay_s=0.01, a=slow, b=o) for o in NAMES if o != slow),
        gateway=GatewaySpec(link_rate_bps=20e6, rounds=rounds),
    )


class _OneDecision:
    """A policy that announces ``values`` once, at its first decide tick after ``at`` seconds."""

    def __init__(self, values: JobSettings, at: float) -> None:
        self.values, self.at, self.done = values, at, False

    def observe(self, site: str, metrics: Mapping[str, float], now: float) -> None:
        pass

    def decide(self, now: float) -> JobSettings | None:
        if self.done or now < self.at:
            return None
        self.done = True
        return self.values

    def committed(self, values: JobSettings, effective_iteration: int) -> None:
        pass


def _digests_agree(r: SimResult) -> None:
    per_round: dict[tuple[int, int], set[str]] = {}
    for (_, it, layer), (_, digest, _n) in r.aggregates.items():
        per_round.setdefault((it, layer), set()).add(digest)
    assert len(per_round) == r.iterations * r.layers  # every round delivered ...
    assert all(len(d) == 1 for d in per_round.values())  # ... with the same bits at every site
    assert len(r.aggregates) == len(r.sites) * r.iterations * r.layers


def test_a_committed_root_move_applies_at_one_iteration_everywhere() -> None:
    sc = _scenario("b", 24)
    # e becomes the root; b (slow) the most expensive site, so a leaf
    values = JobSettings(plan=PlanSettings(site_costs={"a": 0.3, "b": 0.9, "c": 0.2, "d": 0.25, "e": 0.1}))
    sim = ScheduledSimulation(sc, _OneDecision(values, 1.5), report_s=0.25)
    r = sim.run()
    assert r.finished and not r.problems
    (commit,) = sim.commits
    eff = commit.effective_iteration
    assert 0 < eff < sc.iterations - 2
    for node in sim.nodes.values():
        assert node.engine is not None
        before, after = node.engine.plan_for(eff - 1), node.engine.plan_for(eff)
        assert before.core == ("a",) and before.children_of("b") == ("d", "e")
        assert after.core == ("e",) and after.children_of("b") == ()
    assert len({n.engine.plan_for(eff).plan_id for n in sim.nodes.values() if n.engine}) == 1
    _digests_agree(r)


def test_the_policy_in_the_loop_makes_the_slow_site_a_leaf() -> None:
    sc = _scenario("b", 30)
    policy = SiteStragglerPolicy(NAMES, SiteStragglerConfig(modes=("latency_tree",)))
    sim = ScheduledSimulation(sc, policy, report_s=0.5)
    r = sim.run()
    assert r.finished and not r.problems
    assert len(sim.commits) == 1
    eff = sim.commits[0].effective_iteration
    plans = {n.engine.plan_for(eff) for n in sim.nodes.values() if n.engine is not None}
    assert len(plans) == 1
    (plan,) = plans
    assert plan.children_of("b") == () and not plan.in_core("b")
    _digests_agree(r)
