"""Benchmark the discrete-event simulator (sims.des): scale, and agreement with real daemons.

(a) **Scale**: the packaged ``tree-1000`` scenario — 1 000 gateway nodes in an 8-ary tree, links only to
    plan neighbours, one 4 096-element layer at 1 % per iteration — for 100 rounds (``--quick``: the same
    1 000 sites, 3 rounds; say so in the table). ``sim_wall_s`` is the wall time of the whole run
    (building 1 000 nodes and 999 handshakes included); ``sim_setup_s`` and ``sim_wall_per_round_s``
    split it. ``sim_cpu_s`` is the process's CPU time for the same span and ``sim_load_1min`` the machine's
    load average at the end: on a shared machine the wall time says as much about the neighbours.
    ``--profile`` adds where the time goes (share of CPU per file and per function).
(b) **Matches daemons**: the packaged ``four-sites`` scenario (4 sites, star, 50 iterations × 4 layers,
    no faults) on the simulator, and the very same pushes (``sims.des.payloads.make_payload``: seeded by
    (seed, site, iteration, layer)) through four real in-process ``GatewayDaemon`` s on unix sockets fed
    by real-protocol trainers (``tools/bench_gateway_cluster.py``). ``sim_matches_daemons`` = 1 when every
    (site, iteration, layer) aggregate has the same payload digest in both; otherwise the table lists the
    first differences. Beside it, both wall times and their ratio.

(c) **The old models as DES scenarios** (``sims.des.crosscheck``): EDF's first-layer speedup over FIFO
    (16 VGG-like layers, 16 MiB, one 100 Mbit/s uplink) in the DES and in ``sims.models.edf_link``; seed
    002's persistent-straggler change with the real RateAllocator inside real nodes and in
    ``sims.models.fluid_round`` for the same compute/communication split.

Usage: python tools/bench_sim.py [--quick] [--json PATH] [--profile] [--parts abc]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gateway_cluster import BenchTrainer, running, short_dir, star_configs

from sims.des.payloads import make_payload, payload_digest
from sims.des.scenario import Scenario, load_scenario
from sims.des.world import Simulation, frozen_world
from wanrt.protocol import Aggregate

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "sims" / "scenarios"


# -- (a) scale --------------------------------------------------------------------------------------------


def run_scale(rounds: int, *, profile: bool) -> dict[str, Any]:
    sc = load_scenario(SCENARIOS / "tree-1000.toml").replace(iterations=rounds)
    sim = Simulation(sc, clock=time.perf_counter)
    prof = cProfile.Profile() if profile else None
    c0 = time.process_time()
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    sim.setup()
    t1 = time.perf_counter()
    with frozen_world():
        sim.loop.run(until=sc.max_time_s, stop=sim._done)
    if prof is not None:
        prof.disable()
    t2 = time.perf_counter()
    cpu = time.process_time() - c0
    result = sim.result(t2 - t0)
    out: dict[str, Any] = {
        "sim_sites": len(sim.names),
        "sim_rounds": rounds,
        "sim_wall_s": t2 - t0,
        "sim_setup_s": t1 - t0,
        "sim_wall_per_round_s": (t2 - t1) / rounds,
        "sim_cpu_s": cpu,
        "sim_load_1min": os.getloadavg()[0],
        "sim_finished": result.finished,
        "sim_events": result.events,
        "sim_virtual_s": result.virtual_s,
        "sim_wan_bytes_per_round": sum(lr.bytes_total for lr in result.links.values()) / rounds,
    }
    if prof is not None:
        out["profile"] = _profile_shares(prof)
    return out


def _profile_shares(prof: cProfile.Profile, top: int = 12) -> dict[str, list[tuple[str, float]]]:
    """Share of self time per file and per function (repository paths; the rest is 'other')."""
    stats = pstats.Stats(prof)
    by_file: Counter[str] = Counter()
    by_func: Counter[str] = Counter()
    total = 0.0
    for (path, _line, func), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        total += tt
        rel = str(Path(path).resolve().relative_to(ROOT)) if path.startswith(str(ROOT)) else "other"
        by_file[rel] += tt
        by_func[f"{rel}:{func}" if rel != "other" else f"other:{func}"] += tt
    return {
        "by_file": [(k, v / total) for k, v in by_file.most_common(top)],
        "by_function": [(k, v / total) for k, v in by_func.most_common(top)],
    }


# -- (b) matches daemons ----------------------------------------------------------------------------------


class DigestTrainer(BenchTrainer):
    """A :class:`BenchTrainer` that also keeps each Aggregate's payload digest."""

    def __init__(self, url: str, site: str) -> None:
        super().__init__(url, site)
        self.digests: dict[tuple[int, int], str] = {}

    def on_aggregate(self, event: Aggregate) -> None:
        self.digests.setdefault((event.iteration, event.layer), payload_digest(event.payload))


async def daemons_digests(sc: Scenario) -> tuple[dict[tuple[str, int, int], str], float]:
    """The scenario's pushes through four real daemons (a star rooted at the first site, as the scenario
    says); every trainer pushes iteration i's layers last-first, then waits for its aggregates."""
    names = sc.site_names()
    sizes = sc.payload.layer_sizes()
    with short_dir() as d:
        configs = star_configs(d, "".join(names), shaping={})
        for cfg in configs.values():
            assert cfg.rounds.topology == sc.gateway.rounds.topology and cfg.root == (
                sc.gateway.root or names[0]
            )
        t0 = time.perf_counter()
        async with running(configs) as cluster:
            trainers: dict[str, DigestTrainer] = {}
            for s, old in cluster.trainers.items():  # swap in digest-keeping trainers
                await old.close()
                t = DigestTrainer(configs[s].trainer_listen, s)
                await t.connect()
                trainers[s] = t
            cluster.trainers = trainers  # type: ignore[assignment]

            async def site(s: str) -> None:
                idx = names.index(s)
                for it in range(sc.iterations):
                    for layer in reversed(range(len(sizes))):
                        p = make_payload(
                            sc.seed,
                            idx,
                            it,
                            layer,
                            dense_len=sizes[layer],
                            density=sc.payload.density,
                            block_size=sc.payload.block_size,
                            same_blocks=sc.payload.same_blocks,
                        )
                        await trainers[s].push(it, layer, p)
                    await trainers[s].wait_for([(it, layer) for layer in range(len(sizes))], timeout=120)

            await asyncio.gather(*(site(s) for s in names))
            wall = time.perf_counter() - t0
            out = {(s, it, layer): h for s, t in trainers.items() for (it, layer), h in t.digests.items()}
    return out, wall


def run_match() -> dict[str, Any]:
    sc = load_scenario(SCENARIOS / "four-sites.toml")
    result = Simulation(sc, clock=time.perf_counter).run()
    sim_digests = result.digests()
    daemon, daemon_wall = asyncio.run(daemons_digests(sc))
    keys = sorted(set(sim_digests) | set(daemon))
    differ = [k for k in keys if sim_digests.get(k) != daemon.get(k)]
    expected = len(sc.site_names()) * sc.iterations * len(sc.payload.layer_sizes())
    rounds = sorted({(it, layer) for _, it, layer in differ})
    explained = [r for r in rounds if _order_explains(sc, r, sim_digests, daemon)]
    return {
        "sim_matches_daemons": int(not differ and len(sim_digests) == expected and result.finished),
        "match_aggregates": len(sim_digests),
        "match_expected": expected,
        "match_differ": len(differ),
        "match_first_differences": [
            {"key": "/".join(map(str, k)), "sim": sim_digests.get(k), "daemons": daemon.get(k)}
            for k in differ[:5]
        ],
        "match_rounds_differ": len(rounds),
        "match_rounds_explained_by_sum_order": len(explained),
        "match_sim_wall_s": result.wall_s,
        "match_daemons_wall_s": daemon_wall,
        "match_daemons_over_sim": daemon_wall / result.wall_s if result.wall_s > 0 else None,
    }


def _order_explains(
    sc: Scenario,
    key: tuple[int, int],
    sim: dict[tuple[str, int, int], str],
    daemons: dict[tuple[str, int, int], str],
) -> bool:
    """Whether both results of round ``key`` are the root's sum of the same four pushes, the children's
    partials taken in two different orders (the star's root sums ``[own] + partials`` in arrival order:
    ``RoundEngine._gather``, ``senders = list(r.inputs)``; fp32 addition is not associative)."""
    import itertools

    from gateways.rounds.aggregate import aggregate

    it, layer = key
    names = sc.site_names()
    root = sc.gateway.root or names[0]
    size = sc.payload.layer_sizes()[layer]
    p = sc.payload
    pushes = {
        s: make_payload(sc.seed, i, it, layer, dense_len=size, density=p.density, block_size=p.block_size)
        for i, s in enumerate(names)
    }
    children = [s for s in names if s != root]
    orders = set()
    for perm in itertools.permutations(children):
        agg = aggregate([pushes[root]] + [pushes[c] for c in perm])
        assert agg is not None
        orders.add(payload_digest(agg))
    return all(sim.get((s, it, layer)) in orders and daemons.get((s, it, layer)) in orders for s in names)


# -- (c) the old models ----------------------------------------------------------------------------------


def run_models(*, quick: bool) -> dict[str, Any]:
    from sims.des.crosscheck import edf_check, straggler_check

    e = edf_check()
    s = straggler_check(iterations=40 if quick else 60)
    return {
        "edf_speedup_des": e.des_speedup,
        "edf_speedup_model": e.model_speedup,
        "edf_first_layer_des_s": (e.des_fifo_s, e.des_edf_s),
        "edf_first_layer_model_s": (e.model_fifo_s, e.model_edf_s),
        "straggler_change_des": s.des_change,
        "straggler_change_fluid": s.fluid_change,
        "straggler_comm_fraction": s.comm_fraction,
        "straggler_reallocations": s.reallocations,
    }


# -- main -------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 000 sites but 3 rounds instead of 100")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--profile", action="store_true", help="report where the scale run spends its time")
    ap.add_argument("--parts", default="abc", help="a: scale, b: matches daemons, c: models (default all)")
    ap.add_argument("--rounds", type=int, help="override the number of rounds of the scale run")
    args = ap.parse_args(argv)
    out: dict[str, Any] = {"quick": args.quick}
    if "a" in args.parts:
        rounds = args.rounds or (3 if args.quick else 100)
        out.update(run_scale(rounds, profile=args.profile))
    if "b" in args.parts:
        out.update(run_match())
    if "c" in args.parts:
        out.update(run_models(quick=args.quick))
    print_table(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


def print_table(out: dict[str, Any]) -> None:
    rows: list[tuple[str, str]] = []
    if "sim_sites" in out:
        note = " (quick: fewer rounds, same sites)" if out["quick"] else ""
        rows += [
            ("sim_sites", str(out["sim_sites"])),
            ("sim_rounds", f"{out['sim_rounds']}{note}"),
            ("sim_wall_s", f"{out['sim_wall_s']:.1f}"),
            ("  setup (nodes + handshakes) s", f"{out['sim_setup_s']:.1f}"),
            ("  per round s", f"{out['sim_wall_per_round_s']:.2f}"),
            (
                "  CPU s (process) / machine load",
                f"{out['sim_cpu_s']:.1f} / {out['sim_load_1min']:.1f} on {os.cpu_count()} cores",
            ),
            ("  100 rounds, projected s", f"{out['sim_setup_s'] + 100 * out['sim_wall_per_round_s']:.0f}"),
            (
                "  finished / events / virtual s",
                f"{out['sim_finished']} / {out['sim_events']} / {out['sim_virtual_s']:.2f}",
            ),
            ("  WAN bytes per round", f"{out['sim_wan_bytes_per_round']:.0f}"),
        ]
    if "sim_matches_daemons" in out:
        rows += [
            ("sim_matches_daemons", str(out["sim_matches_daemons"])),
            ("  aggregates compared / differing", f"{out['match_aggregates']} / {out['match_differ']}"),
            (
                "  differing rounds / explained by sum order",
                f"{out['match_rounds_differ']} / {out['match_rounds_explained_by_sum_order']}",
            ),
            (
                "  4-site wall s: sim / daemons",
                f"{out['match_sim_wall_s']:.2f} / {out['match_daemons_wall_s']:.2f}",
            ),
        ]
        ratio = out["match_daemons_over_sim"]
        if ratio is not None:
            rows.append(("  daemons / sim wall", f"{ratio:.2f}x"))
        for d in out["match_first_differences"]:
            rows.append((f"  differs {d['key']}", f"sim {d['sim']} daemons {d['daemons']}"))
    if "edf_speedup_des" in out:
        rows += [
            (
                "EDF first-layer speedup: DES / model",
                f"{out['edf_speedup_des']:.3f} / {out['edf_speedup_model']:.3f}",
            ),
            (
                "straggler change: DES / fluid",
                f"{out['straggler_change_des'] * 100:+.1f}% / {out['straggler_change_fluid'] * 100:+.1f}%"
                f" (comm {out['straggler_comm_fraction'] * 100:.0f}% of an iteration)",
            ),
        ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    for kind in ("by_file", "by_function"):
        for name, share in out.get("profile", {}).get(kind, []):
            print(f"  profile {kind}: {share * 100:5.1f}%  {name}")


if __name__ == "__main__":
    sys.exit(main())
