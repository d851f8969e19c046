"""The real-daemon part of ``tools/bench_scheduler.py``: the scheduler daemon, gateways and gloo trainers.

Everything runs through the demo's machinery (:class:`wanrt.demo.Demo`: ``wanrt scheduler`` and ``wanrt
gateway`` subprocesses, shaped unix-socket links, spawned trainer processes), so what is measured is what
``wanrt demo`` shows. Three measurements, each computed in this run:

1. **Time to target, adaptive vs fixed** (``adaptive_vs_fixed_tta``, target ≥ 1.2): the demo's comparison
   (its default configuration: 3 sites × 2 ranks, 100 Mbit/s, 40 ms RTT, the last site on the fluctuating
   trace) — dense, wanrt at fixed density 0.02 and wanrt with the scheduler — for each seed; the ratio is
   the fixed arm's mean time-to-target over the adaptive arm's. ``iters_to_target_ratio`` (target ≤ 1.25)
   = the adaptive arm's mean iterations to target over dense's.
2. **Bandwidth estimate** (``bw_estimate_error``): the last site's links follow a step trace 100 → 30 →
   100 Mbit/s (``step_s`` per phase); the scheduler's decisions file gives its estimate after every
   estimator update; the error is |estimate − rate| / rate at the 10th update after each step (the worse of
   the two steps), with the worst and median error from then until the next step beside it. The rate is
   the stepped link's; the estimate is the job's one "WAN bandwidth" (Eq. 6's B), whose bottleneck that
   link is. Measured on the timing model below (its payloads, not the 40 ms round trips, fill the link).
3. **Communication overhead** (``comm_overhead_ratio_100mbit``, target ≤ 1.15): the steady iteration time
   of wanrt with the scheduler on 100 Mbit/s, 40 ms RTT links (no fluctuation) over the same trainers'
   compute-only iteration time at the same per-site batch sizes (the demo's ``local`` mode: each trainer on
   its own gradient with torch.optim, no wanrt, no gateways). The model is tools/bench_e2e.py's timing
   model: an MLP of 10.5 M parameters (hidden 3200), 3 sites × 1 rank. The fixed-density arm (0.02) is
   measured beside it (``comm_overhead_ratio_fixed_100mbit``). Steady = the mean seconds per iteration at
   the first site's leader over the last ``steady`` iterations of the run.

For 2 and 3 the controller's density warm-up is off: it would hold the density at 0.25 (20 MB per
iteration on this model, seconds per iteration at 100 Mbit/s) for its 200 iterations, and both measure
the steady state the controller reaches, not the warm-up (the simulated bandwidth benchmark likewise steps
the link only after its warm-up ended).

``--quick`` (with ``--daemons``) runs a reduced form: the demo's ``--quick`` comparison for one seed, and
2 and 3 on 2 sites × 1 rank with a 1.1 M-parameter MLP (hidden 1024) and shorter phases.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transports.traces import BandwidthTrace
from wanrt.demo.config import DEFAULT, QUICK, DemoConfig
from wanrt.demo.results import RunResult
from wanrt.demo.runner import ARMS, Demo, Mode

#: estimator updates after a step at which the error is read (the simulated key reads the same)
UPDATES_AFTER_STEP = 10
HIGH_BPS, LOW_BPS = 100e6, 30e6
#: the warm-up is off for the link measurements (see the module docstring)
NO_WARMUP = {"warmup_iterations": 0}


@dataclass(frozen=True)
class DaemonPlan:
    tta: DemoConfig
    seeds: tuple[int, ...]
    #: trainers of the link measurements (model, sites, ranks); each run changes only its links
    link: DemoConfig
    #: seconds per phase of the step trace
    step_s: float
    #: iterations of each overhead run, and how many of the last are averaged
    overhead_iters: int
    steady: int


def make_plan(quick: bool, seeds: int | None = None) -> DaemonPlan:
    base = dataclasses.replace(DEFAULT, fluctuating=False, eval_every=0, target_loss=1e-6, max_iters=100_000)
    if quick:
        link = dataclasses.replace(base, sites=2, ranks=1, model_hidden=1024)
        return DaemonPlan(QUICK, tuple(range(seeds or 1)), link, step_s=12.0, overhead_iters=60, steady=25)
    link = dataclasses.replace(base, ranks=1, model_hidden=3200)
    return DaemonPlan(DEFAULT, tuple(range(seeds or 2)), link, step_s=20.0, overhead_iters=80, steady=30)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


# -- 1: time to target ----------------------------------------------------------------------------------


def measure_tta(plan: DaemonPlan, out: Path) -> dict[str, Any]:
    runs: list[dict[Mode, RunResult]] = []
    for seed in plan.seeds:
        cfg = dataclasses.replace(plan.tta, seed=seed)
        with Demo(cfg, out / f"tta-seed{seed}", progress=False, on_line=_say) as demo:
            runs.append({mode: demo.run(mode) for mode in ARMS})
    tta: dict[str, list[float | None]] = {m: [r[m].tta_s for r in runs] for m in ARMS}
    its: dict[str, list[int | None]] = {m: [r[m].iters_to_target for r in runs] for m in ARMS}

    def mean_or_none(xs: Sequence[float | int | None]) -> float | None:
        return None if any(x is None for x in xs) else _mean([float(x) for x in xs if x is not None])

    mt = {m: mean_or_none(tta[m]) for m in ARMS}
    mi = {m: mean_or_none(its[m]) for m in ARMS}
    per_seed = [_ratio(f, a) for f, a in zip(tta["wanrt"], tta["adaptive"], strict=True)]
    return {
        "adaptive_vs_fixed_tta": _ratio(mt["wanrt"], mt["adaptive"]),
        "adaptive_vs_fixed_tta_per_seed": per_seed,
        "iters_to_target_ratio": _ratio(mi["adaptive"], mi["dense"]),
        "iters_to_target_ratio_fixed": _ratio(mi["wanrt"], mi["dense"]),
        "adaptive_vs_dense_tta": _ratio(mt["dense"], mt["adaptive"]),
        "tta_s": tta,
        "iters_to_target": its,
        "bytes_sent": {m: [r[m].wan_bytes_sent for r in runs] for m in ARMS},
        "final_settings_adaptive": [r["adaptive"].final_settings for r in runs],
        "decisions_committed": [len(r["adaptive"].commits) for r in runs],
        "tta_seeds": list(plan.seeds),
        "tta_config": {
            "sites": plan.tta.sites,
            "ranks": plan.tta.ranks,
            "target_loss": plan.tta.target_loss,
            "density_fixed": plan.tta.density,
        },
    }


# -- 2: the bandwidth estimate after a step ---------------------------------------------------------------


def step_trace(step_s: float) -> BandwidthTrace:
    return BandwidthTrace.from_pairs([(0.0, HIGH_BPS), (step_s, LOW_BPS), (2 * step_s, HIGH_BPS)])


def _rate_at(trace: Sequence[tuple[float, float]], t: float) -> float:
    rate = trace[0][1]
    for at, bps in trace:
        if at <= t:
            rate = bps
    return rate


def estimate_errors(r: RunResult, updates_after: int = UPDATES_AFTER_STEP) -> dict[str, Any]:
    """Per step of ``r.link_trace``: the estimate's relative error at the ``updates_after``-th estimator
    update after it, and the worst / median error from there until the next step."""
    steps = [
        t for (t, bps), (_, before) in zip(r.link_trace[1:], r.link_trace, strict=False) if bps != before
    ]
    updates = [
        d for d in r.decisions if d.bandwidth_step is not None and d.bandwidth_estimate_bps is not None
    ]
    out: list[dict[str, Any]] = []
    for i, ts in enumerate(steps):
        end = steps[i + 1] if i + 1 < len(steps) else r.train_s
        after = [d for d in updates if ts < d.t <= end]
        errs = [
            abs(d.bandwidth_estimate_bps - _rate_at(r.link_trace, d.t)) / _rate_at(r.link_trace, d.t)
            for d in after
            if d.bandwidth_estimate_bps is not None
        ]
        at = errs[updates_after - 1] if len(errs) >= updates_after else None
        tail = errs[updates_after - 1 :]
        out.append(
            {
                "step_at_s": ts,
                "to_bps": _rate_at(r.link_trace, ts),
                "updates": len(after),
                "error_at_update": at,
                "error_max_after": max(tail) if tail else None,
                "error_median_after": statistics.median(tail) if tail else None,
                "estimate_at_update_bps": (
                    after[updates_after - 1].bandwidth_estimate_bps if len(after) >= updates_after else None
                ),
            }
        )
    return {"steps": out}


def measure_link(plan: DaemonPlan, out: Path) -> dict[str, Any]:
    res: dict[str, Any] = {}
    with Demo(plan.link, out / "link", progress=False, on_line=_say) as demo:
        res["link_parameters"] = demo.parameters
        # 3: overhead at 100 Mbit/s, 40 ms RTT, no fluctuation
        links = dataclasses.replace(plan.link, bandwidth_bps=HIGH_BPS, max_iters=plan.overhead_iters)
        adaptive = demo.run("adaptive", label="overhead-adaptive", links=links, scheduler_control=NO_WARMUP)
        fixed = demo.run("wanrt", label="overhead-fixed", links=links)
        batches = dict(adaptive.final_batch)
        local_adaptive = demo.run("local", label="overhead-local-adaptive-batch", links=links, batch=batches)
        local_fixed = demo.run("local", label="overhead-local", links=links)
        warm = plan.overhead_iters - plan.steady
        t = {
            "adaptive": adaptive.steady_iteration_s(warmup=warm),
            "fixed": fixed.steady_iteration_s(warmup=warm),
            "local_adaptive_batch": local_adaptive.steady_iteration_s(warmup=warm),
            "local": local_fixed.steady_iteration_s(warmup=warm),
        }
        res["comm_overhead_ratio_100mbit"] = _ratio(t["adaptive"], t["local_adaptive_batch"])
        res["comm_overhead_ratio_fixed_100mbit"] = _ratio(t["fixed"], t["local"])
        res["overhead_iteration_s"] = t
        res["overhead_final_settings_adaptive"] = adaptive.final_settings
        res["overhead_decisions_committed"] = len(adaptive.commits)
        res["overhead_samples_per_s"] = {
            "adaptive": adaptive.samples_per_s,
            "fixed": fixed.samples_per_s,
            "local_adaptive_batch": local_adaptive.samples_per_s,
            "local": local_fixed.samples_per_s,
        }
        # 2: the step trace on the last site's links
        trace = step_trace(plan.step_s)
        step_links = dataclasses.replace(plan.link, bandwidth_bps=HIGH_BPS, max_train_s=3 * plan.step_s)
        stepped = demo.run(
            "adaptive", label="bw-step", links=step_links, trace=trace, scheduler_control=NO_WARMUP
        )
    errs = estimate_errors(stepped)
    at = [s["error_at_update"] for s in errs["steps"]]
    res["bw_estimate_error"] = None if not at or any(e is None for e in at) else max(at)
    res["bw_estimate_error_steps"] = errs["steps"]
    res["bw_estimate_error_window_max"] = max(
        (s["error_max_after"] for s in errs["steps"] if s["error_max_after"] is not None), default=None
    )
    res["bw_estimate_trace"] = [
        [d.t, d.bandwidth_estimate_bps] for d in stepped.decisions if d.bandwidth_step is not None
    ]
    res["bw_link_trace"] = [list(p) for p in stepped.link_trace]
    res["link_config"] = {
        "sites": plan.link.sites,
        "ranks": plan.link.ranks,
        "model_hidden": plan.link.model_hidden,
        "rtt_s": plan.link.rtt_s,
        "step_s": plan.step_s,
        "overhead_iters": plan.overhead_iters,
        "steady_iters": plan.steady,
    }
    return res


def measure(plan: DaemonPlan, out: Path) -> dict[str, Any]:
    _say(f"bench_scheduler --daemons: logs in {out}")
    return {**measure_tta(plan, out), **measure_link(plan, out)}


def rows(res: dict[str, Any]) -> list[tuple[str, str, str]]:
    def f(v: float | None, fmt: str = ".3f") -> str:
        return "n/a" if v is None else format(v, fmt)

    t = res["overhead_iteration_s"]
    out = [
        ("adaptive_vs_fixed_tta", f(res["adaptive_vs_fixed_tta"]), "≥ 1.2 (fixed TTA / adaptive TTA)"),
        (
            "  per seed; TTA s dense / fixed / adaptive",
            " ".join(f(x, ".2f") for x in res["adaptive_vs_fixed_tta_per_seed"]),
            "; ".join(
                " / ".join(f(res["tta_s"][m][i], ".1f") for m in ARMS) for i in range(len(res["tta_seeds"]))
            ),
        ),
        ("iters_to_target_ratio", f(res["iters_to_target_ratio"]), "≤ 1.25 (adaptive / dense)"),
        ("  fixed arm / dense", f(res["iters_to_target_ratio_fixed"]), ""),
        ("bw_estimate_error", f(res["bw_estimate_error"]), "at the 10th estimator update after each step"),
    ]
    for s in res["bw_estimate_error_steps"]:
        out.append(
            (
                f"  step to {s['to_bps'] / 1e6:g} Mbit/s at {s['step_at_s']:.1f} s",
                f"{f(s['error_at_update'])} (max {f(s['error_max_after'])}, "
                f"median {f(s['error_median_after'])})",
                f"{s['updates']} updates; estimate "
                f"{f((s['estimate_at_update_bps'] or 0) / 1e6, '.1f')} Mbit/s",
            )
        )
    out += [
        ("comm_overhead_ratio_100mbit", f(res["comm_overhead_ratio_100mbit"]), "≤ 1.15 (adaptive / compute)"),
        (
            "  s/it adaptive / compute-only",
            f"{f(t['adaptive'])} / {f(t['local_adaptive_batch'])}",
            f"settings {res['overhead_final_settings_adaptive']}",
        ),
        ("comm_overhead_ratio_fixed_100mbit", f(res["comm_overhead_ratio_fixed_100mbit"]), "density 0.02"),
        ("  s/it fixed / compute-only", f"{f(t['fixed'])} / {f(t['local'])}", ""),
    ]
    return out
