"""Four real gateway daemons on unix sockets, driven by fake trainers speaking the real protocol: 200
iterations × 10 layers in each topology, every aggregate checked exactly against a NumPy sum of the pushes
and identical at every site.

The daemons run on a uvloop event loop of the test's own (``asyncio.Runner(loop_factory=...)``), as they
do in production where ``wanrt gateway`` installs uvloop; nothing global is changed."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import uvloop

from gateways.rounds.config import RoundConfig
from gateways.rounds.topology import PlanSpec
from tools.harness.daemon_cluster import dense_sum, running, short_dir, site_configs, trainers_for

SITES = "abcd"
ITERATIONS = 200
LAYERS = 10


@pytest.fixture(autouse=True)
def _numpy_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    # tiny payloads: the NumPy codec path is cheaper than the fused one's per-call dispatch
    monkeypatch.setenv("WANRT_KERNELS", "numpy")


@pytest.mark.parametrize("kind", ["star", "tree", "ring", "parent_child"])
@pytest.mark.timeout(240)
def test_four_gateways_sum_exactly_in_every_topology(kind: str) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_exchange(kind))


async def _exchange(kind: str) -> None:
    # deadlines far beyond any scheduling hiccup: every round waits for every site, so each aggregate
    # holds exactly the four pushes of its own iteration
    rounds = RoundConfig(topology=kind, round_deadline_s=60.0, t_w_s=60.0, suspect_after_s=60.0)  # type: ignore[arg-type]
    with short_dir() as d:
        async with running(site_configs(d, SITES, rounds=rounds)) as cluster:
            if kind == "parent_child":  # d is a straggler attached to a ring member (STAR §IV-B)
                for daemon in cluster.daemons.values():
                    await daemon.wait_joined()
                    daemon.set_plan(PlanSpec.make("parent_child", stragglers=["d"]))
            trainers = trainers_for(cluster, layers=LAYERS, iterations=ITERATIONS)
            for t in trainers.values():
                await t.connect()
            async with asyncio.timeout(200):
                await asyncio.gather(*(t.run() for t in trainers.values()))
                for t in trainers.values():
                    await t.wait_all(ITERATIONS)
                    # a root acks a push once a peer has the result: just after the aggregate, not with it
                    await t.wait(lambda t=t: not t.unacked)  # type: ignore[misc]
            for t in trainers.values():
                await t.close()
            await cluster.stop_all()

        reference = trainers["a"].aggregates
        assert len(reference) == ITERATIONS * LAYERS
        for (it, layer), agg in reference.items():
            assert agg.sites == tuple(SITES)
            expect = dense_sum((t.pushed[(it, layer)] for t in trainers.values()), layer)
            np.testing.assert_array_equal(agg.payload.to_dense(), expect, err_msg=f"{(it, layer)}")
        for s, t in trainers.items():  # identical, bit for bit, at every site
            assert t.aggregates.keys() == reference.keys()
            for key, agg in t.aggregates.items():
                ref = reference[key]
                assert agg.sites == ref.sites
                assert np.array_equal(agg.payload.indices, ref.payload.indices)
                assert agg.payload.values_f32().tobytes() == ref.payload.values_f32().tobytes()
            assert not t.unacked, f"{s}: pushes never acknowledged as counted"
            assert t.duplicates == 0
        for s in SITES:
            delivered = cluster.delivered(s)
            assert len(delivered) == ITERATIONS * LAYERS
            assert all(dv.sites == tuple((x, it) for x in SITES) for (it, _), dv in delivered.items())
            st = cluster.stats[s]
            assert st["rounds_completed"] == ITERATIONS * LAYERS
            assert st["late_contributions"] == 0 and st["peers_lost"] == 0
            assert st["engine"].get("carried", 0) == 0
