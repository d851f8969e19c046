"""End to end on real daemons: a plan decision (STAR §IV-B parent–child: site c detached and attached to a
core member that waits t_w for it) committed by the scheduler daemon makes every gateway's round engine
use that plan from the decision's iteration on — the same plan at every gateway — and rounds keep
completing with identical aggregates everywhere.

Two ways in: a manual ``POST /config``-style request (t_w long enough that every round waits for c, so every
aggregate is checked exactly against the pushes), and the running ``stragglers`` policy with ``modes =
["parent_child"]`` deciding it from the trainers' reported times (Eq. 3 < Eq. 1)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from gateways.rounds.config import RoundConfig
from gateways.service.daemon import GatewayDaemon
from scheduler.daemon_config import SchedulerDaemonConfig
from scheduler.node import Decision
from scheduler.service.daemon import SchedulerDaemon
from scheduler.service.policies import make_policy
from scheduler.stragglers.config import DetectionConfig
from scheduler.stragglers.site_config import SiteStragglerConfig
from tests.scheduler.service.test_straggler_daemon import report_while_training
from tools.harness.daemon_cluster import (
    JOB,
    SECRET,
    TEST_TIMEOUTS,
    Cluster,
    dense_sum,
    running,
    short_dir,
    site_configs,
    trainers_for,
)
from tools.harness.daemon_trainer import FakeTrainer

SITES = "abc"
LAYERS = 3


@pytest.fixture(autouse=True)
def _numpy_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANRT_KERNELS", "numpy")  # tiny payloads: NumPy is cheaper than the fused path


def _sched_config(tmp: Any, **kw: Any) -> SchedulerDaemonConfig:
    return SchedulerDaemonConfig(
        job=JOB,
        sites=tuple(SITES),
        secret=SECRET,
        listen=f"unix://{tmp}/sched.sock",
        reply_timeout_s=5.0,
        announce_margin=6,
        timeouts=TEST_TIMEOUTS,
        **kw,
    )


@contextlib.asynccontextmanager
async def _job(
    tmp: Any, sched_cfg: SchedulerDaemonConfig, rounds: RoundConfig
) -> AsyncIterator[tuple[SchedulerDaemon, Cluster]]:
    sched = SchedulerDaemon(sched_cfg, policy=make_policy(sched_cfg))
    task = asyncio.create_task(sched.run())
    try:
        await sched.wait_for(lambda: sched._listener is not None)
        configs = site_configs(
            tmp, SITES, rounds=rounds, scheduler=f"unix://{tmp}/sched.sock", telemetry_interval_s=0.1
        )
        async with running(configs) as cluster:
            for d in cluster.daemons.values():
                await d.wait_joined()
            yield sched, cluster
    finally:
        sched.request_stop()
        await asyncio.wait_for(task, 20)


def _check_plan(daemons: dict[str, GatewayDaemon], decision: Decision, base: str, t_w: float) -> None:
    """Every gateway runs the base plan before the decision's iteration and the same parent–child plan
    (c attached to a core member that waits t_w) from it on."""
    eff = decision.effective_iteration
    ids = set()
    for d in daemons.values():
        engine = d.node.engine
        assert engine is not None
        assert d.node.scheduler.decision == decision.id
        before, after = engine.plan_for(eff - 1), engine.plan_for(eff)
        assert before.spec.kind == base and not before.waits_tw
        assert after.spec.kind == "parent_child" and after.spec.t_w_s == t_w
        assert after.waits_tw == frozenset({"c"}) and after.parent_of("c") in ("a", "b")
        assert engine.plan_for(eff + 50) == after
        ids.add(after.plan_id)
    assert len(ids) == 1  # plans are pure functions of (spec, members): one plan everywhere


def _check_identical(trainers: dict[str, FakeTrainer], upto: int) -> None:
    common = set.intersection(*(set(t.aggregates) for t in trainers.values()))
    assert {(it, layer) for it in range(upto) for layer in range(LAYERS)} <= common
    ref = trainers["a"].aggregates
    for t in trainers.values():
        for key in common:
            agg = t.aggregates[key]
            assert agg.sites == ref[key].sites
            assert np.array_equal(agg.payload.indices, ref[key].payload.indices)
            assert agg.payload.values_f32().tobytes() == ref[key].payload.values_f32().tobytes()


@pytest.mark.timeout(180)
async def test_a_committed_parent_child_plan_runs_at_every_gateway_from_its_iteration() -> None:
    iterations = 30
    rounds = RoundConfig(topology="ring", round_deadline_s=60.0, t_w_s=0.05, suspect_after_s=60.0)
    with short_dir() as tmp:
        async with _job(tmp, _sched_config(tmp, policy="fixed"), rounds) as (sched, cluster):
            node = sched.node
            await sched.wait_for(lambda: all(g.connected and g.reported for g in node.gateways.values()))
            # t_w far beyond any scheduling hiccup: every round waits for c, so sums are exact
            sched.request({"topology": "parent_child", "stragglers": "c", "t_w_s": 60.0})
            await sched.wait_for(lambda: node.current is not None)
            decision = node.current
            assert decision is not None
            for d in cluster.daemons.values():
                await d.wait_for(lambda d=d: d.node.scheduler.decision == decision.id)  # type: ignore[misc]
            trainers = trainers_for(cluster, layers=LAYERS, iterations=iterations)
            for t in trainers.values():
                await t.connect()
            async with asyncio.timeout(120):
                await asyncio.gather(*(t.run() for t in trainers.values()))
                for t in trainers.values():
                    await t.wait_all(iterations)
            for t in trainers.values():
                await t.close()
            _check_plan(cluster.daemons, decision, "ring", 60.0)
            await cluster.stop_all()
    assert 0 < decision.effective_iteration < iterations
    assert not any(t.configs for t in trainers.values())  # plan settings are not the trainers'
    _check_identical(trainers, iterations)
    for (it, layer), agg in trainers["a"].aggregates.items():
        assert agg.sites == tuple(SITES)
        expect = dense_sum((t.pushed[(it, layer)] for t in trainers.values()), layer)
        np.testing.assert_array_equal(agg.payload.to_dense(), expect, err_msg=f"{(it, layer)}")
    for s in SITES:
        st = cluster.stats[s]
        assert st["rounds_completed"] == iterations * LAYERS and st["peers_lost"] == 0


@pytest.mark.timeout(180)
async def test_the_stragglers_policy_detaches_a_persistent_straggler_site_through_the_daemons() -> None:
    stragglers = SiteStragglerConfig(
        # min_coverage 0: the first reports count for the long window (the windows are unit-tested)
        detection=DetectionConfig(slowness=1.5, short_s=5.0, long_s=10.0, min_coverage=0.0),
        modes=("parent_child",),
        base_topology="ring",
    )
    rounds = RoundConfig(topology="ring", round_deadline_s=20.0, t_w_s=0.05, suspect_after_s=20.0)
    with short_dir() as tmp:
        sched_cfg = _sched_config(tmp, policy="stragglers", stragglers=stragglers, decide_interval_s=0.2)
        async with _job(tmp, sched_cfg, rounds) as (sched, cluster):
            node = sched.node
            trainers = trainers_for(cluster, layers=LAYERS, iterations=100_000)
            for t in trainers.values():
                await t.connect()
            stop = asyncio.Event()
            tasks = [asyncio.create_task(t.run()) for t in trainers.values()]
            tasks += [asyncio.create_task(report_while_training(t, stop)) for t in trainers.values()]
            try:
                async with asyncio.timeout(120):
                    await sched.wait_for(
                        lambda: node.current is not None and node.current.values.get("stragglers") == "c"
                    )
                    decision = node.current
                    assert decision is not None
                    for d in cluster.daemons.values():
                        await d.wait_for(lambda d=d: d.node.scheduler.decision >= decision.id)  # type: ignore[misc]
                    upto = decision.effective_iteration + 10
                    for t in trainers.values():  # rounds keep completing under the new plan
                        await t.wait(lambda t=t: all((upto, x) in t.aggregates for x in range(LAYERS)))  # type: ignore[misc]
            finally:
                stop.set()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                for t in trainers.values():
                    with contextlib.suppress(Exception):
                        await t.close()
            # φ = 0 (the default): Eq. 3 with t_w = 0 beats waiting for c (Eq. 1)
            assert decision.values["topology"] == "parent_child" and decision.values["t_w_s"] == 0.0
            _check_plan(cluster.daemons, decision, "ring", 0.0)
            await cluster.stop_all()
    _check_identical(trainers, upto)
