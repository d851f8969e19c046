"""Link rates while sending (bytes over busy time) and the floor they put under the bandwidth estimate."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.control.bandwidth import BandwidthEstimator
from scheduler.control.config import SchedulerConfig
from scheduler.control.convergence import PowerLawConvergence
from scheduler.control.link_rate import LinkRates
from scheduler.control.policy import SchedulerPolicy
from sims.policies.toy_sim import run_toy_loop
from wanrt.errors import ConfigError, RemoteProtocolError

M = 1e6
GPUS = [(28.0, 300.0), (20.0, 99.0)]  # Table 2, ViT-B/16: RTX 4090, RTX 2080 Ti
VIT_PARAMS = 88_000_000


def _cfg(**kw: object) -> SchedulerConfig:
    return dataclasses.replace(SchedulerConfig(), **kw)  # type: ignore[arg-type]


def test_rate_is_bytes_over_busy_time_once_the_window_holds_enough_busy_time() -> None:
    lr = LinkRates(_cfg(link_rate_min_busy_s=0.1))
    assert lr.observe("a>b", bytes_sent=0, busy_s=0, now=0) is None  # first report: the window's start
    assert lr.observe("a>b", bytes_sent=1e5, busy_s=0.05, now=1) is None  # 0.05 s busy: too little
    rate = lr.observe("a>b", bytes_sent=1.25e6, busy_s=0.1, now=2)
    assert rate == pytest.approx(100 * M)  # 1.25 MB in 0.1 s of sending, however long the wall time
    assert lr.floor_bps(2) == pytest.approx(100 * M)


def test_floor_is_the_slowest_fresh_link() -> None:
    lr = LinkRates(_cfg(link_rate_min_busy_s=0.1, link_rate_max_age_s=3))
    for link, mbit in (("a>b", 100), ("a>c", 30), ("c>a", 40)):
        lr.observe(link, bytes_sent=0, busy_s=0, now=0)
        lr.observe(link, bytes_sent=mbit * M / 8, busy_s=1.0, now=1)
    assert lr.floor_bps(1) == pytest.approx(30 * M)
    # a link still reported but idle since (no new window) is not the bottleneck: left out
    lr.observe("a>c", bytes_sent=30 * M / 8, busy_s=1.0, now=5)
    for link, mbit in (("a>b", 100), ("c>a", 40)):
        lr.observe(link, bytes_sent=2 * mbit * M / 8, busy_s=2.0, now=5)
    assert lr.floor_bps(5) == pytest.approx(40 * M)


def test_a_gateway_that_stopped_reporting_blocks_the_floor_until_forgotten() -> None:
    lr = LinkRates(_cfg(link_rate_min_busy_s=0.1, link_rate_max_age_s=3))
    for link in ("a>b", "b>a"):
        lr.observe(link, bytes_sent=0, busy_s=0, now=0)
        lr.observe(link, bytes_sent=12.5e6, busy_s=1.0, now=1)
    lr.observe("a>b", bytes_sent=25e6, busy_s=2.0, now=5)
    assert lr.floor_bps(5) is None  # b>a may be the bottleneck now: say nothing
    lr.observe("a>b", bytes_sent=37.5e6, busy_s=3.0, now=14)
    assert lr.floor_bps(14) == pytest.approx(100 * M)  # b>a unheard of for 4 × max age: forgotten


def test_counter_reset_starts_a_new_window_and_bad_counters_are_remote_errors() -> None:
    lr = LinkRates(_cfg(link_rate_min_busy_s=0.1))
    lr.observe("a>b", bytes_sent=1e6, busy_s=1.0, now=0)
    assert lr.observe("a>b", bytes_sent=10.0, busy_s=0.001, now=1) is None  # the gateway restarted
    assert lr.observe("a>b", bytes_sent=10 + 1.25e6, busy_s=0.101, now=2) == pytest.approx(100 * M)
    with pytest.raises(RemoteProtocolError):
        lr.observe("a>b", bytes_sent=float("nan"), busy_s=1.0, now=3)
    with pytest.raises(RemoteProtocolError):
        lr.observe("a>b", bytes_sent=1.0, busy_s=-1.0, now=3)


def test_apply_floor_only_lifts() -> None:
    e = BandwidthEstimator(_cfg(bw_initial_bps=30 * M))
    step = e.apply_floor(80 * M, now=1)
    assert step is not None and step.kind == "raise" and step.clamped_by == "link_rate"
    assert e.estimate_bps == pytest.approx(80 * M)
    assert e.apply_floor(50 * M, now=2) is None
    assert e.estimate_bps == pytest.approx(80 * M)


def test_config_range_checks() -> None:
    with pytest.raises(ConfigError) as ei:
        _cfg(link_rate_floor=1.5)
    assert ei.value.fields["key"] == "link_rate_floor"
    with pytest.raises(ConfigError):
        _cfg(link_rate_min_busy_s=0.0)


def _step_run(link_telemetry: bool) -> list[float]:
    """100 → 30 → 100 Mbit/s, 40 decide ticks each, one iteration per tick, every plan in force 6
    iterations after it was decided, 40 ms of round trip in every exchange (the real daemons' shape)."""
    cfg = _cfg(warmup_iterations=0, search_batch_candidates=24)
    pol = SchedulerPolicy(
        cfg, PowerLawConvergence(), n_params=VIT_PARAMS, ranks=[0, 1], initial_density=0.005
    )

    def rate(k: int) -> float:
        return 30 * M if 40 <= k < 80 else 100 * M

    trace = run_toy_loop(
        pol,
        GPUS,
        rate,
        rounds=120,
        iterations_per_round=1,
        seed=1,
        link_telemetry=link_telemetry,
        latency_s=0.04,
        effect_delay=6,
    )
    return trace.relative_errors()


def test_step_100_30_100_error_by_the_10th_decision_after_each_step() -> None:
    err = _step_run(link_telemetry=True)
    for step in (40, 80):
        assert max(err[step + 10 : step + 40]) <= 0.2, (step, err[step : step + 40])


def test_without_link_rates_the_rise_is_found_late() -> None:
    """The paper's idle rule alone, same run: the rise waits for one plan in force per raise."""
    err = _step_run(link_telemetry=False)
    assert err[80 + 10] > 0.2


def test_a_window_reads_the_larger_of_busy_rate_and_the_fastest_message() -> None:
    """Layers trickling out during backward keep the link 'busy' at the trainer's pace; the largest
    message's own rate is the better lower bound then."""
    lr = LinkRates(_cfg(link_rate_min_busy_s=0.1))
    lr.observe("a>b", bytes_sent=0, busy_s=0, now=0)
    rate = lr.observe("a>b", bytes_sent=1.25e6, busy_s=0.5, now=1, peak_bps=60 * M)
    assert rate == pytest.approx(60 * M)  # the busy time alone says 20 Mbit/s
