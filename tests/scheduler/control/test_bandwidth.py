"""§4.1 bandwidth estimate: explicit step rule, goodput cross-check, convergence after step changes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from scheduler.control.bandwidth import BandwidthEstimator
from scheduler.control.config import SchedulerConfig
from wanrt.errors import RemoteProtocolError

M = 1e6


def _est(**kw: object) -> BandwidthEstimator:
    return BandwidthEstimator(dataclasses.replace(SchedulerConfig(), **kw))  # type: ignore[arg-type]


def test_high_idle_lowers_to_the_measured_rate_in_one_step() -> None:
    e = _est(bw_initial_bps=100 * M)
    # a payload sized for 100 Mbit/s over a 30 Mbit/s link: 1.25 MB, 0.1 s compute -> 0.333 s iterations
    step = e.update(
        idle=1 - 0.1 / 0.3333,
        iteration_s=0.3333,
        compute_s=0.1,
        bytes_per_iteration=1.25e6,
        overlapped=True,
        now=1.0,
    )
    assert step.kind == "lower"
    assert step.evidence_bps == pytest.approx(30 * M, rel=1e-3)
    assert e.estimate_bps == pytest.approx(30 * M / (1 - 0.025), rel=1e-3)


def test_sequential_exchange_counts_only_the_wait_as_communication() -> None:
    e = _est(bw_initial_bps=100 * M)
    # staleness 0: 0.1 s compute then 0.2 s exchange of 0.75 MB -> 30 Mbit/s
    e.update(idle=2 / 3, iteration_s=0.3, compute_s=0.1, bytes_per_iteration=0.75e6, overlapped=False, now=1)
    assert e.estimate_bps == pytest.approx(30 * M / 0.975, rel=1e-3)


def test_lowering_is_bounded_per_decision() -> None:
    e = _est(bw_initial_bps=100 * M, bw_lower_max=0.5)
    e.update(idle=0.99, iteration_s=10.0, compute_s=0.1, bytes_per_iteration=1e3, overlapped=True, now=1)
    assert e.estimate_bps == pytest.approx(50 * M)


def test_low_idle_raises_with_growing_steps_then_holds_after_a_lowering() -> None:
    e = _est(
        bw_initial_bps=10 * M, bw_raise_initial=0.1, bw_raise_growth=2.0, bw_raise_max=1.0, bw_raise_hold=2
    )

    def hidden() -> str:  # payload sized to the estimate, comfortably hidden
        b = e.estimate_bps / 8 * 0.1
        return e.update(
            idle=0.0, iteration_s=0.1, compute_s=0.1, bytes_per_iteration=b, overlapped=True, now=1
        ).kind

    seen = []
    for _ in range(6):
        hidden()
        seen.append(e.estimate_bps / M)
    assert seen == pytest.approx([11, 13.2, 18.48, 33.264, 66.528, 133.056])
    e.update(
        idle=0.5,
        iteration_s=0.2,
        compute_s=0.1,
        bytes_per_iteration=e.estimate_bps / 8 * 0.1,
        overlapped=True,
        now=2,
    )
    after = e.estimate_bps
    assert [hidden(), hidden(), hidden()] == ["hold", "hold", "raise"]
    assert e.estimate_bps == pytest.approx(after * 1.1)


def test_a_small_payload_is_no_evidence_for_raising() -> None:
    e = _est(bw_initial_bps=100 * M, bw_raise_min_utilisation=0.5)
    # 10 Mbit/s worth of payload hid behind compute: says nothing about 100 Mbit/s
    step = e.update(
        idle=0.0, iteration_s=0.1, compute_s=0.1, bytes_per_iteration=10 * M / 8 * 0.1, overlapped=True, now=1
    )
    assert step.kind == "hold" and e.estimate_bps == 100 * M


def test_goodput_floor_and_ceiling() -> None:
    e = _est(bw_initial_bps=10 * M, goodput_floor=0.8, goodput_ceiling=1.5)
    e.observe_goodput(50 * M, now=0.0)
    # idle low: the estimate cannot sit below 80 % of what the gateways demonstrably carried
    step = e.update(
        idle=0.0, iteration_s=0.1, compute_s=0.1, bytes_per_iteration=None, overlapped=True, now=1
    )
    assert step.clamped_by == "goodput_floor" and e.estimate_bps == pytest.approx(40 * M)
    # idle high with a much higher estimate: the saturated link's goodput caps it
    e2 = _est(bw_initial_bps=400 * M, goodput_ceiling=1.5, bw_lower_max=0.5)
    e2.observe_goodput(50 * M, now=0.0)
    step = e2.update(
        idle=0.2, iteration_s=0.1, compute_s=0.08, bytes_per_iteration=None, overlapped=True, now=1
    )
    assert step.clamped_by == "goodput_ceiling" and e2.estimate_bps == pytest.approx(75 * M)
    # stale goodput is ignored
    e3 = _est(bw_initial_bps=10 * M, goodput_max_age_s=5.0)
    e3.observe_goodput(50 * M, now=0.0)
    e3.update(idle=0.0, iteration_s=0.1, compute_s=0.1, bytes_per_iteration=None, overlapped=True, now=10)
    assert e3.estimate_bps == pytest.approx(11 * M)


def test_estimate_stays_within_configured_bounds() -> None:
    e = _est(bw_initial_bps=90e9, bw_max_bps=100e9, bw_raise_initial=0.5, bw_raise_max=0.5)
    e.update(idle=0.0, iteration_s=1, compute_s=1, bytes_per_iteration=None, overlapped=True, now=0)
    assert e.estimate_bps == 100e9


@pytest.mark.parametrize(
    "bad", [dict(idle=float("nan")), dict(iteration_s=0.0), dict(bytes_per_iteration=-1.0)]
)
def test_bad_telemetry_is_a_remote_error(bad: dict[str, float]) -> None:
    kw: dict[str, object] = dict(
        idle=0.1, iteration_s=1.0, compute_s=0.5, bytes_per_iteration=10.0, overlapped=True, now=0.0
    )
    kw.update(bad)
    with pytest.raises(RemoteProtocolError):
        BandwidthEstimator().update(**kw)  # type: ignore[arg-type]
    with pytest.raises(RemoteProtocolError):
        BandwidthEstimator().observe_goodput(0.0, now=0.0)


@pytest.mark.parametrize("goodput", [False, True])
def test_converges_after_100_30_100_steps_in_the_simple_iteration_model(goodput: bool) -> None:
    """iteration = max(compute, bytes/rate), idle = 1 − compute/iteration; payload sized to the estimate."""
    e = BandwidthEstimator(SchedulerConfig(bw_initial_bps=100 * M))
    compute = 0.3
    true = [100 * M] * 30 + [30 * M] * 30 + [100 * M] * 30
    errors = []
    for k, rate in enumerate(true):
        errors.append(abs(e.estimate_bps - rate) / rate)
        payload = e.estimate_bps / 8 * compute  # Eq. 6 tight at the estimate
        it = max(compute, payload * 8 / rate)
        if goodput:
            e.observe_goodput(rate * 0.97, now=k)
        e.update(
            idle=1 - compute / it,
            iteration_s=it,
            compute_s=compute,
            bytes_per_iteration=payload,
            overlapped=True,
            now=k,
        )
    for step in (30, 60):
        assert max(errors[step + 10 : step + 30]) <= 0.20, errors[step:]


def _drive(exchange: Callable[[float], float], sizes: list[float], rounds: int = 40) -> BandwidthEstimator:
    est = BandwidthEstimator(SchedulerConfig(bw_initial_bps=100e6, bw_fit_window=4))
    for i in range(rounds):
        nbytes = sizes[i % len(sizes)]
        comm = exchange(nbytes)
        compute = 0.02
        wall = max(compute, comm)
        est.update(
            idle=1 - compute / wall,
            iteration_s=wall,
            compute_s=compute,
            bytes_per_iteration=nbytes,
            overlapped=True,
            now=float(i),
        )
    return est


def test_a_latency_bound_exchange_does_not_drag_the_estimate_down() -> None:
    # 50 ms of round trip whatever the payload: more bandwidth would not help, so the estimate holds
    est = _drive(lambda b: 0.05 + 8 * b / 1e9, [20e3, 40e3, 80e3])
    assert est.estimate_bps > 50e6
    paper = BandwidthEstimator(SchedulerConfig(bw_initial_bps=100e6, bw_fit_window=0))
    for i in range(40):  # the paper's rule alone reads the latency as bandwidth and spirals down
        b = [20e3, 40e3, 80e3][i % 3]
        paper.update(
            idle=0.6, iteration_s=0.05, compute_s=0.02, bytes_per_iteration=b, overlapped=True, now=i
        )
    assert paper.estimate_bps < 20e6


def test_a_bandwidth_bound_exchange_is_read_through_its_latency() -> None:
    # 10 ms latency + 30 Mbit/s: the fitted bandwidth is the link's, not bytes / (latency + transfer)
    est = _drive(lambda b: 0.01 + 8 * b / 30e6, [200e3, 400e3, 800e3])
    assert 25e6 <= est.estimate_bps <= 45e6
