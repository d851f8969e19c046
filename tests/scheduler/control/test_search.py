"""Eq. 1–6 search: matches a brute force on small cases, respects Eq. 6, behaves as the paper describes."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest

from scheduler.control.config import SchedulerConfig
from scheduler.control.convergence import PowerLawConvergence
from scheduler.control.objective import (
    coefficient_of_variation,
    eq6_r_lower_bound,
    global_speed,
    iteration_times,
    tta_per_sample,
)
from scheduler.control.search import allocate, evaluate_plan, search
from scheduler.control.throughput import ThroughputFit
from wanrt.errors import ConfigError

VIT = 88_000_000  # ViT-B/16 parameters (StellaTrain §5)
RTX4090, RTX2080TI = ThroughputFit(28, 300, True, 1), ThroughputFit(20, 99, True, 1)  # Table 2, ViT-B/16


@dataclass(frozen=True)
class Bowl:
    """A non-monotone ḡ: best compression in the middle of the range, best batch near 24."""

    total_batch_range: tuple[float, float] = (2.0, 64.0)
    staleness_penalty: float | None = None

    def penalty(self, r: npt.ArrayLike, total_batch: npt.ArrayLike) -> npt.NDArray[np.float64]:
        u = -np.log10(1 - np.asarray(r, dtype=np.float64))
        x = np.log2(np.asarray(total_batch, dtype=np.float64))
        return np.asarray(0.3 * (u - 1.5) ** 2 + 0.2 * (x - np.log2(24)) ** 2, dtype=np.float64)


def brute_force(fits, cfg, bw, n_params, conv):  # type: ignore[no-untyped-def]
    """Every integer allocation × a dense r grid plus each allocation's Eq. 6 bound; feasible only."""
    a = np.array([f.alpha for f in fits])
    b = np.array([f.beta for f in fits])
    rng = range(cfg.min_batch, cfg.max_batch + 1)
    xs = np.array(
        [
            p
            for p in itertools.product(rng, repeat=len(fits))
            if cfg.min_total_batch <= sum(p) <= cfg.max_total_batch
        ],
        dtype=np.float64,
    )
    t = iteration_times(a, b, xs)
    t_bind = t.min(axis=1) if cfg.eq6_iteration_time == "each_rank" else t.max(axis=1)
    lb = eq6_r_lower_bound(bw / 8, n_params * cfg.bytes_per_element, t_bind)
    grid = 1 - 10 ** -np.linspace(-np.log10(1 - cfg.r_min), -np.log10(1 - cfg.r_max), 600)
    rr = np.concatenate(
        [np.clip(lb, cfg.r_min, cfg.r_max)[:, None], np.broadcast_to(grid, (len(xs), 600))], 1
    )
    feasible = (rr >= lb[:, None] - 1e-12) & (lb[:, None] <= cfg.r_max)
    g = conv.penalty(rr, np.broadcast_to(xs.sum(axis=1)[:, None], rr.shape))
    obj = (
        tta_per_sample(g, global_speed(xs, t)[:, None]) * b.sum()
        + cfg.tta_lambda * coefficient_of_variation(t)[:, None]
    )
    obj = np.where(feasible, obj, np.inf)
    k, j = np.unravel_index(np.argmin(obj), obj.shape)
    return float(obj[k, j]), xs[k], float(rr[k, j])


CASES = [
    # (fits, bandwidth, params, convergence, config overrides)
    (
        [ThroughputFit(6, 60, True, 1), ThroughputFit(4, 20, True, 1)],
        20e6,
        2_000_000,
        PowerLawConvergence(batch_ref=16, min_total_batch=2, max_total_batch=48),
        {},
    ),
    (
        [ThroughputFit(6, 60, True, 1), ThroughputFit(4, 20, True, 1)],
        20e6,
        2_000_000,
        PowerLawConvergence(batch_ref=16, density_exponent=1.0, min_total_batch=2, max_total_batch=48),
        {"eq6_iteration_time": "slowest_rank"},
    ),
    ([ThroughputFit(8, 50, True, 1), ThroughputFit(8, 50, True, 1)], 5e6, 1_000_000, Bowl(), {}),
    (
        [ThroughputFit(3, 90, True, 1), ThroughputFit(10, 40, True, 1)],
        200e6,
        500_000,
        PowerLawConvergence(batch_coef=0.5, batch_ref=8, min_total_batch=2, max_total_batch=48),
        {"tta_lambda": 2.0},
    ),
    (
        [ThroughputFit(5, 30, True, 1), ThroughputFit(5, 40, True, 1), ThroughputFit(9, 80, True, 1)],
        10e6,
        3_000_000,
        PowerLawConvergence(batch_ref=16, min_total_batch=3, max_total_batch=36),
        {"max_batch": 12},
    ),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_search_matches_brute_force_on_small_cases(case: int) -> None:
    fits, bw, n_params, conv, over = CASES[case]
    cfg = dataclasses.replace(SchedulerConfig(max_batch=24, min_total_batch=2, max_total_batch=48), **over)
    plan = search(fits, bandwidth_bps=bw, n_params=n_params, convergence=conv, config=cfg)
    best, _, _ = brute_force(fits, cfg, bw, n_params, conv)
    assert plan.feasible
    assert plan.objective <= best * 1.002, (plan, best)
    # the plan's own numbers are the model's numbers for that configuration
    again = evaluate_plan(
        fits, plan.batches, plan.r, bandwidth_bps=bw, n_params=n_params, convergence=conv, config=cfg
    )
    assert again.objective == pytest.approx(plan.objective)


@pytest.mark.parametrize("eq6", ["each_rank", "slowest_rank"])
@pytest.mark.parametrize("bw", [30e6, 100e6, 1e9, 10e9])
def test_plan_respects_eq6_and_limits(eq6: str, bw: float) -> None:
    cfg = SchedulerConfig(eq6_iteration_time=eq6)  # type: ignore[arg-type]
    fits = [RTX4090, RTX4090, RTX2080TI, RTX2080TI]
    plan = search(fits, bandwidth_bps=bw, n_params=VIT, convergence=PowerLawConvergence(), config=cfg)
    t = iteration_times([f.alpha for f in fits], [f.beta for f in fits], np.array(plan.batches, dtype=float))
    payload_s = (1 - plan.r) * VIT * cfg.bytes_per_element / (bw / 8)
    binding = t.min() if eq6 == "each_rank" else t.max()
    assert plan.feasible
    assert payload_s <= binding * (1 + 1e-9)  # Eq. 6: the exchange fits in the compute time
    assert cfg.r_min <= plan.r <= cfg.r_max
    assert all(cfg.min_batch <= x <= cfg.max_batch for x in plan.batches)
    assert cfg.min_total_batch <= plan.total_batch <= cfg.max_total_batch
    # faster GPUs get larger batches (§4.2: proportional to computational speed)
    assert plan.batches[0] > plan.batches[2]


def test_compression_rises_as_bandwidth_falls() -> None:
    fits = [RTX4090, RTX4090, RTX2080TI, RTX2080TI]
    rs = [
        search(
            fits, bandwidth_bps=bw, n_params=VIT, convergence=PowerLawConvergence(), config=SchedulerConfig()
        ).r
        for bw in (2e9, 1e9, 500e6, 200e6, 100e6, 50e6)
    ]
    assert rs == sorted(rs)


def test_too_slow_a_link_gives_an_infeasible_plan_at_maximum_compression() -> None:
    cfg = SchedulerConfig()
    plan = search([RTX2080TI], bandwidth_bps=1e5, n_params=VIT, convergence=PowerLawConvergence(), config=cfg)
    assert not plan.feasible and plan.r == pytest.approx(cfg.r_max)
    assert plan.exchange_time_s > plan.compute_time_s
    assert plan.samples_per_s == pytest.approx(plan.total_batch / plan.exchange_time_s)


def test_search_does_not_extrapolate_the_profiles_batch_range() -> None:
    conv = PowerLawConvergence(batch_coef=0.0, density_coef=0.1, min_total_batch=16, max_total_batch=64)
    plan = search(
        [RTX4090, RTX4090], bandwidth_bps=100e6, n_params=VIT, convergence=conv, config=SchedulerConfig()
    )
    assert 16 <= plan.total_batch <= 64


@pytest.mark.parametrize("total", [2, 7, 40, 97, 200])
def test_allocation_sums_and_is_proportional(total: int) -> None:
    beta = [300.0, 300.0, 99.0, 99.0, 150.0]
    x = allocate([total], beta, 1, 64)[0] if total >= 5 else None
    if x is None:
        with pytest.raises(ConfigError):
            allocate([total], beta, 1, 64)
        return
    assert int(x.sum()) == total and x.min() >= 1 and x.max() <= 64
    if total <= 64:  # nobody clipped at the top: within one sample of β-proportional
        ideal = np.array(beta) * total / sum(beta)
        assert np.all(np.abs(x - ideal) <= 1.0 + 1e-9) or x.min() == 1


def test_objective_terms() -> None:
    t = iteration_times([28, 20], [300, 99], np.array([56.0, 10.0]))
    assert t.tolist() == pytest.approx([56 / 300, 20 / 99])  # saturated, and at the floor α/β
    assert float(global_speed([56.0, 10.0], t)) == pytest.approx(66 / (20 / 99))
    assert float(coefficient_of_variation(np.array([1.0, 3.0]))) == pytest.approx(0.5)
    assert float(coefficient_of_variation(np.array([2.0, 2.0]))) == 0.0
    assert float(eq6_r_lower_bound(12.5e6, 704e6, 0.172)) == pytest.approx(1 - 12.5 * 0.172 / 704)


def test_bad_inputs_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        search(
            [], bandwidth_bps=1e6, n_params=10, convergence=PowerLawConvergence(), config=SchedulerConfig()
        )
    with pytest.raises(ConfigError):
        search(
            [RTX4090],
            bandwidth_bps=float("nan"),
            n_params=10,
            convergence=PowerLawConvergence(),
            config=SchedulerConfig(),
        )
    with pytest.raises(ConfigError):
        search(
            [RTX4090] * 3,
            bandwidth_bps=1e6,
            n_params=10,
            convergence=PowerLawConvergence(),
            config=SchedulerConfig(max_batch=1, min_total_batch=4),
        )
