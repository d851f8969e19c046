"""StellaTrain's controller behind the scheduler node: sites as ranks, per-site batch sizes."""

from __future__ import annotations

import pytest

from scheduler.adaptive import AdaptivePolicy
from scheduler.control.config import SchedulerConfig
from scheduler.control.convergence import PowerLawConvergence
from scheduler.wire import site_values


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
