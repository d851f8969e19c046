"""The mode choice behind the scheduler node: its settings ride the same two-phase announcements as every
decision, so a mode switch takes effect at one job-wide iteration at every site, and the plan's reason is
what /status and the decisions file show."""

from __future__ import annotations

from typing import Any

from scheduler.adaptive import AdaptivePolicy
from scheduler.control.config import SchedulerConfig
from scheduler.control.convergence import PowerLawConvergence
from scheduler.control.mode_config import ModeConfig
from scheduler.mode_policy import ModePolicy
from scheduler.node import SchedulerNode
from scheduler.service.policies import make_policy
from tests.scheduler.test_node import _announces, _cfg
from wanrt.protocol import Telemetry
from wanrt.protocol.job_settings import JobSettings
from wanrt.protocol.scheduler.messages import AnnounceReply

SITES = ("a", "b", "c")
#: an outer loop converging slower than per-step exchange (so a fast link prefers per-step)
MODE = ModeConfig(
    enabled=True,
    steps_factor={c: (1.1, 1.2, 1.4, 2.0, 3.0) for c in ("fp32", "int8", "int4", "int2")},
)


class _Controller:
    """The StellaTrain controller's two readings the mode choice uses."""

    def __init__(self, bandwidth: float) -> None:
        self.bandwidth_estimate_bps = bandwidth


class _Adaptive:
    """An adaptive policy that decides nothing itself (the density etc. are not under test here)."""

    def __init__(self, bandwidth: float) -> None:
        self.policy = _Controller(bandwidth)
        self.next: JobSettings | None = None
        self.commits: list[int] = []

    def observe(self, site: str, metrics: Any, now: float) -> None:
        return None

    def decide(self, now: float) -> JobSettings | None:
        return self.next

    def committed(self, values: JobSettings, effective_iteration: int) -> None:
        self.commits.append(effective_iteration)


def _metrics(frontier: int, *, step_s: float = 0.06) -> dict[str, float]:
    return {
        "frontier": float(frontier),
        "trainer.params": 4_350_000.0,
        "trainer.micro_step_s": step_s,
        "cfg.density": 0.02,
        "cfg.staleness": 1.0,
    }


def _report_all(node: SchedulerNode, frontiers: dict[str, int], now: float) -> None:
    for s, f in frontiers.items():
        node.on_message(s, Telemetry(s, f, _metrics(f)), now)


def _commit(node: SchedulerNode, now: float) -> tuple[int, dict[str, Any]]:
    prep = _announces(node)
    assert {s for s, _ in prep} == set(SITES) and {m.phase for _, m in prep} == {"prepare"}
    assert len({(m.decision, m.effective_iteration) for _, m in prep}) == 1  # one iteration, job-wide
    assert len({tuple(sorted(m.values.items())) for _, m in prep}) == 1  # the same values everywhere
    for site, m in prep:
        node.on_message(site, AnnounceReply(m.decision, True, 0), now)
    commits = _announces(node)
    assert {m.phase for _, m in commits} == {"commit"}
    return prep[0][1].effective_iteration, dict(prep[0][1].values)


def test_a_mode_switch_is_announced_for_one_iteration_everywhere_and_confirmed() -> None:
    inner = _Adaptive(1e6)  # 1 Mbit/s: per-step exchange of 4.35 M parameters would take seconds
    policy = ModePolicy(SITES, inner, MODE)  # type: ignore[arg-type]
    node = SchedulerNode(_cfg(decide_interval_s=1.0), 0.0, policy=policy)
    for s in SITES:
        node.gateway_up(s, 0.0)
    _report_all(node, {"a": 10, "b": 12, "c": 11}, 0.5)
    node.pop_actions()
    node.tick(1.0)
    effective, values = _commit(node, 1.0)
    plan = policy.last_mode_plan
    assert plan is not None and plan.mode != "per_step" and plan.reason == "initial"
    assert values == {
        "outer_steps": plan.outer_steps,
        "fragments": plan.fragments,
        "outer_coding": plan.coding,
        "density": MODE.outer_density[plan.coding],  # the pseudo-gradient's density: the live density
    }
    assert plan.effective_iteration == effective == 12 + 5  # the frontier plus the announce margin
    assert inner.commits == [effective]
    # the link becomes a LAN: back to per-step exchange, again at one iteration everywhere
    # the adaptive policy's own density is per-step's: while the outer mode runs, the plan's pins it
    inner.next = JobSettings(density=0.2, staleness=0)
    _report_all(node, {"a": 20, "b": 20, "c": 20}, 2.0)
    node.tick(2.0)
    _, pinned = _commit(node, 2.0)
    assert pinned["density"] == MODE.outer_density[plan.coding] and pinned["staleness"] == 0
    inner.next = None
    inner.policy.bandwidth_estimate_bps = 100e9
    _report_all(node, {"a": 40, "b": 41, "c": 40}, 5.0)
    node.tick(6.0)
    effective2, values2 = _commit(node, 6.0)
    assert values2["outer_steps"] == 1 and values2["fragments"] == 1
    assert values2["outer_coding"] == plan.coding  # carried, unused by per-step exchange
    back = policy.last_mode_plan
    assert back is not None and back.mode == "per_step" and back.reason == "bandwidth_change"
    assert back.effective_iteration == effective2 == 41 + 5
    view = back.view()
    assert view["mode"] == "per_step" and "bandwidth_change" in view["why"]


def test_an_outer_steps_compute_is_divided_by_its_h() -> None:
    policy = ModePolicy(SITES, _Adaptive(1e6), MODE)  # type: ignore[arg-type]
    for s in SITES:
        m = _metrics(3)
        del m["trainer.micro_step_s"]  # a trainer that reports only its WAN iteration's compute
        m["trainer.compute_s"] = 0.06 * 16  # one WAN iteration = one outer step of 16 inner steps
        m["cfg.outer_steps"] = 16.0
        policy.observe(s, m, 0.1)
    assert policy.decide(1.0) is not None
    plan = policy.last_mode_plan
    assert plan is not None and abs(plan.compute_s - 0.06) < 1e-12


def test_no_plan_until_every_site_reported_its_step_time() -> None:
    inner = _Adaptive(1e6)
    policy = ModePolicy(SITES, inner, ModeConfig(enabled=True))  # type: ignore[arg-type]
    policy.observe("a", _metrics(3), 0.1)
    assert policy.decide(1.0) is None and policy.last_mode_plan is None


def test_the_daemon_config_turns_it_on_beside_the_adaptive_policy() -> None:
    made = make_policy(_cfg(mode=ModeConfig(enabled=True)))
    assert isinstance(made, ModePolicy) and isinstance(made.inner, AdaptivePolicy)
    assert made.policy is None  # the controller is built at the first trainer report
    assert isinstance(make_policy(_cfg()), AdaptivePolicy)


def test_with_the_real_adaptive_policy_the_first_plan_rides_its_decision() -> None:
    adaptive = AdaptivePolicy(SITES, SchedulerConfig(), PowerLawConvergence())
    policy = ModePolicy(SITES, adaptive, ModeConfig(enabled=True))
    now = 0.0
    for it in range(12):
        now += 0.2
        for s in SITES:
            m = _metrics(it)
            m.update(
                {
                    "trainer.iteration": float(it),
                    "trainer.world_size": 1.0,
                    "trainer.batch_size": float(8 + it % 3 * 8),
                    "trainer.compute_s": 0.06,
                    "trainer.iteration_s": 0.2,
                }
            )
            policy.observe(s, m, now)
    values = policy.decide(now)
    assert values is not None and values.outer_steps is not None and values.fragments is not None
    plan = policy.last_mode_plan
    assert plan is not None and plan.bandwidth_bps == adaptive.policy.bandwidth_estimate_bps  # type: ignore[union-attr]


def test_under_an_outer_loop_the_adaptive_batches_are_not_announced() -> None:
    """A site's batch is its inner optimizer's own under an outer loop: the adaptive policy's batch sizes,
    their weights and the lr scale that follows them are held back while an outer plan is in force or
    announced; its other values pass (density pinned by the plan), and under per-step exchange all pass."""
    inner = _Adaptive(1e6)  # slow link: the outer loop
    policy = ModePolicy(SITES, inner, MODE)  # type: ignore[arg-type]
    moved = JobSettings(
        staleness=0,
        lr_scale=2.0,
        site_batch_size={"a": 2, "b": 48, "c": 46},
        site_batch_weight={"a": 0.02, "b": 0.5, "c": 0.48},
    )
    inner.next = moved
    for s in SITES:
        policy.observe(s, _metrics(3), 0.1)
    first = policy.decide(1.0)
    plan = policy.last_mode_plan
    assert first is not None and plan is not None and plan.mode != "per_step"
    assert not first.site_batch_size and not first.site_batch_weight and first.lr_scale is None
    assert first.staleness == 0 and first.outer_steps == plan.outer_steps
    policy.committed(first, 20)
    again = policy.decide(2.0)  # the plan in force: still held
    assert again is not None and not again.site_batch_size and again.lr_scale is None
    # a fast link: per-step exchange again, whose batches the adaptive policy owns
    inner.policy.bandwidth_estimate_bps = 100e9
    back = policy.decide(10.0)
    assert back is not None and back.outer_steps == 1
    assert dict(back.site_batch_size) == {"a": 2, "b": 48, "c": 46} and back.lr_scale == 2.0


def test_an_outer_round_counts_its_inner_steps_samples() -> None:
    """A DiLoCo round of H inner steps covers H batches: the throughput model must see H × batch samples
    in the round's compute, or every site looks H times slower per sample (and the payload-time split,
    measured for one step, is not taken from a round)."""
    adaptive = AdaptivePolicy(SITES, SchedulerConfig(), PowerLawConvergence())
    seen: list[tuple[int, float, float | None]] = []

    class _Spy:
        def observe_rank(self, rank: int, **kw: Any) -> None:
            seen.append((kw["batch_size"], kw["compute_s"], kw["byte_s"]))

    m = _metrics(3)
    m.update(
        {
            "trainer.iteration": 3.0,
            "trainer.world_size": 2.0,
            "trainer.batch_size": 32.0,
            "trainer.compute_s": 16 * 0.06,
            "trainer.iteration_s": 1.2,
            "trainer.inner_steps": 16.0,
            "trainer.forward_s": 0.02,
            "trainer.backward_s": 0.9,
        }
    )
    adaptive.observe("a", m, 0.1)  # builds the controller
    adaptive.policy = _Spy()  # type: ignore[assignment]
    adaptive.observe("a", m, 0.2)
    assert seen == [(32 * 2 * 16, 16 * 0.06, None)]
