"""The rate allocator's hold against seed 002's literal recovery rule, on real gateway daemons.

Three clusters of the emulation in ``tools/bench_gateway_straggler.py`` (4 sites, star rooted at a, link
a<->d 3x slower, capacity = base x allocator share / slowdown) run side by side, one iteration each in
rotating order, on identical slowdown draws: rate reallocation off (baseline), on with ``hold = false``
(the paper's literal rule, which recovers a persistent straggler as soon as its boost works and so
oscillates), and on with ``hold = true`` (the default: the boost is held while the link is still slow at
its base rate; docs/rate_allocator.md). Same machine load for all three, so the ratio hold / literal is
the hold's effect.

Usage: python tools/bench_gateway_hold.py [--quick] [--profile straggler|bursty] [--json PATH]
JSON keys: ``hold_change``, ``literal_change`` (mean iteration time / baseline - 1),
``hold_vs_literal_iter_ratio``, ``hold_reallocations``, ``literal_reallocations``,
``hold_boost_range``, ``literal_boost_range`` (min, max of link d's boost after the first 20 iterations).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gateway_cluster import running, short_dir
from bench_gateway_straggler import LINKS, STRAGGLER, Arm, StragglerSetup, _configs, slowdowns

from gateways.config import RateConfig

ARMS: dict[str, RateConfig] = {
    "baseline": RateConfig(enabled=False),
    "literal": RateConfig(hold=False),
    "hold": RateConfig(),
}
SETTLED = 20  # iterations after which the boosts of a 3x link have ramped up (K = 3, cooldown 5, 3 steps)


async def run_hold(setup: StragglerSetup, profile: str) -> dict[str, Any]:
    draws = slowdowns(profile, setup.iterations, setup.seed)
    with short_dir() as d:
        for name in ARMS:
            (d / name).mkdir()
        cfgs = {name: _configs(d / name, setup, cfg) for name, cfg in ARMS.items()}
        async with (
            running(cfgs["baseline"]) as cb,
            running(cfgs["literal"]) as cl,
            running(cfgs["hold"]) as ch,
        ):
            arms = [Arm("baseline", cb, setup), Arm("literal", cl, setup), Arm("hold", ch, setup)]
            uniform = dict.fromkeys(LINKS, 1.0)
            calib: list[float] = []
            for i in range(setup.warmup):
                for arm in arms:
                    comm = await arm.iteration(uniform, 0.0, record=False)
                    if i >= setup.warmup // 2:
                        calib.append(comm)
            compute_s = statistics.median(calib) * (1 - setup.comm_fraction) / setup.comm_fraction
            for j in range(setup.iterations):
                k = j % len(arms)  # rotate who goes first: the tail of one arm's work hits each alike
                for arm in arms[k:] + arms[:k]:
                    await arm.iteration(draws[j], compute_s)
            res = {arm.name: arm.summary() for arm in arms}
    base = res["baseline"]["mean_iteration_s"]
    out: dict[str, Any] = {
        "profile": profile,
        "iterations": setup.iterations,
        "compute_s": compute_s,
        "arms": res,
    }
    for name in ("literal", "hold"):
        boosts = [row["boost"][STRAGGLER] for row in res[name]["trace"][SETTLED:]]
        out[f"{name}_change"] = res[name]["mean_iteration_s"] / base - 1
        out[f"{name}_reallocations"] = res[name]["reallocations"]
        out[f"{name}_boost_range"] = [min(boosts), max(boosts)] if boosts else []
    out["hold_vs_literal_iter_ratio"] = res["hold"]["mean_iteration_s"] / res["literal"]["mean_iteration_s"]
    return out


def print_hold(r: dict[str, Any]) -> None:
    print(
        f"{r['profile']} profile, {r['iterations']} iterations per arm, compute {r['compute_s']:.3f} s, "
        f"arms paired per iteration"
    )
    print(f"  {'arm':10} {'mean it s':>9} {'change':>8} {'reallocs':>8} {'d boost after it 20':>20}")
    base = r["arms"]["baseline"]["mean_iteration_s"]
    print(f"  {'baseline':10} {base:9.3f}")
    for name in ("literal", "hold"):
        lo, hi = r[f"{name}_boost_range"] or [float("nan")] * 2
        print(
            f"  {name:10} {r['arms'][name]['mean_iteration_s']:9.3f} {r[f'{name}_change']:+8.1%} "
            f"{r[f'{name}_reallocations']:8d} {lo:9.2f} .. {hi:5.2f}"
        )
    print(f"  hold_vs_literal_iter_ratio = {r['hold_vs_literal_iter_ratio']:.4f}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="40 iterations of smaller layers (under 60 s)")
    ap.add_argument("--profile", default="straggler", choices=("straggler", "bursty"))
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    setup = StragglerSetup(iterations=40, warmup=4, layer_len=125_000) if args.quick else StragglerSetup()
    load = os.getloadavg()[0]
    r = asyncio.run(run_hold(setup, args.profile))
    r["loadavg_start"], r["loadavg_end"] = load, os.getloadavg()[0]
    print_hold(r)
    print(f"  load average {r['loadavg_start']:.1f} -> {r['loadavg_end']:.1f}")
    if args.json:
        args.json.write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
