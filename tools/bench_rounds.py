"""Benchmark the gateway's round engine and its sparse aggregation.

Two measurements, each compared side by side in the same run:

1. **Round engine alone** — N sans-IO :class:`~gateways.rounds.engine.RoundEngine` s (default 32) joined by a
   zero-latency in-memory queue, small payloads, so the cost is the engine's bookkeeping rather than the
   WAN or NumPy. Reports rounds/s for the whole system on one core and for the busiest engine (each gateway
   runs on its own machine, so the busiest one bounds the rate), for tree, star and ring plans.
2. **Aggregation** — summing 4 COO payloads of a 25M-element layer at 1 % density, block 16 (StellaTrain's
   cache-aware blocks), with :func:`gateways.rounds.aggregate.aggregate`, against a dense ``np.add`` of the
   same 4
   layers (what a dense all-reduce has to do) and against a naive ``np.unique`` + ``np.add.at`` union.

Usage: ``python tools/bench_rounds.py [--quick] [--json out.json] [--sites 32]``. Timings on a shared machine
are noisy: run twice and compare the ratios, which travel better than the absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gateways.rounds.actions import Deliver, Send
from gateways.rounds.aggregate import aggregate, top_blocks
from gateways.rounds.config import RoundConfig
from gateways.rounds.engine import RoundEngine
from gateways.rounds.topology import PlanSpec
from wanrt.payload import SparsePayload, n_blocks


def _small_payload(rng: np.random.Generator, layer: int, dense_len: int = 256, bs: int = 16) -> SparsePayload:
    nb = n_blocks(dense_len, bs)
    idx = np.sort(rng.choice(nb, size=4, replace=False)).astype(np.int64)
    return SparsePayload(layer, dense_len, bs, idx, rng.standard_normal(4 * bs).astype(np.float32))


def bench_engine(kind: str, sites: int, iterations: int, layers: int, arity: int = 2) -> dict[str, Any]:
    """Drive ``sites`` engines through ``iterations`` x ``layers`` rounds on a zero-latency queue."""
    names = [f"s{i:02d}" for i in range(sites)]
    costs = {s: float(i) for i, s in enumerate(names)}
    spec = PlanSpec.make(kind, arity=arity, costs=costs)  # type: ignore[arg-type]
    cfg = RoundConfig(window=3, max_lag=16, retain_finals=4)
    engines = {s: RoundEngine(s, names, spec, cfg) for s in names}
    busy = dict.fromkeys(names, 0.0)
    rng = np.random.default_rng(0)
    pool = [[_small_payload(rng, layer) for layer in range(layers)] for _ in range(8)]
    queue: deque[tuple[str, str, Any]] = deque()
    delivered = 0
    messages = 0
    now = 0.0

    def run(site: str, fn: Callable[..., list[Any]], *args: Any) -> None:
        nonlocal delivered
        t0 = time.process_time()  # CPU time: other processes on a shared machine distort wall time less
        actions = fn(*args)
        busy[site] += time.process_time() - t0
        for a in actions:
            if isinstance(a, Send):
                queue.append((a.peer, site, a.msg))
            elif isinstance(a, Deliver):
                delivered += 1

    wall0 = time.perf_counter()
    for it in range(iterations):
        now = it * 0.01
        for k, s in enumerate(names):
            for layer in reversed(range(layers)):
                run(s, engines[s].local_push, it, layer, pool[(it + k) % 8][layer], now)
        while queue:
            dst, src, msg = queue.popleft()
            messages += 1
            run(dst, engines[dst].peer_message, src, msg, now)
    wall = time.perf_counter() - wall0
    rounds = iterations * layers
    if delivered != rounds * sites:
        raise SystemExit(f"{kind}: {delivered} deliveries, expected {rounds * sites}")
    total = sum(busy.values())
    return {
        "topology": kind,
        "sites": sites,
        "rounds": rounds,
        "messages": messages,
        "engine_s": total,
        "wall_s": wall,
        "rounds_per_s_all_engines": rounds / total,
        "rounds_per_s_busiest_engine": rounds / max(busy.values()),
        "us_per_message": 1e6 * total / max(1, messages + rounds * sites),
    }


def _timeit(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def bench_aggregation(dense_len: int, density: float, bs: int, k: int, repeat: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(1)
    nb = n_blocks(dense_len, bs)
    nnz = int(nb * density)
    ps = []
    for _ in range(k):
        idx = np.sort(rng.choice(nb, size=nnz, replace=False)).astype(np.int64)
        ps.append(SparsePayload(0, dense_len, bs, idx, rng.standard_normal(nnz * bs).astype(np.float32)))
    dense = [p.to_dense() for p in ps]
    out = np.empty(dense_len, np.float32)

    def dense_add() -> None:
        np.add(dense[0], dense[1], out=out)
        for d in dense[2:]:
            np.add(out, d, out=out)

    def naive_union() -> None:
        idx = np.concatenate([p.indices for p in ps])
        uniq, inv = np.unique(idx, return_inverse=True)
        acc = np.zeros((uniq.shape[0], bs), np.float32)
        np.add.at(acc, inv, np.concatenate([p.values for p in ps]).reshape(-1, bs))

    result = aggregate(ps)
    assert result is not None
    dense_add()
    np.testing.assert_allclose(result.to_dense(), out, rtol=1e-5, atol=1e-5)
    cap = max(1, int(nb * density))
    cases = [
        ("dense np.add (4 layers)", dense_add),
        ("sparse aggregate (merge)", lambda: aggregate(ps)),
        ("naive np.unique + np.add.at", naive_union),
        ("re-sparsify to k blocks (cap)", lambda: top_blocks(result, cap)),
    ]
    rows = []
    base = None
    for name, fn in cases:
        best, med = _timeit(fn, repeat)
        if base is None:
            base = best
        rows.append(
            {
                "case": name,
                "best_ms": best * 1e3,
                "median_ms": med * 1e3,
                "speedup_vs_dense": base / best,
                "dense_len": dense_len,
                "density": density,
                "block": bs,
                "payloads": k,
                "union_blocks": result.nnz_blocks,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="fewer rounds and repeats (well under 60 s)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--sites", type=int, default=32)
    args = ap.parse_args(argv)
    iterations, layers, repeat = (20, 5, 5) if args.quick else (60, 10, 15)

    # a ring sends 2(N-1) messages per member and round: fewer iterations keep it within the time budget
    engine_rows = [
        bench_engine(kind, args.sites, iterations if kind != "ring" else max(5, iterations // 4), layers)
        for kind in ("tree", "star", "ring")
    ]
    print(f"Round engine alone: {args.sites} sites, {layers} layers, 4-block payloads of 256 floats")
    print(
        f"{'topology':<10}{'rounds':>8}{'messages':>10}{'rounds/s (all)':>16}"
        f"{'rounds/s (busiest)':>20}{'us/event':>10}"
    )
    for r in engine_rows:
        print(
            f"{r['topology']:<10}{r['rounds']:>8}{r['messages']:>10}{r['rounds_per_s_all_engines']:>16.0f}"
            f"{r['rounds_per_s_busiest_engine']:>20.0f}{r['us_per_message']:>10.1f}"
        )
    agg_rows = bench_aggregation(25_000_000, 0.01, 16, 4, repeat)
    print("\nAggregating 4 payloads of a 25M-element layer, 1 % density, block 16")
    print(f"{'case':<32}{'best ms':>10}{'median ms':>11}{'vs dense':>10}")
    for r in agg_rows:
        print(f"{r['case']:<32}{r['best_ms']:>10.2f}{r['median_ms']:>11.2f}{r['speedup_vs_dense']:>9.1f}x")
    if args.json:
        args.json.write_text(json.dumps({"engine": engine_rows, "aggregation": agg_rows}, indent=2))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
