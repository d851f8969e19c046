"""Benchmark the scheduler's decision objects in simulation (StellaTrain §4, Fig. 14a, Algorithm 1).

Three measurements, each computed in this run:

1. **Fig. 14a batch ratio.** The configuration search (Eq. 1–6) for ViT-B/16 (88 M parameters, §5) on two
   RTX 4090 and two RTX 2080 Ti with Table 2's (α, β) = (28, 300) and (20, 99): the total batch chosen at
   100 Mbit/s over the one chosen at 1 Gbit/s (paper: 240 / 137 = 1.75), and r at several bandwidths (it
   must rise as bandwidth falls). The paper's ViT ḡ is not published, so ḡ is the documented stand-in
   :class:`~scheduler.control.convergence.PowerLawConvergence` (its defaults, fixed before this benchmark
   existed); the ratio is printed for other stand-in exponents too, and with the ḡ that step 2 *measures*
   on the demo model (a different model and dataset: a plausibility check, not the paper's setting).
2. **Profile vs grid.** ``wanrt profile``'s Algorithm 1 (≤ 30 probes of the real probe: the demo MLP, real
   compressor + error feedback, staleness 1) against a grid of the same probe: the probe's measure at the
   profile's chosen best grid point (the argmin of ḡ over the grid) over the grid's best, minus one
   (``profile_vs_grid``: a gap in 1 + g, the factor Eq. 5 multiplies TTA by). Every probe measures the
   samples until the training loss reaches the target (``profile_measure``), so the gap is the extra
   samples to accuracy of the profile's choice; also as a relative gap in
   g, for the best probed point, and per r (each grid r's best batch by the profile vs by the grid). The
   grid is coarse (7–10 r × 6–8 Σx): a dense grid of real probes does not fit the time budget.
3. **Bandwidth estimate.** The policy in the toy closed loop (``sims.policies.toy_sim``: iteration time
   = max(compute, bytes / rate), idle = 1 − compute / iteration) through 100 → 30 → 100 Mbit/s; the worst
   relative error of the estimate from the 10th decision after each step until the next step.
4. **Real daemons** (``--daemons``, :mod:`bench_scheduler_daemons`): ``adaptive_vs_fixed_tta``,
   ``iters_to_target_ratio``, ``bw_estimate_error`` and ``comm_overhead_ratio_100mbit`` with ``wanrt
   scheduler``, ``wanrt gateway`` and gloo trainers through the demo's machinery.

Usage: ``python tools/bench_scheduler.py [--quick] [--json PATH] [--daemons | --no-daemons] [--only bw]``
(``--only bw``: the real-daemon step run alone, ``bw_estimate_error``). The full
run includes the real-daemon part (about 15 minutes in all on two shared cores). ``--quick`` (under a
minute) leaves it out: the real-daemon keys are then listed under ``not_measured``; ``--quick --daemons``
adds its reduced form (one seed of ``wanrt demo --quick``, a smaller model, shorter phases: about three
more minutes).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import numpy as np

# this checkout's packages, not an installed copy (the tool is run as a script: sys.path[0] is tools/)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.control.config import SchedulerConfig
from scheduler.control.convergence import ConvergenceModel, PowerLawConvergence
from scheduler.control.policy import SchedulerPolicy
from scheduler.control.search import Plan, search
from scheduler.control.throughput import ThroughputFit
from scheduler.profile.bayesopt import run_profile
from scheduler.profile.config import QUICK, ProfileConfig
from scheduler.profile.surrogate import ConvergenceProfile
from sims.policies.toy_sim import run_toy_loop
from wanrt.demo.digits_probe import DigitsProbe

VIT_PARAMS = 88_000_000
TABLE2_VIT = {"RTX 4090": (28.0, 300.0), "RTX 2080 Ti": (20.0, 99.0)}
GPUS = [TABLE2_VIT["RTX 4090"]] * 2 + [TABLE2_VIT["RTX 2080 Ti"]] * 2
BANDWIDTHS = (50e6, 100e6, 200e6, 500e6, 1e9, 2e9)
#: what the profile-vs-grid probes return (see main)
PROFILE_MEASURE: Final = "samples_to_target"

#: keys that need the real daemons (gateways + scheduler service): measured by the --daemons part
NEEDS_DAEMONS = (
    "adaptive_vs_fixed_tta",
    "iters_to_target_ratio",
    "bw_estimate_error",
    "comm_overhead_ratio_100mbit",
)


def _plan(conv: ConvergenceModel, bw: float) -> Plan:
    fits = [ThroughputFit(a, b, True, 1) for a, b in GPUS]
    return search(fits, bandwidth_bps=bw, n_params=VIT_PARAMS, convergence=conv, config=SchedulerConfig())


def saturation_knee(gpus: list[tuple[float, float]]) -> float:
    """Σx at which the split ∝ β saturates every GPU: Σβ · max_i α_i/β_i. Below it Eq. 2 holds the
    slowest-saturating GPU at its floor α/β, so the iteration time (Eq. 4's pace) stops falling while Σx
    does: with ḡ's batch term flatter than that speed loss no search goes below it (docs/scheduler.md)."""
    return sum(b for _, b in gpus) * max(a / b for a, b in gpus)


def fig14a(conv: ConvergenceModel) -> dict[str, Any]:
    plans = {bw: _plan(conv, bw) for bw in BANDWIDTHS}
    rs = [plans[bw].r for bw in BANDWIDTHS]
    return {
        "ratio": plans[100e6].total_batch / plans[1e9].total_batch,
        "plans": plans,
        "r_monotone": int(all(a >= b - 1e-12 for a, b in itertools.pairwise(rs))),
    }


def profile_vs_grid(cfg: ProfileConfig, r_grid: list[float], x_grid: list[int]) -> dict[str, Any]:
    probe = DigitsProbe(cfg.probe)
    t0 = time.perf_counter()
    run = run_profile(probe.loss, cfg, describe=probe.describe())
    t_bo = time.perf_counter() - t0
    bo_runs = probe.runs
    t0 = time.perf_counter()
    loss = np.array([[probe.loss(r, x, 1) for x in x_grid] for r in r_grid])
    t_grid = time.perf_counter() - t0
    rr, xx = np.meshgrid(np.array(r_grid), np.array(x_grid, dtype=float), indexing="ij")
    pred = run.profile.penalty(rr, xx)
    chosen = np.unravel_index(int(np.argmin(pred)), pred.shape)
    best = np.unravel_index(int(np.argmin(loss)), loss.shape)
    per_r = [float(loss[i, int(np.argmin(pred[i]))] / loss[i].min() - 1.0) for i in range(len(r_grid))]
    base = run.profile.baseline_loss
    probed = min((rec for rec in run.records if rec.kind in ("random", "ei")), key=lambda rec: rec.loss)
    g_chosen, g_best = loss[chosen] / base - 1.0, loss[best] / base - 1.0
    return {
        "profile": run.profile,
        "probes": run.probes,
        "probe_runs_bo": bo_runs,
        "probe_runs_grid": len(r_grid) * len(x_grid),
        "gap": float(loss[chosen] / loss[best] - 1.0),
        "gap_in_g": float((g_chosen - g_best) / abs(g_best)),
        "gap_incumbent": float(probed.loss / loss[best] - 1.0),
        "incumbent": (probed.r, probed.total_batch),
        "losses": (float(loss[chosen]), float(loss[best]), base),
        "gap_per_r_max": max(per_r),
        "gap_per_r_mean": float(np.mean(per_r)),
        "chosen": (r_grid[chosen[0]], x_grid[chosen[1]]),
        "grid_best": (r_grid[best[0]], x_grid[best[1]]),
        "seconds_bo": t_bo,
        "seconds_grid": t_grid,
    }


def bandwidth_sim(
    seed: int,
    *,
    link_telemetry: bool = True,
    iterations_per_round: int = 5,
    effect_delay: int = 0,
    latency_s: float = 0.0,
    link_backlog: bool = False,
) -> dict[str, Any]:
    """The toy loop through 100 → 30 → 100 Mbit/s, each phase 30 rounds after the 200-iteration warm-up
    (with one iteration per round: 60 rounds, since the decision reaches the ranks later)."""
    cfg = SchedulerConfig()  # warm-up on: 200 iterations
    pol = SchedulerPolicy(
        cfg, PowerLawConvergence(), n_params=VIT_PARAMS, ranks=range(len(GPUS)), initial_density=0.25
    )
    warm = -(-cfg.warmup_iterations // iterations_per_round) + 20
    phase = 30 if iterations_per_round > 1 else 60
    steps = (warm, warm + phase)
    rate = lambda k: 30e6 if steps[0] <= k < steps[1] else 100e6  # noqa: E731
    trace = run_toy_loop(
        pol,
        GPUS,
        rate,
        rounds=warm + 2 * phase,
        iterations_per_round=iterations_per_round,
        noise=0.02,
        seed=seed,
        link_telemetry=link_telemetry,
        effect_delay=effect_delay,
        latency_s=latency_s,
        link_backlog=link_backlog,
    )
    err = trace.relative_errors()
    windows = [err[steps[0] + 10 : steps[1]], err[steps[1] + 10 :]]
    decisions = len({id(d) for d in trace.decisions if d is not None})
    return {
        "error": max(max(w) for w in windows),
        "error_at_10": max(err[s + 10] for s in steps),
        "error_before_steps": max(err[steps[0] - 10 : steps[0]]),
        "decisions": decisions,
        "rounds": len(err),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller probes and grid (< 60 s)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument(
        "--daemons",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the real-daemon part (default: on in the full run, off with --quick)",
    )
    ap.add_argument("--seeds", type=int, help="seeds of the time-to-target comparison (default 2; quick 1)")
    ap.add_argument("--out", type=Path, help="logs of the real-daemon part (default: a new temp dir)")
    ap.add_argument(
        "--only",
        choices=["bw"],
        help="bw: only the real-daemon step run (bw_estimate_error; same trainers, sizes and phases)",
    )
    args = ap.parse_args()
    if args.only == "bw":
        return only_bw(args)
    daemons = (not args.quick) if args.daemons is None else bool(args.daemons)
    t_start = time.perf_counter()
    if args.quick:
        pcfg = QUICK
        r_grid = [0.0, 0.5, 0.9, 0.97, 0.99, 0.997, 0.999]
        x_grid = [8, 16, 32, 64, 128, 256]
    else:
        pcfg = ProfileConfig()
        r_grid = [0.0, 0.5, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999]
        x_grid = [8, 12, 16, 32, 64, 128, 256, 512]
    # what each probe (profile and grid alike) measures: the samples to the target loss, so 1 + ḡ is the
    # factor Eq. 5 multiplies the time to accuracy by (ProbeSettings.measure). Algorithm 1's loss after a
    # fixed budget puts every small-batch probe on a flat floor (final losses 0.04–0.07 against 2.14)
    # where neighbouring points differ by SGD noise, not by a trend: the full grid's comparison measured
    # noise there (0.296 in session 3; per r it was exact)
    pcfg = dataclasses.replace(pcfg, probe=dataclasses.replace(pcfg.probe, measure=PROFILE_MEASURE))

    stand_in = fig14a(PowerLawConvergence())
    sens = {p: fig14a(PowerLawConvergence(density_exponent=p))["ratio"] for p in (0.25, 0.5, 1.0)}
    pg = profile_vs_grid(pcfg, r_grid, x_grid)
    measured = fig14a(pg["profile"])
    bw = bandwidth_sim(seed=3)
    bw_idle = bandwidth_sim(seed=3, link_telemetry=False)  # the paper's idle rule alone, as before
    # daemon-like: a decide tick per iteration, a plan in force 6 iterations after it is decided (the
    # demo's announce margin), 40 ms of acknowledgement round trip in every exchange
    bw_delay = bandwidth_sim(seed=3, iterations_per_round=1, effect_delay=6, latency_s=0.04)
    bw_delay_idle = bandwidth_sim(
        seed=3, iterations_per_round=1, effect_delay=6, latency_s=0.04, link_telemetry=False
    )
    # the same, with the links' delivery rate while backlogged (what the gateways now report)
    bw_delay_delivery = bandwidth_sim(
        seed=3, iterations_per_round=1, effect_delay=6, latency_s=0.04, link_backlog=True
    )
    real: dict[str, Any] | None = None
    if daemons:
        import bench_scheduler_daemons as bd

        out = args.out or Path(tempfile.mkdtemp(prefix="wanrt-bench-scheduler-"))
        real = bd.measure(bd.make_plan(args.quick, args.seeds), out)

    res: dict[str, Any] = {
        "fig14a_batch_ratio": stand_in["ratio"],
        "fig14a_total_batch_1g": stand_in["plans"][1e9].total_batch,
        "fig14a_total_batch_100m": stand_in["plans"][100e6].total_batch,
        "fig14a_r_by_bandwidth_mbps": {f"{bw_ / 1e6:g}": stand_in["plans"][bw_].r for bw_ in BANDWIDTHS},
        "r_monotone": stand_in["r_monotone"],
        "fig14a_saturation_knee": saturation_knee(GPUS),
        "fig14a_batch_ratio_over_knee": stand_in["plans"][100e6].total_batch / saturation_knee(GPUS),
        "fig14a_batch_ratio_by_density_exponent": {f"{p:g}": v for p, v in sens.items()},
        "fig14a_batch_ratio_digits_profile": measured["ratio"],
        "fig14a_r_monotone_digits_profile": measured["r_monotone"],
        "profile_probes": pg["probes"],
        "profile_measure": PROFILE_MEASURE,
        "profile_vs_grid": pg["gap"],
        "profile_vs_grid_g_relative": pg["gap_in_g"],
        "profile_vs_grid_incumbent": pg["gap_incumbent"],
        "profile_vs_grid_per_r_max": pg["gap_per_r_max"],
        "profile_vs_grid_per_r_mean": pg["gap_per_r_mean"],
        "profile_chosen_point": list(pg["chosen"]),
        "profile_chosen_loss": pg["losses"][0],
        "grid_best_loss": pg["losses"][1],
        "baseline_loss": pg["losses"][2],
        "grid_best_point": list(pg["grid_best"]),
        "profile_probe_runs": pg["probe_runs_bo"],
        "grid_probe_runs": pg["probe_runs_grid"],
        "profile_seconds": pg["seconds_bo"],
        "grid_seconds": pg["seconds_grid"],
        "bw_estimate_error_sim": bw["error"],
        "bw_estimate_error_sim_at_10": bw["error_at_10"],
        "bw_estimate_error_sim_idle_only": bw_idle["error"],
        "bw_estimate_error_sim_delayed": bw_delay["error"],
        "bw_estimate_error_sim_delayed_at_10": bw_delay["error_at_10"],
        "bw_estimate_error_sim_delayed_idle_only": bw_delay_idle["error"],
        "bw_estimate_error_sim_delayed_delivery": bw_delay_delivery["error"],
        "bw_estimate_error_sim_delayed_delivery_at_10": bw_delay_delivery["error_at_10"],
        "bw_decisions": bw["decisions"],
        "quick": bool(args.quick),
        "daemons": daemons,
    }
    if real is None:
        res["not_measured"] = {
            k: "needs daemons: run without --quick or with --daemons" for k in NEEDS_DAEMONS
        }
    else:
        res.update(real)
    p1, p100 = stand_in["plans"][1e9], stand_in["plans"][100e6]
    rows = [
        ("fig14a_batch_ratio (stand-in ḡ)", f"{res['fig14a_batch_ratio']:.3f}", "1.45–2.05 (paper 1.75)"),
        ("  Σx at 1 Gbit/s, r", f"{p1.total_batch}, {p1.r:.4f}", "paper 137, 0.97"),
        ("  Σx at 100 Mbit/s, r", f"{p100.total_batch}, {p100.r:.4f}", "paper 240, 0.995"),
        (
            "  saturation knee Σβ·max α/β; Σx(100M) / knee",
            f"{res['fig14a_saturation_knee']:.1f}; {res['fig14a_batch_ratio_over_knee']:.3f}",
            "1 Gbit/s sits at the knee: the ratio's bound",
        ),
        ("  ratio, stand-in exponent 0.25/0.5/1", " / ".join(f"{v:.2f}" for v in sens.values()), ""),
        ("  ratio with the measured digits ḡ", f"{measured['ratio']:.3f}", "(other model: check only)"),
        ("r_monotone", str(res["r_monotone"]), "1"),
        (
            "  r at " + "/".join(f"{b / 1e6:g}" for b in BANDWIDTHS) + " Mbit/s",
            " / ".join(f"{stand_in['plans'][b].r:.4f}" for b in BANDWIDTHS),
            "rises as bandwidth falls",
        ),
        ("profile_probes", str(res["profile_probes"]), "≤ 30"),
        ("profile_vs_grid", f"{res['profile_vs_grid']:.4f}", "≤ 0.10"),
        ("  same, as a relative gap in g (not 1 + g)", f"{pg['gap_in_g']:.4f}", ""),
        (
            "  best probed point instead of ḡ's argmin",
            f"{pg['gap_incumbent']:+.4f}",
            f"at (r, Σx) = ({pg['incumbent'][0]:.4f}, {pg['incumbent'][1]})",
        ),
        ("  per-r best batch: max / mean gap", f"{pg['gap_per_r_max']:.4f} / {pg['gap_per_r_mean']:.4f}", ""),
        ("  profile's point vs grid's best (r, Σx)", f"{pg['chosen']} vs {pg['grid_best']}", ""),
        (
            "  their measures (baseline's): kilo-samples to target",
            "{:.4f} vs {:.4f} ({:.4f})".format(*pg["losses"]),
            "",
        ),
        (
            "  probe runs: profile / grid",
            f"{pg['probe_runs_bo']} / {pg['probe_runs_grid']}",
            f"grid {len(r_grid)} r × {len(x_grid)} Σx (coarse)",
        ),
        (
            "  seconds: profile / grid",
            f"{pg['seconds_bo']:.1f} / {pg['seconds_grid']:.1f}",
            f"ratio {pg['seconds_grid'] / pg['seconds_bo']:.2f}",
        ),
        ("bw_estimate_error_sim", f"{bw['error']:.4f}", "≤ 0.20 (from 10 decisions after each step)"),
        ("  at exactly +10 decisions", f"{bw['error_at_10']:.4f}", ""),
        ("  decisions announced / rounds", f"{bw['decisions']} / {bw['rounds']}", ""),
        ("  idle rule only (no link rates)", f"{bw_idle['error']:.4f}", "the paper's §4.1 loop alone"),
        (
            "  daemon-like: delay 6 it, 40 ms RTT",
            f"{bw_delay['error']:.4f} / {bw_delay['error_at_10']:.4f}",
            f"from / at +10 ticks; idle rule only {bw_delay_idle['error']:.4f}",
        ),
        (
            "  daemon-like, with the delivery rate",
            f"{bw_delay_delivery['error']:.4f} / {bw_delay_delivery['error_at_10']:.4f}",
            "links report bytes / time while backlogged",
        ),
    ]
    if real is None:
        rows += [(k, "needs daemons: not measured (--daemons)", "") for k in NEEDS_DAEMONS]
    else:
        rows += bd.rows(real)
    return _report("bench_scheduler", args, t_start, rows, res)


def only_bw(args: argparse.Namespace) -> int:
    """The real-daemon step run alone: the ~1.5 min part of the ~8 min full ``--daemons`` run that gives
    ``bw_estimate_error``, with the plan (trainers, step phases) the full or quick run would use."""
    import bench_scheduler_daemons as bd

    t_start = time.perf_counter()
    out = args.out or Path(tempfile.mkdtemp(prefix="wanrt-bench-scheduler-"))
    res = bd.measure_step(bd.make_plan(args.quick, args.seeds), out)
    res.update(quick=bool(args.quick), daemons=True, only="bw")
    return _report("bench_scheduler --only bw", args, t_start, bd.step_rows(res), res)


def _report(
    title: str,
    args: argparse.Namespace,
    t_start: float,
    rows: list[tuple[str, str, str]],
    res: dict[str, Any],
) -> int:
    """The table (name, value, target) on stdout and every key as JSON (``--json``)."""
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    mode = "quick" if args.quick else "full"
    print(f"{title} ({mode}, {time.perf_counter() - t_start:.0f} s)")
    for name, value, target in rows:
        print(f"{name:<{w0}}  {value:<{w1}}  {target}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, allow_nan=False, default=_jsonable) + "\n")
    return 0


def _jsonable(v: Any) -> Any:
    if isinstance(v, (np.integer, np.floating)):
        return v.item()
    if isinstance(v, ConvergenceProfile):
        return None
    if dataclasses.is_dataclass(v):
        return dataclasses.asdict(v)  # type: ignore[arg-type]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    raise TypeError(f"not JSON: {type(v).__name__}")


if __name__ == "__main__":
    raise SystemExit(main())
