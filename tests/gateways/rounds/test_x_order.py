"""STAR §IV-B static x-order as a plan setting (``PlanSpec.x_order``, a scheduler decision's ``x_order``):
a root finishes a round once x sites contributed instead of waiting for a persistent straggler, and the
straggler's contributions reach a later round as late contributions — none lost, none counted twice."""

from __future__ import annotations

import pytest

from gateways.node.plan_values import plan_spec
from gateways.rounds.config import RoundConfig
from gateways.rounds.topology import PlanSpec
from tests.gateways.harness import Net, Trainers, assert_accounted
from wanrt.errors import ConfigError
from wanrt.protocol.job_settings import PlanSettings

SITES = "abcd"
SLOW = 0.5  # site d's compute per iteration; the others take 0.05 s
ITERATIONS = 20


def _run(x_order: int | None) -> tuple[Net, float]:
    cfg = RoundConfig(round_deadline_s=30.0, suspect_after_s=60.0)  # only x-order lets a root go on early
    net = Net(SITES, PlanSpec.make("star", root="a", x_order=x_order), cfg)
    compute = {"a": 0.05, "b": 0.05, "c": 0.05, "d": SLOW}
    tr = Trainers(net, iterations=ITERATIONS, layers=2, compute=compute, staleness=1)
    tr.start()
    net.run()
    assert not net.errors
    last = [(ITERATIONS - 1, layer) for layer in range(2)]
    # when the fast sites had every result of the last iteration (d's own late rounds may run on after)
    return net, max(net.delivered_at[s][k] for s in "abc" for k in last)


def test_the_root_goes_on_with_the_first_x_sites_and_loses_nothing() -> None:
    bsp, t_bsp = _run(None)
    xo, t_xo = _run(3)
    assert t_bsp >= ITERATIONS * SLOW * 0.9  # waiting for d every round
    late = [c for c in xo.closed["a"] if "d" in c.late]
    assert late  # rounds closed without waiting for d ...
    assert t_xo < 0.6 * t_bsp  # ... so the fast sites are not held at d's pace
    assert_accounted(xo)  # and d's pushes are in later results: every push counted exactly once
    assert_accounted(bsp)


def test_x_order_is_a_validated_plan_value() -> None:
    rounds = RoundConfig()
    spec = plan_spec(PlanSettings(x_order=3), rounds, "a", SITES)
    assert spec is not None and spec.x_order == 3
    assert plan_spec(PlanSettings(x_order=0), rounds, "a", SITES).x_order is None  # type: ignore[union-attr]
    with pytest.raises(ConfigError) as err:
        plan_spec(PlanSettings(x_order=-1), rounds, "a", SITES)
    assert err.value.fields["key"] == "x_order"
