"""tools/bench_sim.py's daemon comparison on a tiny scenario: four real daemons and the simulator get the
same pushes and deliver every aggregate; each round's result is equal in both or differs only by the
order in which the root added the children's partials (see docs/sim.md)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import bench_sim  # noqa: E402

from sims.des.scenario import load_scenario  # noqa: E402
from sims.des.world import Simulation  # noqa: E402


def test_daemons_and_simulator_agree_up_to_summation_order() -> None:
    sc = load_scenario(bench_sim.SCENARIOS / "four-sites.toml").replace(iterations=4)
    sim = Simulation(sc).run().digests()
    daemons, wall = asyncio.run(bench_sim.daemons_digests(sc))
    assert wall > 0
    assert set(daemons) == set(sim) and len(sim) == 4 * 4 * 4
    for it in range(4):
        for layer in range(4):
            same = all(sim[(s, it, layer)] == daemons[(s, it, layer)] for s in sc.site_names())
            assert same or bench_sim._order_explains(sc, (it, layer), sim, daemons)
