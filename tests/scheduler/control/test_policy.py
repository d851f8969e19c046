"""SchedulerPolicy: telemetry in, decisions out; the closed loop in the toy iteration model; config."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.control.config import SchedulerConfig
from scheduler.control.convergence import PowerLawConvergence
from scheduler.control.decision import Decision
from scheduler.control.policy import MAX_PENDING_ITERATIONS, SchedulerPolicy
from sims.policies.toy_sim import run_toy_loop
from wanrt.config import from_mapping
from wanrt.errors import ConfigError, RemoteProtocolError

VIT = 88_000_000
GPUS = [(28.0, 300.0), (20.0, 99.0)]  # Table 2, ViT-B/16: RTX 4090, RTX 2080 Ti


def _policy(**over: object) -> SchedulerPolicy:
    cfg = dataclasses.replace(SchedulerConfig(warmup_iterations=0), **over)  # type: ignore[arg-type]
    return SchedulerPolicy(cfg, PowerLawConvergence(), n_params=VIT, ranks=[3, 7], initial_density=0.001)


def _feed(p: SchedulerPolicy, it: int, now: float, wall: float = 0.3) -> None:
    p.observe_rank(3, iteration=it, batch_size=28, compute_s=28 / 300, iteration_s=wall, now=now)
    p.observe_rank(7, iteration=it, batch_size=20, compute_s=20 / 99, iteration_s=wall, now=now)


def test_no_decision_before_every_rank_reported() -> None:
    p = _policy()
    assert p.decide(0.0) is None
    p.observe_rank(3, iteration=0, batch_size=28, compute_s=0.1, iteration_s=0.3, now=0.0)
    assert p.decide(0.0) is None


def test_first_decision_and_its_contents() -> None:
    p = _policy()
    _feed(p, 0, 0.3)
    d = p.decide(0.3)
    assert isinstance(d, Decision) and d.reason == "initial"
    assert d.ranks == (3, 7) and d.effective_iteration is None
    assert d.batch_of(3) > d.batch_of(7)  # the RTX 4090 gets the larger batch
    assert d.compression_rate == pytest.approx(1 - d.density)
    assert d.staleness in (0, 1) and d.total_batch == sum(d.batch_sizes)
    assert p.decide(0.4) is None  # nothing changed: nothing to announce
    filled = d.effective_from(5)
    assert filled.effective_iteration == 5 and filled.density == d.density
    p.confirm(filled)
    with pytest.raises(ConfigError):
        p.confirm(d)  # without an effective iteration


def test_old_plan_telemetry_never_raises_but_may_lower() -> None:
    """A raise from the old plan would compound with the one already on its way; a lowering is set from
    the rate the old plan measured, so taking it before the new plan runs is safe and finds a drop sooner."""
    p = _policy(link_rate_floor=0.0)
    _feed(p, 0, 0.3)
    d = p.decide(0.3)
    assert d is not None
    p.confirm(d.effective_from(20))
    before = p.bandwidth_estimate_bps
    for it in range(1, 6):  # old plan's telemetry, no idle: would raise, must not
        _feed(p, it, 0.3 * it, wall=20 / 99)
    p.decide(2.0)
    assert p.bandwidth_estimate_bps == before
    for it in range(6, 12):  # old plan's telemetry, very idle: the link dropped, lower now
        _feed(p, it, 0.3 * it, wall=1.0)
    p.decide(4.0)
    assert p.bandwidth_estimate_bps < before


def test_pending_telemetry_is_bounded() -> None:
    p = _policy()
    for it in range(MAX_PENDING_ITERATIONS + 50):
        p.observe_rank(3, iteration=it, batch_size=28, compute_s=0.1, iteration_s=0.3, now=float(it))
    assert len(p._window) == MAX_PENDING_ITERATIONS and min(p._window) == 50


def test_unknown_rank_and_bad_values_are_remote_errors() -> None:
    p = _policy()
    with pytest.raises(RemoteProtocolError):
        p.observe_rank(99, iteration=0, batch_size=8, compute_s=0.1, iteration_s=0.2, now=0.0)
    with pytest.raises(RemoteProtocolError):
        p.observe_rank(3, iteration=0, batch_size=8, compute_s=float("nan"), iteration_s=0.2, now=0.0)
    with pytest.raises(ConfigError):
        SchedulerPolicy(SchedulerConfig(), PowerLawConvergence(), n_params=VIT, ranks=[1, 1])


def test_warmup_stages_are_announced_and_end_at_the_searched_density() -> None:
    cfg = SchedulerConfig(warmup_iterations=40, warmup_stages=4, warmup_start_density=0.25)
    p = SchedulerPolicy(cfg, PowerLawConvergence(), n_params=VIT, ranks=[0, 1], initial_density=0.25)
    trace = run_toy_loop(p, GPUS, lambda k: 100e6, rounds=14, iterations_per_round=5)
    ds = [d for d in trace.decisions if d is not None]
    reasons = [d.reason for d in ds]
    assert reasons[0] == "initial" and "warmup_stage" in reasons
    assert ds[0].density == pytest.approx(0.25)
    assert ds[-1].density == pytest.approx(ds[-1].target_density)
    assert len({round(d.density, 9) for d in ds}) >= 4


def test_daemon_level_bandwidth_target_in_the_toy_loop() -> None:
    """100 → 30 → 100 Mbit/s; ten decisions after each step the estimate is within 20 %."""
    p = _policy()
    steps = (30, 60)
    rate = lambda k: 30e6 if steps[0] <= k < steps[1] else 100e6  # noqa: E731
    trace = run_toy_loop(p, GPUS, rate, rounds=90, iterations_per_round=5, noise=0.02, seed=3)
    err = trace.relative_errors()
    for s in steps:
        assert max(err[s + 10 : s + 30]) <= 0.20, err[s:]
    last = trace.decisions[-1]
    assert last is not None and last.staleness == 1  # Eq. 6 sizes the exchange to compute: overlap pays


def test_config_loads_from_a_table_and_names_bad_keys() -> None:
    cfg = from_mapping(
        SchedulerConfig, {"tta_lambda": 1.5, "eq6_iteration_time": "slowest_rank"}, section="scheduler"
    )
    assert cfg.tta_lambda == 1.5 and cfg.eq6_iteration_time == "slowest_rank"
    for table, key in (
        ({"bw_idle_threshold": 1.5}, "scheduler.bw_idle_threshold"),
        ({"bw_target_idle": 0.2}, "scheduler.bw_target_idle"),
        ({"r_max": 1.0}, "scheduler.r_max"),
        ({"nope": 1}, "scheduler.nope"),
        ({"eq6_iteration_time": "sometimes"}, "scheduler.eq6_iteration_time"),
        ({"max_batch": 0}, "scheduler.max_batch"),
    ):
        with pytest.raises(ConfigError) as info:
            from_mapping(SchedulerConfig, table, section="scheduler")
        assert info.value.fields["key"] == key


def test_decision_validates_itself() -> None:
    ok = dict(
        density=0.01,
        target_density=0.01,
        ranks=(0, 1),
        batch_sizes=(8, 4),
        staleness=1,
        decided_at=0.0,
        reason="initial",
        bandwidth_bps=1e8,
        predicted_compute_s=0.1,
        predicted_exchange_s=0.1,
    )
    Decision(**ok)  # type: ignore[arg-type]
    for bad in (
        {"density": 0.0},
        {"staleness": 2},
        {"ranks": (1, 0)},
        {"batch_sizes": (8,)},
        {"batch_sizes": (8, 0)},
        {"bandwidth_bps": float("inf")},
    ):
        with pytest.raises(ConfigError):
            Decision(**{**ok, **bad})  # type: ignore[arg-type]
