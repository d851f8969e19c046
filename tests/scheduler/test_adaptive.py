"""StellaTrain's controller behind the scheduler node: sites as ranks, per-site batch sizes."""

from __future__ import annotations

import pytest

from scheduler.adaptive import AdaptivePolicy
from scheduler.control.config import SchedulerConfig
from scheduler.control.convergence import PowerLawConvergence
from wanrt.protocol.scheduler.messages import site_values


def _report(
    site: str, it: int, now: float, *, batch: int, compute: float, wall: float, sent: float
) -> dict[str, float]:
    return {
        "frontier": float(it),
        "cfg.density": 0.01,
        "cfg.staleness": 1.0,
        "trainer.iteration": float(it),
        "trainer.params": 1e6,
        "trainer.world_size": 2.0,
        "trainer.batch_size": float(batch),
        "trainer.compute_s": compute,
        "trainer.iteration_s": wall,
        f"link.{'b' if site == 'a' else 'a'}.bytes_sent": sent,
    }


def test_sites_are_ranks_and_batches_come_back_per_site() -> None:
    policy = AdaptivePolicy(("a", "b"), SchedulerConfig(), PowerLawConvergence())
    assert policy.decide(0.0) is None  # nothing reported yet
    now = 0.0
    for it in range(12):
        now += 0.2
        for site, speed in (("a", 1.0), ("b", 2.0)):  # b computes twice as fast
            batch = 8 + it % 3 * 8  # varied batches so the throughput model has points to fit
            policy.observe(
                site,
                _report(site, it, now, batch=batch, compute=0.001 * batch / speed, wall=0.2, sent=1e5 * it),
                now,
            )
    values = policy.decide(now)
    assert values is not None
    assert 0 < values["density"] <= 1 and values["staleness"] in (0, 1)
    a, b = values["batch_size@a"], values["batch_size@b"]
    assert a >= 1 and b >= 1 and b >= a  # the faster site gets at least as large a batch (Eq. 3)
    wa, wb = values["batch_weight@a"], values["batch_weight@b"]
    assert wa + wb == pytest.approx(2.0) and wa / wb == pytest.approx(a / b)  # samples, not sites
    assert site_values(values, "a") == {
        "density": values["density"],
        "staleness": values["staleness"],
        "batch_size": a,
        "batch_weight": wa,
    }
    policy.committed(values, 40)
    assert policy._pending is None  # confirmed to the controller with its effective iteration


def test_link_counters_reach_the_controller_and_goodput_needs_a_long_window() -> None:
    policy = AdaptivePolicy(("a", "b"), SchedulerConfig(), PowerLawConvergence())
    for k in range(12):  # 0.25 s reports; each site's link to the other carries 1.25 MB per 0.1 s busy
        now = 0.25 * k
        for site in ("a", "b"):
            peer = "b" if site == "a" else "a"
            rep = _report(site, k, now, batch=16, compute=0.1, wall=0.2, sent=4e6 * k)  # bursty counter
            rep[f"link.{peer}.busy_s"] = 0.1 * k
            rep[f"link.{peer}.busy_bytes"] = 1.25e6 * k
            policy.observe(site, rep, now)
    assert policy.policy is not None
    assert policy.policy.links.rates() == {"a>b": pytest.approx(100e6), "b>a": pytest.approx(100e6)}
    assert policy.policy.links.floor_bps(now) == pytest.approx(100e6)
    # goodput from bytes_sent: one reading per 2 s window, not one per report
    assert policy._goodput["a"] == pytest.approx(4e6 * 8 * 8 / 2.0)


def test_before_any_decision_the_policy_reads_what_the_trainers_report_running() -> None:
    policy = AdaptivePolicy(("a", "b"), SchedulerConfig(), PowerLawConvergence())
    report = _report("a", 0, 0.1, batch=16, compute=0.01, wall=0.05, sent=0.0)
    del report["cfg.density"], report["cfg.staleness"]  # no decision committed yet
    report["trainer.density"], report["trainer.staleness"] = 0.02, 1.0
    policy.observe("a", report, 0.1)
    assert policy.policy is not None
    assert policy.policy._effect_at(0) is not None
    assert policy.policy._effect_at(0).density == pytest.approx(0.02)  # type: ignore[union-attr]


def test_an_idle_job_reports_no_goodput_and_keeps_its_link() -> None:
    """Issue 21: while the job was idle the bytes counters stood still, the goodput of the window was 0,
    and the estimator's refusal (RemoteProtocolError) aborted each gateway's link every ~5 s."""
    policy = AdaptivePolicy(("a", "b"), SchedulerConfig(), PowerLawConvergence())
    now = 0.0
    for _ in range(40):  # 40 s with the same counters: nothing sent
        now += 1.0
        for site in "ab":
            policy.observe(site, _report(site, 3, now, batch=8, compute=0.01, wall=0.2, sent=5e5), now)
    assert policy._goodput == {}
