"""STAR's static x-order chosen by the scheduler daemon's straggler policy (``modes`` includes
``x_order``): Eq. 1 with x < N against x = N on the sites' measured times, the plan settings it announces,
STAR-H's pick among the plan modes, the way back, what a restarted scheduler learns, and the config checks."""

from __future__ import annotations

import pytest

from scheduler.stragglers.config import DetectionConfig, ModeConfig
from scheduler.stragglers.daemon_policy import SiteStragglerPolicy
from scheduler.stragglers.site_config import SiteStragglerConfig
from scheduler.stragglers.star_modes import choose_mode, progress_time
from tests.scheduler.service.test_straggler_policy import feed, report
from wanrt.errors import ConfigError
from wanrt.protocol.job_settings import JobSettings, PlanSettings

DETECT = DetectionConfig(slowness=1.3, short_s=2.0, long_s=4.0, min_coverage=0.5)
BATCH = 32
SITES = ("a", "b", "c", "d")
SLOW_D = {"a": 0.1, "b": 0.1, "c": 0.1, "d": 0.4}


def _policy(modes: tuple[str, ...] = ("x_order",), **kw: object) -> SiteStragglerPolicy:
    kw.setdefault("noise_scale", 20.0)
    cfg = SiteStragglerConfig(detection=DETECT, modes=modes, **kw)  # type: ignore[arg-type]
    return SiteStragglerPolicy(SITES, cfg)


def test_a_persistent_straggler_gets_the_x_order_eq1_prefers() -> None:
    policy = _policy()
    feed(policy, SLOW_D, 0.0, 5.0)
    values = policy.decide(5.0)
    m = len(SITES) * BATCH
    # x = 3 (leave d's pushes to later rounds): 4/3 more updates at a quarter of the time per update
    assert progress_time(20.0, m, 4, 3, 0.1) < progress_time(20.0, m, 4, 4, 0.4)
    assert values == JobSettings(plan=PlanSettings(topology="tree", stragglers=(), x_order=3))
    choice = choose_mode(list(SLOW_D.values()), 20.0, m, ModeConfig(modes=("bsp", "x_order")))
    assert choice.kind == "x_order" and choice.order == 3
    last = policy.plan.last
    assert last is not None and last.announced and last.chosen.time == pytest.approx(choice.time)


def test_with_both_plan_modes_the_least_predicted_time_wins() -> None:
    # Eq. 3 with y reports waits for the ring and t_w, at least the y-th smallest time Eq. 1's x-order with
    # x = y waits for: on a one-root plan x-order is never worse, and ties go to it (the simpler mode)
    m = len(SITES) * BATCH
    for times in (SLOW_D, {"a": 0.1, "b": 0.1, "c": 0.2, "d": 0.4}):
        policy = _policy(("parent_child", "x_order"))
        feed(policy, times, 0.0, 5.0)
        values = policy.decide(5.0)
        t = list(times.values())
        want = choose_mode(t, 20.0, m, ModeConfig(modes=("bsp", "x_order", "parent_child")))
        pc = choose_mode(t, 20.0, m, ModeConfig(modes=("bsp", "parent_child"), max_wait_s=0.3))
        assert want.kind == "x_order" and want.time <= pc.time
        assert values == JobSettings(plan=PlanSettings(topology="tree", stragglers=(), x_order=want.order))


def test_x_order_goes_back_when_the_straggler_recovers_and_does_not_flap_meanwhile() -> None:
    policy = _policy()
    it = feed(policy, SLOW_D, 0.0, 5.0)
    values = policy.decide(5.0)
    assert values is not None
    policy.committed(values, 40)
    assert policy.plan.x_order == 3 and policy.plan.detached
    it = feed(policy, SLOW_D, 5.25, 6.0, it0=it)
    assert policy.decide(6.0) is None  # the same x-order is running
    feed(policy, dict.fromkeys(SITES, 0.1), 6.25, 12.0, it0=it)
    back = policy.decide(12.0)
    assert back == JobSettings(plan=PlanSettings(topology="tree", stragglers=(), x_order=0))
    policy.committed(back, 80)
    assert policy.plan.x_order == 0 and not policy.plan.detached


def test_a_transient_slowdown_does_not_enter_x_order() -> None:
    detect = DetectionConfig(slowness=1.3, short_s=1.0, long_s=20.0, min_coverage=0.5)
    cfg = SiteStragglerConfig(detection=detect, modes=("x_order",), noise_scale=20.0)
    policy = SiteStragglerPolicy(SITES, cfg)
    feed(policy, dict.fromkeys(SITES, 0.1), 0.0, 4.0)
    feed(policy, SLOW_D, 4.25, 5.0, it0=100)
    assert policy.detector.report(5.0).transient == ["d"]
    assert policy.decide(5.0) is None


def test_a_restarted_scheduler_learns_the_x_order_from_telemetry_and_announces_recovery() -> None:
    policy = _policy()
    running = {"plan.parent_child": 0.0, "plan.x_order": 3.0}
    it, t = 0, 0.0
    while t <= 6.0:  # d has recovered: every site equally fast
        for s in SITES:
            policy.observe(s, {**report(s, it, 0.1), **running}, t)
        it += 1
        t += 0.25
    assert policy.plan.x_order == 3
    assert policy.decide(6.0) == JobSettings(plan=PlanSettings(topology="tree", stragglers=(), x_order=0))


def test_a_manual_x_order_is_tracked_and_nonsense_is_ignored() -> None:
    policy = _policy()
    policy.committed(JobSettings(plan=PlanSettings(x_order=2)), 10)
    assert policy.plan.x_order == 2
    policy.committed(JobSettings(plan=PlanSettings(x_order=4)), 20)  # x = N is waiting for everyone
    assert policy.plan.x_order == 0


@pytest.mark.parametrize(
    ("kw", "key"),
    [({"noise_scale": 0.0}, "noise_scale"), ({"base_topology": "ring"}, "base_topology")],
)
def test_x_order_needs_a_noise_scale_and_a_one_root_plan(kw: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        SiteStragglerConfig(modes=("x_order",), **{"noise_scale": 20.0, **kw})  # type: ignore[arg-type]
    assert err.value.fields["key"] == key
