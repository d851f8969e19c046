"""A fluid model of one synchronous WAN round, to check seed 002's claims against :class:`RateAllocator`.

Seed 002 ("Straggler-Aware Scheduler for Distributed Training", docs/architecture.md) evaluates its
scheduler on a simulated network, ``delay_i = d_base / r_i``, with communication 70 % of the iteration and
the round ending with its slowest flow (T_iter = max_i T_flow_i). This module is that model, on virtual
time and seeded random draws, so the very same :class:`~gateways.sending.rate_allocator.RateAllocator`
object the gateway runs can be measured against a fixed-rate baseline fed with *identical* link slowdowns
(a paired comparison, no noise between arms). One link's time in an iteration is
``comm_s × slowdown_i × base_i / rate_i``; the iteration takes
``compute_s + max_i`` of those. The four link profiles are the paper's:

* ``uniform``   every link at d_base;
* ``straggler`` link 0 persistently 3× slower;
* ``variable``  every link N(1, σ²)·d_base per iteration (the paper gives no σ; σ = 0.2 here, clipped);
* ``bursty``    every link 5× slower with probability 0.2 per iteration, independently.

Rows with ``conserve=True`` rescale the rates to the base sum after each reallocation (a shared uplink);
the paper's rule adds (α − β)·|S| shares of capacity from nowhere, which flatters it on this model.
``python -m sims.models.fluid_round [--quick] [--json PATH]`` prints the table (the report cites it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt

from gateways.sending.config import RateConfig
from gateways.sending.rate_allocator import RateAllocator

__all__ = ["PROFILES", "Comparison", "FluidResult", "compare", "main", "simulate"]

Slowdown = Callable[[np.random.Generator, int], npt.NDArray[np.float64]]


def _uniform(rng: np.random.Generator, n: int) -> npt.NDArray[np.float64]:
    return np.ones(n)


def _straggler(rng: np.random.Generator, n: int) -> npt.NDArray[np.float64]:
    s = np.ones(n)
    s[0] = 3.0
    return s


def _variable(rng: np.random.Generator, n: int) -> npt.NDArray[np.float64]:
    return np.clip(rng.normal(1.0, 0.2, size=n), 0.2, 3.0)


def _bursty(rng: np.random.Generator, n: int) -> npt.NDArray[np.float64]:
    return np.where(rng.random(n) < 0.2, 5.0, 1.0)


PROFILES: dict[str, Slowdown] = {
    "uniform": _uniform,
    "straggler": _straggler,
    "variable": _variable,
    "bursty": _bursty,
}


@dataclass(frozen=True)
class FluidResult:
    profile: str
    mean_iteration_s: float
    reallocations: int
    iteration_s: tuple[float, ...]


def simulate(
    profile: str,
    *,
    cfg: RateConfig | None,
    n_links: int = 4,
    iterations: int = 250,
    seed: int = 0,
    compute_s: float = 0.3,
    comm_s: float = 0.7,
) -> FluidResult:
    """Run ``iterations`` rounds; ``cfg=None`` keeps every link at its base rate (the baseline)."""
    rng = np.random.default_rng(seed)
    links = [f"l{i}" for i in range(n_links)]
    base = dict.fromkeys(links, 1.0)
    alloc = RateAllocator(links, base, cfg) if cfg is not None else None
    rates = dict(base)
    times: list[float] = []
    for it in range(iterations):
        slow = PROFILES[profile](rng, n_links)
        link_t = {p: comm_s * float(slow[i]) * base[p] / rates[p] for i, p in enumerate(links)}
        times.append(compute_s + max(link_t.values()))
        if alloc is not None:
            rates = alloc.observe(it, link_t)
    return FluidResult(profile, float(np.mean(times)), alloc.reallocations if alloc else 0, tuple(times))


@dataclass(frozen=True)
class Comparison:
    profile: str
    streak: int
    conserve_total: bool
    baseline_s: float
    ours_s: float
    change: float  # (ours - baseline) / baseline: negative = faster
    reallocations: int


def compare(
    profiles: Sequence[str] = tuple(PROFILES),
    *,
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
    iterations: int = 250,
    n_links: int = 4,
    cfg: RateConfig | None = None,
) -> list[Comparison]:
    """Baseline vs allocator on the same draws, averaged over ``seeds`` (the paper ran 5 × 250)."""
    cfg = cfg or RateConfig()
    out = []
    for name in profiles:
        base = [simulate(name, cfg=None, seed=s, iterations=iterations, n_links=n_links) for s in seeds]
        ours = [simulate(name, cfg=cfg, seed=s, iterations=iterations, n_links=n_links) for s in seeds]
        b = float(np.mean([r.mean_iteration_s for r in base]))
        o = float(np.mean([r.mean_iteration_s for r in ours]))
        realloc = sum(r.reallocations for r in ours)
        out.append(Comparison(name, cfg.streak, cfg.conserve_total, b, o, (o - b) / b, realloc))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Seed 002 rate reallocation on a fluid model, vs fixed rates.")
    ap.add_argument("--quick", action="store_true", help="1 seed × 100 iterations instead of 5 × 250")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    ap.add_argument("--links", type=int, default=4)
    args = ap.parse_args(argv)
    seeds, iterations = ((0,), 100) if args.quick else ((0, 1, 2, 3, 4), 250)
    rows: list[Comparison] = []
    for conserve in (False, True):
        for profiles, streak in ((tuple(PROFILES), 3), (("bursty",), 1)):
            # streak 1 on bursty is the paper's ablation: no persistence filter
            cfg = RateConfig(streak=streak, conserve_total=conserve)
            rows += compare(profiles, seeds=seeds, iterations=iterations, n_links=args.links, cfg=cfg)
    print(f"{len(seeds)} seed(s) × {iterations} iterations, {args.links} links; change = ours/baseline - 1")
    cols = ("K", "conserve", "baseline s", "ours s", "change", "reallocs")
    widths = (2, 8, 11, 8, 8, 8)
    print(f"{'profile':<10} " + " ".join(f"{c:>{w}}" for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        print(
            f"{r.profile:<10} {r.streak:>2} {r.conserve_total!s:>8} {r.baseline_s:>11.4f} {r.ours_s:>8.4f} "
            f"{r.change * 100:>+7.1f}% {r.reallocations:>8}"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"seeds": list(seeds), "iterations": iterations, "rows": [asdict(r) for r in rows]}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
