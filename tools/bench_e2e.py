"""End-to-end benchmark: wanrt against the dense baseline (what DDP would send) over shaped WAN links.

Everything real: gateway daemons (``wanrt gateway``), gloo trainer processes, the client API, unix-socket
links shaped to 1 Gbit/s, 500 Mbit/s and 100 Mbit/s with a 40 ms RTT. Two measurements, because a model
large enough that communication dominates the dense run (≥ 10 M parameters) cannot be trained to a target
on a 2-core CPU within minutes:

1. **Iterations to target** (convergence, nearly independent of the link speed): the demo's model and data
   (``wanrt demo`` defaults: MLP 0.3 M parameters, digits, 3 sites × 2 ranks), trained to the target loss
   with the dense baseline and with wanrt at 1 Gbit/s, for ``--seeds`` seeds (default 2: the count of a
   single run varies by ±15 % with the loss's noise near the target and with which layers arrive stale).
   ``iters_to_target_ratio`` = mean wanrt / mean dense.
2. **Steady-state iteration time** at each bandwidth: an MLP of 10.5 M parameters (hidden 3200; 42 MB of
   fp32 gradient per iteration), 3 sites × 1 rank (more ranks per site would only add CPU contention on 2
   cores; the WAN exchange is the same), ``--warmup`` iterations skipped, then ``--measure`` iterations
   timed at the first site's leader. No evaluation runs during these.

Time to target is then *estimated* per mode and bandwidth as iters_to_target × steady iteration time, and
``tta_speedup_<bw>`` = dense estimate / wanrt estimate. The estimate assumes the big model needs as many
iterations as the small one, in the same ratio; it is printed with the inputs it was computed from.

``--quick`` (CI, under a minute): one set of trainers, 2 sites × 1 rank, the 0.3 M-parameter demo model
for everything, target loss 0.15, one seed; the 1 Gbit/s iteration times come from the
convergence runs themselves (steps after the warm-up, including the evaluating rank's loss computation
every 5 iterations). Its speedups are smaller than the full run's: a small model makes the dense exchange
cheap. Output: a table on stdout, ``--json PATH``.

Gateways are started fresh for every run, and their first payload costs a one-time kernel load (about 2 s
on a loaded 2-core machine) inside the first iterations: that is why ``--warmup`` defaults to 3.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wanrt.demo.config import DEFAULT, QUICK, DemoConfig
from wanrt.demo.results import RunResult
from wanrt.demo.runner import MODES, Demo, Mode

BANDWIDTHS: tuple[tuple[str, float], ...] = (("1gbit", 1e9), ("500mbit", 500e6), ("100mbit", 100e6))
#: --quick's target: past the first, steepest part of the curve, where sparse updates still lag and one
#: run's count says little (the demo's --quick stops at 0.3 to finish sooner)
QUICK_TARGET = 0.15
#: the iterations-to-target runs use the fastest of the links: the count barely depends on it, time does
CONVERGENCE_BANDWIDTH = 1e9


@dataclass(frozen=True)
class Plan:
    convergence: DemoConfig
    timing: DemoConfig
    warmup: int
    measure: int
    #: time the 1 Gbit/s iterations on the convergence runs, with the same trainers (``--quick``)
    shared: bool
    #: the convergence runs are repeated per seed (data split, initial model, batches) and averaged
    seeds: tuple[int, ...]


def make_plan(quick: bool, warmup: int | None, measure: int | None, seeds: int | None) -> Plan:
    w = warmup if warmup is not None else 3
    n_seeds = seeds if seeds is not None else (1 if quick else 2)
    if quick:
        m = measure if measure is not None else 8
        convergence = dataclasses.replace(
            QUICK,
            model_hidden=DEFAULT.model_hidden,
            bandwidth_bps=CONVERGENCE_BANDWIDTH,
            fluctuating=False,
            target_loss=QUICK_TARGET,
        )
        timing_base = convergence
    else:
        m = measure if measure is not None else 5
        convergence = dataclasses.replace(DEFAULT, bandwidth_bps=CONVERGENCE_BANDWIDTH, fluctuating=False)
        timing_base = dataclasses.replace(DEFAULT, ranks=1, model_hidden=3200, fluctuating=False)
    timing = dataclasses.replace(timing_base, eval_every=0, max_iters=w + m + 1, target_loss=1e-6)
    return Plan(convergence, timing, w, m, shared=quick, seeds=tuple(range(n_seeds)))


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Measured:
    #: per seed, each mode trained to the target
    convergence: list[dict[Mode, RunResult]]
    convergence_params: int
    #: seconds per iteration at steady state, per bandwidth label and mode
    times: dict[str, dict[Mode, float]]
    timing_params: int


def _converge(demo: Demo, plan: Plan) -> dict[Mode, RunResult]:
    results: dict[Mode, RunResult] = {}
    for mode in MODES:
        _say(f"convergence: {mode} to loss {plan.convergence.target_loss:g} ...")
        results[mode] = demo.run(mode, label=f"converge-{mode}")
    return results


def _time(demo: Demo, plan: Plan, times: dict[str, dict[Mode, float]]) -> None:
    for label, bps in BANDWIDTHS:
        if label in times:
            continue
        links = dataclasses.replace(plan.timing, bandwidth_bps=bps)
        times[label] = {}
        for mode in MODES:
            _say(f"timing: {mode} at {label} ({plan.warmup} + {plan.measure} iterations) ...")
            r = demo.run(mode, label=f"{label}-{mode}", links=links)
            times[label][mode] = r.steady_iteration_s(warmup=plan.warmup)


def measure(plan: Plan, out: Path) -> Measured:
    times: dict[str, dict[Mode, float]] = {}
    conv: list[dict[Mode, RunResult]] = []
    for seed in plan.seeds:
        cfg = dataclasses.replace(plan.convergence, seed=seed)
        with Demo(cfg, out / f"convergence-seed{seed}", progress=False, on_line=_say) as demo:
            conv.append(_converge(demo, plan))
            conv_params = demo.parameters
            if plan.shared:
                label = next(label for label, bps in BANDWIDTHS if bps == cfg.bandwidth_bps)
                times[label] = {m: conv[0][m].steady_iteration_s(warmup=plan.warmup) for m in MODES}
                _time(demo, plan, times)
                return Measured(conv, conv_params, times, conv_params)
    with Demo(plan.timing, out / "timing", progress=False, on_line=_say) as demo:
        _time(demo, plan, times)
        return Measured(conv, conv_params, times, demo.parameters)


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def report(plan: Plan, measured: Measured, elapsed: float) -> dict[str, Any]:
    conv, times = measured.convergence, measured.times
    conv_params, timing_params = measured.convergence_params, measured.timing_params
    per_seed: dict[Mode, list[int]] = {m: [] for m in MODES}
    for seed, runs in zip(plan.seeds, conv, strict=True):
        for m in MODES:
            its = runs[m].iters_to_target
            if its is None:
                _say(f"warning: {m} (seed {seed}) did not reach the target; counting its iteration cap")
            per_seed[m].append(its if its is not None else runs[m].iterations)
    n: dict[Mode, float] = {m: sum(v) / len(v) for m, v in per_seed.items()}
    out: dict[str, Any] = {
        "method": (
            "tta estimated as iters_to_target (small model, measured) x steady iteration time (large model, "
            "measured at each bandwidth)"
        ),
        "iters_to_target_dense": n["dense"],
        "iters_to_target_wanrt": n["wanrt"],
        "iters_to_target_ratio": _ratio(n["wanrt"], n["dense"]),
        "iters_to_target_per_seed": per_seed,
        "convergence": {
            "parameters": conv_params,
            "target_loss": plan.convergence.target_loss,
            "bandwidth_bps": plan.convergence.bandwidth_bps,
            "sites": plan.convergence.sites,
            "ranks": plan.convergence.ranks,
            "seeds": list(plan.seeds),
            "measured_tta_s": {m: [r[m].tta_s for r in conv] for m in MODES},
            "final_loss": {m: [r[m].final_loss for r in conv] for m in MODES},
            "final_accuracy": {m: [r[m].final_accuracy for r in conv] for m in MODES},
        },
        "timing": {
            "parameters": timing_params,
            "sites": plan.timing.sites,
            "ranks": plan.timing.ranks,
            "rtt_s": plan.timing.rtt_s,
            "density": plan.timing.density,
            "warmup": plan.warmup,
            "measured_iterations": plan.measure,
            "one_gbit_from_convergence_runs": plan.shared,
        },
        "elapsed_s": elapsed,
    }
    rows = []
    for label, bps in BANDWIDTHS:
        d, w = times[label]["dense"], times[label]["wanrt"]
        tta_d, tta_w = n["dense"] * d, n["wanrt"] * w
        out[f"iter_s_dense_{label}"] = d
        out[f"iter_s_wanrt_{label}"] = w
        out[f"iter_speedup_{label}"] = _ratio(d, w)
        out[f"tta_est_s_dense_{label}"] = tta_d
        out[f"tta_est_s_wanrt_{label}"] = tta_w
        out[f"tta_speedup_{label}"] = _ratio(tta_d, tta_w)
        rows.append(
            (
                f"{bps / 1e6:g} Mbit/s",
                f"{d:.3f}",
                f"{w:.3f}",
                f"{d / w:.2f}×",
                f"{tta_d:.0f}",
                f"{tta_w:.0f}",
                f"{tta_d / tta_w:.2f}×",
            )
        )
    print(_table(rows))
    c, t = plan.convergence, plan.timing
    print(
        f"\niterations to target loss {c.target_loss:g} ({conv_params / 1e6:.2f} M-parameter demo model, "
        f"{c.sites}×{c.ranks} ranks, {c.bandwidth_bps / 1e9:g} Gbit/s, measured, mean of {len(plan.seeds)} "
        f"seed(s)): dense {n['dense']:g} {per_seed['dense']}, wanrt {n['wanrt']:g} {per_seed['wanrt']}, "
        f"ratio {n['wanrt'] / n['dense']:.2f} (wanrt / dense)"
    )
    print(
        f"iteration times: {timing_params / 1e6:.1f} M-parameter MLP, {t.sites}×{t.ranks} ranks, "
        f"{t.rtt_s * 1e3:g} ms RTT, wanrt density {t.density:g}, mean of {plan.measure} iterations "
        f"after {plan.warmup} warm-up"
    )
    print("TTA estimate = iterations to target × steady iteration time (see the module docstring)")
    return out


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    head = ("link", "dense s/it", "wanrt s/it", "iter speedup", "dense TTA s", "wanrt TTA s", "TTA speedup")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.rjust(widths[i]) for i, c in enumerate(head))]
    lines.append("  ".join("-" * wd for wd in widths))
    lines += ["  ".join(c.rjust(widths[i]) for i, c in enumerate(r)) for r in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="CI size: under a minute")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--out", help="directory for logs and configs (default: a new temp dir)")
    ap.add_argument("--warmup", type=int, help="iterations skipped before timing")
    ap.add_argument("--measure", type=int, help="iterations timed per bandwidth and mode")
    ap.add_argument("--seeds", type=int, help="convergence runs averaged (default 2; 1 with --quick)")
    args = ap.parse_args(argv)
    plan = make_plan(args.quick, args.warmup, args.measure, args.seeds)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="wanrt-bench-e2e-"))
    _say(f"bench_e2e: logs in {out}")
    t0 = time.monotonic()
    data = report(plan, measure(plan, out), time.monotonic() - t0)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
