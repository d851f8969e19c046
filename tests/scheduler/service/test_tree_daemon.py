"""End to end on real daemons: a ``site_costs`` decision (STAR §IV-D2's latency tree) announced by the
scheduler daemon moves the tree's root mid-job at every gateway from the decision's one effective iteration,
and every site's aggregates stay identical and exact across the switch."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gateways.rounds.config import RoundConfig
from tests.scheduler.service.test_plan_daemon import LAYERS, SITES, _check_identical, _job, _sched_config
from tools.harness.daemon_cluster import dense_sum, short_dir, trainers_for


@pytest.fixture(autouse=True)
def _numpy_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANRT_KERNELS", "numpy")


@pytest.mark.timeout(180)
async def test_announced_site_costs_move_the_root_at_every_gateway_at_one_iteration() -> None:
    iterations = 30
    rounds = RoundConfig(topology="tree", round_deadline_s=60.0, suspect_after_s=60.0)
    with short_dir() as tmp:
        async with _job(tmp, _sched_config(tmp, policy="fixed"), rounds) as (sched, cluster):
            node = sched.node
            await sched.wait_for(lambda: all(g.connected and g.reported for g in node.gateways.values()))
            trainers = trainers_for(cluster, layers=LAYERS, iterations=iterations)
            for t in trainers.values():
                await t.connect()
            runs = [asyncio.create_task(t.run()) for t in trainers.values()]
            async with asyncio.timeout(120):
                # mid-job: a few rounds done under the name-order tree (root a) first
                await trainers["a"].wait(lambda: (2, LAYERS - 1) in trainers["a"].aggregates)
                sched.request({"site_costs": "a:0.9,b:0.4,c:0.1"})  # c is the cheapest: the new root
                await sched.wait_for(lambda: node.current is not None)
                decision = node.current
                assert decision is not None
                await asyncio.gather(*runs)
                for t in trainers.values():
                    await t.wait_all(iterations)
            for t in trainers.values():
                await t.close()
            eff = decision.effective_iteration
            ids = set()
            for d in cluster.daemons.values():
                engine = d.node.engine
                assert engine is not None and d.node.scheduler.decision == decision.id
                before, after = engine.plan_for(eff - 1), engine.plan_for(eff)
                assert before.core == ("a",) and after.core == ("c",)
                assert dict(after.spec.costs) == {"a": 0.9, "b": 0.4, "c": 0.1}
                ids.add(after.plan_id)
            assert len(ids) == 1
            await cluster.stop_all()
    assert 2 < eff < iterations
    assert not any(t.configs for t in trainers.values())  # a plan key, never forwarded to trainers
    _check_identical(trainers, iterations)
    for (it, layer), agg in trainers["a"].aggregates.items():
        assert agg.sites == tuple(SITES)
        expect = dense_sum((t.pushed[(it, layer)] for t in trainers.values()), layer)
        np.testing.assert_array_equal(agg.payload.to_dense(), expect, err_msg=f"{(it, layer)}")
