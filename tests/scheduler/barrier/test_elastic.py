"""ElasticBarrier: push times in, the next barrier out (seed 003 §4)."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.barrier import METHODS, BarrierConfig, ElasticBarrier, predict_ends, zipline
from wanrt.config import from_mapping
from wanrt.errors import ConfigError, LocalProtocolError


def test_predict_ends_is_last_plus_multiples_of_the_interval() -> None:
    ends = predict_ends([10.0, 20.0], [3.0, 5.0], 3)
    np.testing.assert_array_equal(ends, [[13.0, 16.0, 19.0], [25.0, 30.0, 35.0]])


def test_no_plan_during_the_monitoring_phase() -> None:
    barrier = ElasticBarrier(["a", "b"])
    assert barrier.plan() is None
    barrier.observe_push("a", 0.0)
    barrier.observe_push("a", 1.0)
    barrier.observe_push("b", 0.0)
    assert not barrier.ready()
    assert barrier.plan() is None


@pytest.mark.parametrize("method", sorted(METHODS))
def test_plan_matches_zipline_on_the_predicted_ends(method: str) -> None:
    barrier = ElasticBarrier(["a", "b", "c"], BarrierConfig(lookahead=6, method=method))  # type: ignore[arg-type]
    pushes = {"a": (0.0, 1.0), "b": (0.2, 1.7), "c": (0.5, 2.5)}
    for w, (p0, p1) in pushes.items():
        barrier.observe_push(w, p0)
        barrier.observe_push(w, p1)
    plan = barrier.plan()
    assert plan is not None
    ends = predict_ends([1.0, 1.7, 2.5], [1.0, 1.5, 2.0], 6)
    if method != "grid_scan":  # GridScan is a heuristic; all others are exact
        ref = zipline(ends)
        assert (plan.wait, plan.t_sync) == (ref.wait, ref.t_sync)
    assert set(plan.iterations) == {"a", "b", "c"}
    assert all(1 <= k <= 6 for k in plan.iterations.values())


def test_only_the_two_latest_pushes_matter() -> None:
    barrier = ElasticBarrier(["a", "b"], BarrierConfig(lookahead=4))
    for t in (0.0, 5.0, 6.0):  # the interval is now 1.0, not 5.0
        barrier.observe_push("a", t)
    for t in (0.0, 2.0):
        barrier.observe_push("b", t)
    plan = barrier.plan()
    assert plan is not None
    ref = zipline(predict_ends([6.0, 2.0], [1.0, 2.0], 4))
    assert plan.t_sync == ref.t_sync


def test_bad_pushes_are_rejected() -> None:
    barrier = ElasticBarrier(["a"])
    with pytest.raises(LocalProtocolError):
        barrier.observe_push("x", 1.0)
    barrier.observe_push("a", 2.0)
    with pytest.raises(LocalProtocolError):
        barrier.observe_push("a", 1.0)
    with pytest.raises(LocalProtocolError):
        barrier.observe_push("a", float("nan"))


def test_config_from_toml_table() -> None:
    cfg = from_mapping(
        BarrierConfig, {"lookahead": 150, "method": "zipline_opt_bs"}, section="scheduler.barrier"
    )
    assert cfg.lookahead == 150
    with pytest.raises(ConfigError) as exc:
        from_mapping(BarrierConfig, {"lookahead": 0}, section="scheduler.barrier")
    assert exc.value.fields["key"] == "scheduler.barrier.lookahead"
    with pytest.raises(ConfigError):
        from_mapping(BarrierConfig, {"method": "magic"}, section="scheduler.barrier")
