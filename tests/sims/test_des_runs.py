"""Whole runs: determinism, aggregates equal to a NumPy sum of the pushes, topologies, staleness, the
``links = "plan"`` option, and what a run reports."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gateways.rounds.config import RoundConfig
from sims.des.payloads import make_payload
from sims.des.scenario import ComputeSpec, GatewaySpec, LinkSpec, PayloadSpec, Scenario
from sims.des.world import Simulation, run_scenario

LONG = {"round_deadline_s": 60.0, "t_w_s": 60.0, "suspect_after_s": 60.0}


def small(topology: str = "star", **kw: object) -> Scenario:
    base = Scenario(
        names=("a", "b", "c", "d"),
        iterations=4,
        seed=3,
        payload=PayloadSpec(layers=2, dense_len=1000, density=0.05),
        compute=ComputeSpec(model="normal", mean_s=0.02, sd_s=0.005, backward_fraction=0.5),
        network=LinkSpec(rate_bps=50e6, delay_s=0.005, jitter_s=0.002),
        gateway=GatewaySpec(root="a", rounds=RoundConfig(topology=topology, tree_arity=2, **LONG)),  # type: ignore[arg-type]
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_same_seed_same_results() -> None:
    one, two = run_scenario(small()), run_scenario(small())
    assert one.aggregates == two.aggregates
    assert one.iteration_start == two.iteration_start
    assert one.round_closed == two.round_closed
    assert {k: v.bytes_total for k, v in one.links.items()} == {
        k: v.bytes_total for k, v in two.links.items()
    }
    other = run_scenario(small(seed=4))
    assert other.digests() != one.digests()


def test_aggregates_equal_the_numpy_sum_of_the_pushes() -> None:
    sc = small(iterations=5)
    sim = Simulation(sc, keep_payloads=True)
    result = sim.run()
    assert result.finished and not result.problems
    assert sim.payloads is not None
    assert len(result.aggregates) == 4 * 5 * 2
    for (site, it, layer), agg in sim.payloads.items():
        want = np.zeros(1000, np.float32)
        for idx in range(4):
            make_payload(sc.seed, idx, it, layer, dense_len=1000, density=0.05).add_into(want)
        np.testing.assert_allclose(agg.to_dense(), want, rtol=1e-6, atol=1e-6)
        assert result.aggregates[(site, it, layer)][2] == 4  # every site in every aggregate


@pytest.mark.parametrize("topology", ["star", "tree", "ring"])
def test_topologies_deliver_one_result_everywhere(topology: str) -> None:
    result = run_scenario(small(topology, names=("a", "b", "c", "d", "e", "f", "g")))
    assert result.finished and not result.problems
    digests = result.digests()
    assert len(digests) == 7 * 4 * 2
    for it in range(4):
        for layer in range(2):
            assert len({digests[(s, it, layer)] for s in result.sites}) == 1


def test_plan_links_connect_only_neighbours() -> None:
    sc = small(
        "tree",
        sites=15,
        names=(),
        gateway=GatewaySpec(links="plan", rounds=RoundConfig(tree_arity=2, **LONG)),
    )
    sim = Simulation(sc)
    result = sim.run()
    assert result.finished and not result.problems
    assert len(sim.link_pairs()) == 14  # a tree of 15 has 14 edges
    assert len(result.links) == 28
    # per-link state (counters, rates) exists for the node's links only, not for every site of the job
    for site, node in sim.nodes.items():
        neighbours = set(sim.plan.neighbours(site))
        assert set(node.stats.peers) == neighbours == set(node.allocator.rates())
        assert set(node.status()["peers"]) == neighbours


@pytest.mark.parametrize("links", ["all", "plan"])
def test_unlinked_member_is_lost_only_under_a_full_mesh(links: str) -> None:
    """Only the tree's edges are connected and the run outlasts the heartbeat timeout (15 s): under
    links = "all" site c, which expects a link to d, declares d lost; under "plan" nobody does."""
    sc = small(
        "tree",
        iterations=20,
        max_time_s=40.0,
        compute=ComputeSpec(mean_s=1.0),
        gateway=GatewaySpec(root="a", links=links, rounds=RoundConfig(tree_arity=2, **LONG)),  # type: ignore[arg-type]
    )
    sim = Simulation(sc)
    sim.link_pairs = lambda: [("a", "b"), ("a", "c"), ("b", "d")]  # type: ignore[method-assign]
    result = sim.run()
    live = sim.nodes["c"].engine.live  # type: ignore[union-attr]
    if links == "all":
        assert "d" not in live
    else:
        assert live == {"a", "b", "c", "d"}
        assert result.finished and not result.problems


def test_staleness_one_overlaps_compute_and_communication() -> None:
    slow_net = {"network": LinkSpec(rate_bps=2e6, delay_s=0.05)}
    sync = run_scenario(small(staleness=0, **slow_net))
    stale = run_scenario(small(staleness=1, **slow_net))
    assert stale.finished and sync.finished
    assert stale.iteration_start["b"][-1] < sync.iteration_start["b"][-1]
    assert stale.digests() == sync.digests()  # the same pushes, the same sums


def test_slow_site_sets_the_pace() -> None:
    fast = run_scenario(small())
    slow = run_scenario(small(compute=ComputeSpec(mean_s=0.02, slow={"c": 5.0})))
    assert slow.virtual_s > fast.virtual_s + 3 * 4 * 0.02


def test_result_reports_round_times_links_and_frontier() -> None:
    result = run_scenario(small())
    assert len(result.round_times()) == 4 * 2
    assert all(t > 0 for t in result.round_times())
    assert result.links[("b", "a")].bytes_total > 0
    ts, fs = result.frontier["a"]
    assert len(ts) == len(fs) > 1 and fs[-1] == 3
    js = result.to_json()
    assert js["summary"]["aggregates"] == 32
    assert "b->a" in js["links"] and "a/3/1" in js["aggregates"]
    assert "round time" in result.table()
