"""ZipLine-chosen local micro-steps per site (ElasticBSP §4) on synthetic telemetry: the policy alone and
inside the straggler policy's decisions."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.barrier.local_steps_policy import (
    LocalStepsConfig,
    LocalStepsPolicy,
    choose_local_steps,
    wait_share,
)
from scheduler.stragglers.daemon_policy import SiteStragglerPolicy
from scheduler.stragglers.site_config import SiteStragglerConfig
from wanrt.config import from_mapping
from wanrt.errors import ConfigError, LocalProtocolError
from wanrt.protocol.job_settings import JobSettings

ON = LocalStepsConfig(enabled=True)


def fed(times: dict[str, float], cfg: LocalStepsConfig = ON, n: int = 8) -> LocalStepsPolicy:
    pol = LocalStepsPolicy(list(times), cfg)
    for i in range(n):
        for s, t in times.items():
            pol.observe(s, t, float(i))
    return pol


def test_a_three_times_slower_site_gets_one_step_the_others_three() -> None:
    pol = fed({"a": 0.1, "b": 0.1, "c": 0.3})
    assert pol.decide(10.0) == {"a": 3, "b": 3, "c": 1}
    assert pol.last_choice is not None and pol.last_choice.share == pytest.approx(0.0, abs=1e-9)


def test_equal_sites_keep_one_step() -> None:
    pol = fed({"a": 0.2, "b": 0.2, "c": 0.2})
    assert pol.decide(10.0) is None
    assert pol.last_choice is not None and pol.last_choice.steps == {"a": 1, "b": 1, "c": 1}


@pytest.mark.parametrize("seed", range(5))
def test_noise_does_not_re_announce(seed: int) -> None:
    pol = fed({"a": 0.1, "b": 0.1, "c": 0.3})
    first = pol.decide(10.0)
    assert first is not None
    pol.committed(first)
    rng = np.random.default_rng(seed)  # ±10 % per report
    announced = []
    for i in range(200):
        for s, t in (("a", 0.1), ("b", 0.1), ("c", 0.3)):
            pol.observe(s, t * float(rng.uniform(0.9, 1.1)), 20.0 + i)
        announced.append(pol.decide(20.0 + i))
    assert announced == [None] * 200


def test_a_recovered_straggler_brings_every_site_back_to_one_step() -> None:
    pol = fed({"a": 0.1, "b": 0.1, "c": 0.3})
    pol.committed(pol.decide(10.0) or {})
    for i in range(8):
        pol.observe("c", 0.1, 20.0 + i)
    assert pol.decide(30.0) == {"a": 1, "b": 1, "c": 1}


def test_nearly_commensurate_intervals_take_the_early_barrier_not_the_far_exact_one() -> None:
    # ZipLine alone (R = 30) picks 29 vs 10 steps (d_Z = 0); 3 vs 1 waits 3 % of the superstep
    choice = choose_local_steps([0.1, 0.29], lookahead=30, wait_slack=0.05)
    assert choice.iterations == (3, 1)
    strict = choose_local_steps([0.1, 0.29], lookahead=30, wait_slack=0.0)
    assert strict.iterations == (29, 10) and strict.wait == pytest.approx(0.0, abs=1e-9)


def test_the_lookahead_bounds_every_sites_steps() -> None:
    choice = choose_local_steps([0.01, 1.0], lookahead=15, wait_slack=0.05)
    assert max(choice.iterations) <= 15 and choice.iterations[1] == 1


def test_the_median_ignores_one_outlier() -> None:
    pol = fed({"a": 0.1, "b": 0.3})
    pol.observe("b", 3.0, 9.0)  # one very slow report
    assert pol.decide(10.0) == {"a": 3, "b": 1}


def test_nothing_is_chosen_before_every_site_reported() -> None:
    pol = LocalStepsPolicy(["a", "b"], ON)
    pol.observe("a", 0.1, 0.0)
    assert pol.decide(1.0) is None
    pol.observe("b", float("nan"), 0.0)  # a bad sample is no sample
    assert pol.decide(1.0) is None


def test_wait_share_is_the_first_arrivals_idle_fraction() -> None:
    assert wait_share([0.1, 0.3], [1, 1]) == pytest.approx(2 / 3)
    assert wait_share([0.1, 0.3], [3, 1]) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(LocalProtocolError):
        choose_local_steps([0.1, 0.0], lookahead=4, wait_slack=0.0)


@pytest.mark.parametrize(
    ("key", "value"),
    [("lookahead", 0), ("lookahead", 257), ("wait_slack", 1.0), ("window", 0), ("enabled", 1)],
)
def test_bad_settings_are_refused(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        LocalStepsConfig(**{key: value})  # type: ignore[arg-type]
    assert info.value.key == key


def test_the_straggler_config_loads_the_local_steps_table() -> None:
    cfg = from_mapping(SiteStragglerConfig, {"local_steps": {"enabled": True, "lookahead": 4}}, section="s")
    assert cfg.local_steps == LocalStepsConfig(enabled=True, lookahead=4)
    assert SiteStragglerConfig().local_steps.enabled is False
    with pytest.raises(ConfigError, match="local_steps"):
        from_mapping(SiteStragglerConfig, {"local_steps": {"lookahead": 0}}, section="s")


def _report(
    pol: SiteStragglerPolicy, site: str, it: int, micro: float, k: int, batch: int, world: int
) -> None:
    pol.observe(
        site,
        {
            "trainer.iteration": float(it),
            "trainer.compute_s": micro * k,
            "trainer.micro_step_s": micro,
            "trainer.local_steps": float(k),
            "trainer.batch_size": float(batch),
            "trainer.world_size": float(world),
        },
        now=float(it),
    )


def test_the_straggler_policy_announces_steps_with_weights_by_samples() -> None:
    pol = SiteStragglerPolicy(["a", "b", "c"], SiteStragglerConfig(local_steps=ON))
    setup = {"a": (0.1, 32, 1), "b": (0.1, 32, 2), "c": (0.3, 32, 1)}  # micro-step s, batch, ranks
    for it in range(8):
        for s, (micro, batch, world) in setup.items():
            _report(pol, s, it, micro, 1, batch, world)
    values = pol.decide(8.0)
    assert values is not None
    assert values.site_local_steps == {"a": 3, "b": 3, "c": 1}
    assert not values.site_batch_size  # the batches in force stay
    samples = {"a": 3 * 32 * 1, "b": 3 * 32 * 2, "c": 1 * 32 * 1}
    total = sum(samples.values())
    for s, n in samples.items():
        assert values.site_batch_weight[s] == pytest.approx(n * 3 / total)
    pol.committed(values, 9)
    # the sites now report k micro-steps per WAN iteration: nothing new to announce
    for it in range(9, 20):
        for s, (micro, batch, world) in setup.items():
            _report(pol, s, it, micro, values.site_local_steps[s], batch, world)
    assert pol.decide(20.0) is None
    # a later ADJUST_BS split weights by k·batch·ranks too
    weights = pol._values({"a": 32, "b": 16, "c": 64})
    samples = {"a": 3 * 32, "b": 3 * 16 * 2, "c": 64}
    for s, n in samples.items():
        assert weights.site_batch_weight[s] == pytest.approx(n * 3 / sum(samples.values()))
    assert not weights.site_local_steps


def test_a_restarted_scheduler_learns_the_running_steps_from_reports() -> None:
    pol = LocalStepsPolicy(["a", "b", "c"], ON)
    for i in range(8):
        for s, t, k in (("a", 0.1, 3), ("b", 0.1, 3), ("c", 0.3, 1)):
            pol.observe(s, t, float(i), steps=float(k))
    assert pol.running == {"a": 3, "b": 3, "c": 1}
    assert pol.decide(10.0) is None  # what runs is what ZipLine picks: nothing to announce
    pol.committed({"c": 2})
    pol.observe("c", 0.3, 11.0, steps=1.0)  # an old report before the effective iteration
    assert pol.running["c"] == 2


def test_without_the_flag_the_straggler_policy_never_sets_steps() -> None:
    pol = SiteStragglerPolicy(["a", "b"])
    for it in range(8):
        _report(pol, "a", it, 0.1, 1, 32, 1)
        _report(pol, "b", it, 0.3, 1, 32, 1)
    values = pol.decide(8.0) or {}
    assert not any(k.startswith("local_steps@") for k in values)


def test_with_local_steps_on_adjust_bs_does_not_also_rebalance_a_persistent_straggler() -> None:
    # both levers balance each site's time per WAN iteration: together, ADJUST_BS equalised the per-batch
    # times local steps had already scaled by k, and the fast site ended k times slower (emulated demo)
    from scheduler.stragglers.config import DetectionConfig

    detect = DetectionConfig(slowness=1.3, short_s=2.0, long_s=4.0, min_coverage=0.5)
    announced: dict[bool, JobSettings] = {}
    for on in (False, True):
        cfg = SiteStragglerConfig(detection=detect, local_steps=ON if on else LocalStepsConfig())
        pol = SiteStragglerPolicy(["a", "b"], cfg)
        merged = JobSettings()
        for it in range(40):
            _report(pol, "a", it, 0.05, pol.local.running["a"] if on else 1, 32, 1)
            _report(pol, "b", it, 0.25, 1, 32, 1)
            values = pol.decide(float(it) + 0.5)
            if values:
                merged = merged.overlay(values)
                pol.committed(values, it + 1)
        announced[on] = merged
    assert announced[False].site_batch_size  # the straggler is there to rebalance
    assert announced[True].site_local_steps["a"] == 5 and announced[True].site_local_steps["b"] == 1
    assert not announced[True].site_batch_size
