"""Benchmark the compression and sparse-optimizer kernels against the obvious alternatives, side by side.

On one 25M-element fp32 gradient at 1 % density (StellaTrain §3.1–3.2, §5.3), in one run:

* compression: cache-aware threshold-v vs ``torch.topk``, ``numpy.argpartition``, element-wise threshold-v,
  the NumPy reference path, and ``numpy.copyto`` of the same buffer (the memory-bandwidth floor);
* sparse update: sparse Adam / SGD on a torch parameter vs a dense ``torch.optim`` step on the same one;
* cache-aware vs element-wise threshold-v, compression plus sparse Adam update together;
* AIMD tracking on a gradient stream whose scale drifts 10x over 50 steps;
* numba first-call compile time (cold cache) and cached load time, in fresh processes.

Times are the best of ``--reps`` wall-clock runs (other work on the machine only ever adds time); the
pairs a key divides are timed round-robin so that load spikes hit both alike. Prints a table and the
ratio keys with their targets; ``--json PATH`` writes everything. ``--quick`` stays under a
minute on a 2-core machine.

    python tools/bench_kernels.py --quick --json bench-kernels.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wanrt.kernels import ErrorFeedback, ThresholdV, make_compressor, make_sparse_optimizer
from wanrt.kernels.backend import ENV_VAR

TARGETS: dict[str, tuple[str, float]] = {
    "speedup_vs_torch_topk": (">=", 30.0),
    "ratio_to_memcpy": ("<=", 2.0),
    "cache_aware_vs_vanilla": (">=", 3.0),
    "sparse_adam_speedup": (">=", 100.0),
    "aimd_steps_to_target": ("<=", 5.0),
}


def timeit(fn: Callable[[], object], reps: int) -> dict[str, float]:
    """Best and median wall time in ms of ``reps`` calls after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"best_ms": min(times), "median_ms": statistics.median(times)}


def timeit_interleaved(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, dict[str, float]]:
    """Like :func:`timeit` for several functions, run round-robin so that load spikes from other
    processes hit all of them alike (their ratios are what the keys report)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: {"best_ms": min(t), "median_ms": statistics.median(t)} for name, t in times.items()}


def aligned_param(n: int) -> torch.Tensor:
    """A parameter as a trainer has it: a torch tensor (64-byte aligned storage)."""
    return torch.zeros(n, dtype=torch.float32)


def bench_compression(g: np.ndarray, density: float, reps: int) -> dict[str, dict[str, float]]:
    n = g.shape[0]
    k = round(density * n)
    dst = np.empty_like(g)
    ca = make_compressor("threshold_v_block", density=density)
    va = make_compressor("threshold_v", density=density)
    for _ in range(3):  # let v settle: the steady state is what a training run sees
        ca.compress(0, g)
        va.compress(0, g)
    out = timeit_interleaved(
        {
            "memcpy (np.copyto)": lambda: np.copyto(dst, g),
            "threshold-v cache-aware (fused)": lambda: ca.compress(0, g),
            "threshold-v element-wise (fused)": lambda: va.compress(0, g),
        },
        reps,
    )
    assert isinstance(ca, ThresholdV) and isinstance(va, ThresholdV)
    if ca.exact_steps(0) or va.exact_steps(0):
        print(f"note: exact fallback passes during timing: {ca.exact_steps(0)}, {va.exact_steps(0)}")
    ef = ErrorFeedback()
    res_g = g * np.float32(0.01)
    for _ in range(3):
        ef.compress(0, res_g, ca)
    out["threshold-v cache-aware + error feedback"] = timeit(lambda: ef.compress(0, res_g, ca), reps)
    old = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = "numpy"
    try:
        ref = make_compressor("threshold_v_block", density=density)
        for _ in range(2):
            ref.compress(0, g)
        out["threshold-v cache-aware (NumPy path)"] = timeit(lambda: ref.compress(0, g), max(2, reps // 2))
    finally:
        if old is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = old
    tg = torch.from_numpy(g)

    def torch_topk() -> object:
        idx = torch.topk(tg.abs(), k, sorted=False).indices
        return tg[idx]

    def np_argpartition() -> object:
        idx = np.argpartition(np.abs(g), n - k)[n - k :]
        return g[idx]

    out["torch.topk(|g|) + gather"] = timeit(torch_topk, max(2, reps // 2))
    out["np.argpartition(|g|) + gather"] = timeit(np_argpartition, max(2, reps // 2))
    return out


def bench_updates(g: np.ndarray, density: float, reps: int) -> dict[str, dict[str, float]]:
    n = g.shape[0]
    out: dict[str, dict[str, float]] = {}
    block = make_compressor("threshold_v_block", density=density).compress(0, g)
    elem = make_compressor("threshold_v", density=density).compress(0, g)
    for kind in ("adam", "sgd"):
        steps: dict[str, Callable[[], object]] = {}
        for name, payload in (("cache-aware blocks", block), ("element-wise", elem)):
            p = aligned_param(n)
            opt = make_sparse_optimizer(kind, lr=1e-3)
            steps[f"sparse {kind} ({name}, {payload.nnz} values)"] = functools.partial(
                opt.step, 0, p, payload
            )
        out.update(timeit_interleaved(steps, reps))
    dense_reps = max(2, reps // 2)
    for label, make in (
        ("dense torch.optim.Adam (default)", lambda ps: torch.optim.Adam(ps, lr=1e-3)),
        ("dense torch.optim.Adam (fused=True)", lambda ps: torch.optim.Adam(ps, lr=1e-3, fused=True)),
        ("dense torch.optim.SGD (default)", lambda ps: torch.optim.SGD(ps, lr=1e-3)),
    ):
        param = torch.nn.Parameter(aligned_param(n))
        param.grad = torch.from_numpy(g)
        topt = make([param])
        out[label] = timeit(topt.step, dense_reps)
    return out


def aimd_steps(n: int, steps: int, direction: int, feedback: bool, density: float) -> dict[str, Any]:
    """Steps until the payload's block count stays within ±10 % of k_block, under a 10x scale drift."""
    rng = np.random.default_rng(7 + direction + 2 * feedback)
    c = make_compressor("threshold_v_block", density=density)
    assert isinstance(c, ThresholdV)
    ef = ErrorFeedback()
    kb = c.targets(n).k_block
    ratios = []
    for i in range(steps):
        scale = np.float32(10.0 ** (direction * i / (steps - 1)))
        grad = rng.standard_normal(n).astype(np.float32) * scale
        p = ef.compress(0, grad, c) if feedback else c.compress(0, grad)
        ratios.append(p.nnz_blocks / kb)
    outside = [i for i, r in enumerate(ratios) if abs(r - 1.0) > 0.1]
    return {
        "steps_to_target": (outside[-1] + 1) if outside else 0,
        "exact_fallback_steps": c.exact_steps(0),
        "min_ratio": min(ratios),
        "max_ratio": max(ratios),
    }


def jit_cost(repo: Path, cold: bool) -> dict[str, float]:
    """Compile every fused kernel in a fresh process with an empty numba cache, then load them cached.

    Without ``cold`` only the cached load is measured (from the default cache location).
    """
    code = "from wanrt.kernels import warmup; print(warmup())"
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ)
        if cold:
            env["NUMBA_CACHE_DIR"] = cache
        env.pop(ENV_VAR, None)
        for label in ("jit_cold_s", "jit_cached_s") if cold else ("jit_cached_s",):
            res = subprocess.run(
                [sys.executable, "-c", code], env=env, cwd=repo, capture_output=True, text=True, check=True
            )
            out[label] = float(res.stdout.strip().splitlines()[-1])
    return out


def ratio(a: dict[str, float], b: dict[str, float]) -> float:
    return a["best_ms"] / b["best_ms"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, smaller AIMD stream (< 60 s)")
    ap.add_argument("--json", type=Path, help="write all results here")
    ap.add_argument("--n", type=int, default=25_000_000, help="gradient elements (default 25M)")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per measurement")
    ap.add_argument("--no-jit", action="store_true", help="skip the compile-time measurement")
    args = ap.parse_args(argv)
    reps = args.reps or (4 if args.quick else 9)
    t_start = time.perf_counter()
    repo = Path(__file__).resolve().parent.parent

    jit = {} if args.no_jit else jit_cost(repo, cold=not args.quick)
    g = np.random.default_rng(0).standard_normal(args.n).astype(np.float32)
    comp = bench_compression(g, args.density, reps)
    upd = bench_updates(g, args.density, reps)
    aimd_n = 1_000_000 if args.quick else 4_000_000
    aimd = {
        f"{'growing' if d > 0 else 'shrinking'}{' +EF' if ef else ''}": aimd_steps(
            aimd_n, 50, d, ef, args.density
        )
        for d in (1, -1)
        for ef in (False, True)
    }

    ca = comp["threshold-v cache-aware (fused)"]
    va = comp["threshold-v element-wise (fused)"]
    sa_block = next(v for k, v in upd.items() if k.startswith("sparse adam (cache-aware"))
    sa_elem = next(v for k, v in upd.items() if k.startswith("sparse adam (element-wise"))
    ss_block = next(v for k, v in upd.items() if k.startswith("sparse sgd (cache-aware"))
    keys: dict[str, float] = {
        "speedup_vs_torch_topk": ratio(comp["torch.topk(|g|) + gather"], ca),
        "speedup_vs_argpartition": ratio(comp["np.argpartition(|g|) + gather"], ca),
        "ratio_to_memcpy": ratio(ca, comp["memcpy (np.copyto)"]),
        "fused_vs_numpy_path": ratio(comp["threshold-v cache-aware (NumPy path)"], ca),
        "cache_aware_vs_vanilla": (va["best_ms"] + sa_elem["best_ms"])
        / (ca["best_ms"] + sa_block["best_ms"]),
        "cache_aware_vs_vanilla_compression": ratio(va, ca),
        "cache_aware_vs_vanilla_update": ratio(sa_elem, sa_block),
        "sparse_adam_speedup": ratio(upd["dense torch.optim.Adam (default)"], sa_block),
        "sparse_adam_speedup_vs_fused_torch": ratio(upd["dense torch.optim.Adam (fused=True)"], sa_block),
        "sparse_sgd_speedup": ratio(upd["dense torch.optim.SGD (default)"], ss_block),
        "aimd_steps_to_target": float(max(r["steps_to_target"] for r in aimd.values())),
    }

    print(
        f"\n{args.n:,} fp32 elements, density {args.density}, best of {reps} (torch threads: "
        f"{torch.get_num_threads()}; our kernels: 1 thread)\n"
    )
    print(f"{'measurement':58s} {'best ms':>9s} {'median ms':>10s} {'vs ours':>8s}")
    print("-- compression (vs cache-aware threshold-v)")
    for name, t in comp.items():
        print(f"{name:58s} {t['best_ms']:9.2f} {t['median_ms']:10.2f} {ratio(t, ca):7.2f}x")
    print("-- sparse update (vs the sparse step of the same optimizer on cache-aware blocks)")
    for name, t in upd.items():
        base = ss_block if "sgd" in name.lower() else sa_block
        print(f"{name:58s} {t['best_ms']:9.2f} {t['median_ms']:10.2f} {ratio(t, base):7.2f}x")
    print(f"-- AIMD tracking (payload within ±10 % of k_block; 10x drift over 50 steps, {aimd_n:,} elements)")
    for name, r in aimd.items():
        print(
            f"{name:58s} steps {r['steps_to_target']:3d}  exact passes {r['exact_fallback_steps']}  "
            f"ratio {r['min_ratio']:.2f}..{r['max_ratio']:.2f}"
        )
    if "jit_cold_s" in jit:
        print(
            f"-- numba: cold compile of every kernel {jit['jit_cold_s']:.1f} s, cached load "
            f"{jit['jit_cached_s']:.2f} s"
        )
    elif jit:
        print(f"-- numba: cached load of every kernel {jit['jit_cached_s']:.2f} s (cold compile: full run)")
    print("\nkey                                   value   target  met")
    verdicts = {}
    for name, value in keys.items():
        if name in TARGETS:
            op, target = TARGETS[name]
            met = value >= target if op == ">=" else value <= target
            verdicts[name] = {"value": value, "target": f"{op} {target:g}", "met": met}
            print(f"{name:34s} {value:9.2f}  {op} {target:<6g} {'yes' if met else 'NO'}")
        else:
            print(f"{name:34s} {value:9.2f}")
    elapsed = time.perf_counter() - t_start
    print(f"\n(total {elapsed:.1f} s)")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "config": {
                        "n": args.n,
                        "density": args.density,
                        "reps": reps,
                        "quick": args.quick,
                        "torch_threads": torch.get_num_threads(),
                        "machine": platform.processor() or platform.machine(),
                        "cpus": os.cpu_count(),
                    },
                    "compression": comp,
                    "update": upd,
                    "aimd": aimd,
                    "jit": jit,
                    "keys": keys,
                    "targets": verdicts,
                    "elapsed_s": elapsed,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
