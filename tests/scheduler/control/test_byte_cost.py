"""The payload's CPU time per iteration (a + κ·bytes): its fit, and what it does to the search."""

from __future__ import annotations

import pytest

from scheduler.control.byte_cost import ByteCost, ByteCostFit
from scheduler.control.config import SchedulerConfig
from scheduler.control.convergence import PowerLawConvergence
from scheduler.control.policy import SchedulerPolicy
from scheduler.control.search import search
from scheduler.control.throughput import ThroughputFit
from wanrt.errors import RemoteProtocolError

MB = 1e6
N_PARAMS = 10_500_000  # the real-daemon benchmark's MLP: 84 MB dense at 8 bytes per kept element


def test_fit_recovers_the_line_from_two_payloads() -> None:
    bc = ByteCost()
    for _ in range(5):
        bc.observe(1.7 * MB, 0.02 + 0.056e-6 * 1.7 * MB)
        bc.observe(6.1 * MB, 0.02 + 0.056e-6 * 6.1 * MB)
    fit = bc.fit()
    assert fit is not None
    assert fit.per_byte_s == pytest.approx(0.056e-6)
    assert fit.fixed_s == pytest.approx(0.02)


def test_one_payload_gives_the_line_through_the_origin() -> None:
    bc = ByteCost()
    assert bc.fit() is None
    for s in (0.10, 0.12, 0.11):
        bc.observe(2 * MB, s)
    fit = bc.fit()
    assert fit is not None and fit.fixed_s == 0.0
    assert fit.per_byte_s == pytest.approx(0.11 / (2 * MB))


def test_a_falling_line_is_noise_not_a_negative_cost() -> None:
    bc = ByteCost()
    bc.observe(1 * MB, 0.2)
    bc.observe(4 * MB, 0.1)
    fit = bc.fit()
    assert fit is not None and fit.per_byte_s == 0.0


def test_bad_samples_are_remote_errors() -> None:
    with pytest.raises(RemoteProtocolError):
        ByteCost().observe(float("inf"), 0.1)
    with pytest.raises(RemoteProtocolError):
        ByteCost().observe(1.0, -0.1)


def _plan(byte_costs: list[ByteCostFit | None] | None, bw: float = 100e6) -> tuple[float, float]:
    fits = [ThroughputFit(alpha=32.0, beta=400.0, fitted=True, points=10) for _ in range(3)]
    p = search(
        fits,
        bandwidth_bps=bw,
        n_params=N_PARAMS,
        convergence=PowerLawConvergence(),
        config=SchedulerConfig(),
        byte_costs=byte_costs,
    )
    return p.density, p.compute_time_s


def test_without_a_cost_per_byte_the_search_is_the_papers() -> None:
    assert _plan(None) == _plan([ByteCostFit(0.0, 0.0)] * 3)


def test_a_measured_cost_per_byte_lowers_the_density() -> None:
    """56 ms per MB (measured, docs/scheduler.md): denser plans now cost iteration time, so the search
    stops short of filling the link."""
    free, _ = _plan(None)
    costly, t = _plan([ByteCostFit(0.0, 0.056e-6)] * 3)
    assert costly < 0.7 * free
    assert t > 0.056e-6 * costly * N_PARAMS * 8 * 0.99  # the plan's time includes the payload's CPU time


def test_policy_fits_throughput_on_compute_without_the_payload_time() -> None:
    pol = SchedulerPolicy(
        SchedulerConfig(), PowerLawConvergence(), n_params=N_PARAMS, ranks=[0], initial_density=0.02
    )
    # 64 samples in 0.3 s of compute of which 0.1 s is the payload's: Eq. 2 sees 64 / 0.2 s
    pol.observe_rank(0, iteration=0, batch_size=64, compute_s=0.3, iteration_s=0.3, now=1.0, byte_s=0.1)
    fit = pol.fits()[0]
    assert fit is not None and fit.beta == pytest.approx(320.0)
    bc = pol.byte_costs()[0]
    payload = 0.02 * N_PARAMS * 8
    assert bc is not None and bc.seconds(payload) == pytest.approx(0.1)
