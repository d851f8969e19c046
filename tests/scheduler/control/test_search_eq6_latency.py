"""Eq. 6 with a measured latency and serial payloads (issue 9): imposed where it can be met, priced where
not; the exchange is ``L + h · payload / B``."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from scheduler.control.byte_cost import ByteCostFit
from scheduler.control.config import SchedulerConfig
from scheduler.control.convergence import PowerLawConvergence
from scheduler.control.policy import SchedulerPolicy
from scheduler.control.search import evaluate_plan, search
from scheduler.control.serial_payloads import serial_payloads
from scheduler.control.throughput import ThroughputFit
from wanrt.errors import ConfigError

M = 1e6
N_PARAMS = 10_500_000  # the overhead benchmark's MLP
#: the demo's stand-in: fixed lr at its 96-sample batch, 10 % penalty at density 0.02
CONV = PowerLawConvergence.from_critical_batch(
    12.0, 96.0, fixed_lr=True, density_coef=0.10 / (0.02**-0.5 - 1)
)
FITS = [ThroughputFit(1.0, 32 / 0.07, True, 10)] * 3  # 70 ms for 32 samples per rank


def _cfg(**kw: object) -> SchedulerConfig:
    base: dict[str, object] = {"bytes_per_element": 4.0, "latency_window": 16, "eq6_with_latency": "impose"}
    base.update(kw)
    return SchedulerConfig(**base)  # type: ignore[arg-type]


def test_imposed_eq6_hides_the_exchange_where_price_alone_leaves_it_exposed() -> None:
    # the payload's CPU time (byte_cost.py) paces the priced iteration too: 30 ms + 20 ms per MB per rank
    costs = [ByteCostFit(0.03, 0.02e-6)] * 3
    kw = {"bandwidth_bps": 100 * M, "n_params": N_PARAMS, "convergence": CONV, "byte_costs": costs}
    cfg = _cfg(exchange_serial_payloads=4.0)
    priced = search(FITS, config=dataclasses.replace(cfg, eq6_with_latency="price"), latency_s=0.04, **kw)  # type: ignore[arg-type]
    imposed = search(FITS, config=cfg, latency_s=0.04, **kw)  # type: ignore[arg-type]
    # priced: the bytes' CPU time counts as time to hide the exchange behind, and the exchange outlasts the
    # trainers' compute (Eq. 6's t_i = x_i / f_i(x_i))
    assert not priced.feasible
    assert imposed.feasible
    t_i = imposed.batches[0] / FITS[0].beta
    assert imposed.exchange_time_s <= t_i + 1e-9
    # hiding costs a lower density and a larger batch than the priced optimum, never the other way
    assert imposed.density < priced.density
    assert imposed.total_batch > priced.total_batch


def test_imposed_plan_is_the_best_feasible_candidate_on_a_brute_force_grid() -> None:
    cfg = _cfg(exchange_serial_payloads=4.0)
    plan = search(
        FITS, bandwidth_bps=100 * M, n_params=N_PARAMS, convergence=CONV, config=cfg, latency_s=0.03
    )
    assert plan.feasible
    best = np.inf
    for x, d in itertools.product(range(4, 33), np.geomspace(1e-3, 0.05, 60)):
        cand = evaluate_plan(
            FITS,
            (x, x, x),
            1.0 - float(d),
            bandwidth_bps=100 * M,
            n_params=N_PARAMS,
            convergence=CONV,
            config=cfg,
            latency_s=0.03,
        )
        if cand.feasible:
            best = min(best, cand.objective)
    assert np.isfinite(best)
    assert plan.objective <= best + 1e-9


def test_where_no_candidate_meets_eq6_the_imposed_mode_prices_like_price() -> None:
    # 80 ms of latency against at most 70 ms of compute (Σx is capped at the stand-in's 96): infeasible
    kw = {"bandwidth_bps": 100 * M, "n_params": N_PARAMS, "convergence": CONV, "latency_s": 0.08}
    imposed = search(FITS, config=_cfg(), **kw)  # type: ignore[arg-type]
    priced = search(FITS, config=_cfg(eq6_with_latency="price"), **kw)  # type: ignore[arg-type]
    assert not imposed.feasible
    assert imposed.batches == priced.batches
    assert imposed.r == pytest.approx(priced.r)


def test_serial_payloads_multiply_the_bytes_time_and_tighten_the_bound() -> None:
    one = evaluate_plan(
        FITS, (32, 32, 32), 0.99, bandwidth_bps=100 * M, n_params=N_PARAMS, convergence=CONV,
        config=_cfg(), latency_s=0.02,
    )  # fmt: skip
    four = evaluate_plan(
        FITS, (32, 32, 32), 0.99, bandwidth_bps=100 * M, n_params=N_PARAMS, convergence=CONV,
        config=_cfg(exchange_serial_payloads=4.0), latency_s=0.02,
    )  # fmt: skip
    payload_s = 0.01 * N_PARAMS * 4.0 * 8 / (100 * M)
    assert one.exchange_time_s == pytest.approx(0.02 + payload_s)
    assert four.exchange_time_s == pytest.approx(0.02 + 4 * payload_s)
    # Eq. 6 with h: 1 − r ≥ h·m-fraction ⇒ the bound's density is a quarter
    assert 1.0 - four.r_lower_bound == pytest.approx((1.0 - one.r_lower_bound) / 4)


def test_without_latency_eq6_is_a_constraint_in_either_mode() -> None:
    conv = PowerLawConvergence()
    plans = [
        search(
            FITS,
            bandwidth_bps=1e9,
            n_params=2_000_000,
            convergence=conv,
            config=SchedulerConfig(eq6_with_latency=mode),
        )
        for mode in ("impose", "price")
    ]
    assert plans[0] == plans[1]  # the paper's model: "price" only concerns L > 0
    assert plans[0].feasible


@pytest.mark.parametrize(
    ("topology", "sites", "h"),
    [("tree", 3, 4.0), ("star", 4, 5.0), ("ring", 3, 3.0), ("allpairs", 4, 1.25), ("tree", 1, 1.0)],
)
def test_serial_payloads_per_topology(topology: str, sites: int, h: float) -> None:
    assert serial_payloads(topology, sites) == pytest.approx(h)


def test_serial_payloads_rejects_unknown_topologies_and_empty_jobs() -> None:
    with pytest.raises(ConfigError):
        serial_payloads("mesh", 3)
    with pytest.raises(ConfigError):
        serial_payloads("tree", 0)


@pytest.mark.parametrize(
    ("key", "value"), [("eq6_with_latency", "sometimes"), ("exchange_serial_payloads", 0.5)]
)
def test_config_rejects_bad_eq6_keys(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as e:
        SchedulerConfig(**{key: value})  # type: ignore[arg-type]
    assert e.value.key == key


def test_policy_measures_the_search_latency_net_of_every_serial_payload() -> None:
    h = 4.0
    cfg = SchedulerConfig(
        bytes_per_element=4.0, latency_window=8, warmup_iterations=0, exchange_serial_payloads=h
    )
    n_params = 1_000_000
    pol = SchedulerPolicy(cfg, CONV, n_params=n_params, ranks=[0, 1], initial_density=0.01)
    payload_s = 0.01 * n_params * 4.0 * 8 / cfg.bw_initial_bps  # 3.2 ms per payload at the prior
    now, it = 0.0, 0
    for _tick in range(6):
        for _ in range(3):  # 20 ms of compute paced by a 100 ms exchange (staleness 1: wall = exchange)
            now += 0.1
            for r in (0, 1):
                pol.observe_rank(r, iteration=it, batch_size=16, compute_s=0.02, iteration_s=0.1, now=now)
            it += 1
        pol.decide(now)
    assert pol.latency.latency_s == pytest.approx(0.1 - payload_s, rel=1e-6)  # the estimator's: one payload
    assert pol.search_latency.latency_s == pytest.approx(0.1 - h * payload_s, rel=1e-6)
