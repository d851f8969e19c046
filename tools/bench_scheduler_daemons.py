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
   100 Mbit/s (``step_s`` per phase); the scheduler's decisions file gives its estimate at every decide
   tick. The error is |estimate − rate| / rate at the 10th tick ("decision": one call of the policy, as in
   the simulated key, where a decision is one round) after each step, the worse of the two steps. Beside
   it: the error at the 10th *estimator update* after each step (an update: a tick at which the estimate
   moved — by the idle rule once a plan is in force, or by a link-rate lift or a lowering at any tick),
   and at the end of each phase. The rate is the stepped link's;
   the estimate is the job's one "WAN bandwidth" (Eq. 6's B), whose bottleneck that link is. Measured on
   the timing model below (its payloads, not the 40 ms round trips, fill the link).
3. **Communication overhead** (``comm_overhead_ratio_100mbit``, target ≤ 1.15): the steady iteration time
   of wanrt with the scheduler on 100 Mbit/s, 40 ms RTT links (no fluctuation) over the same trainers'
   compute-only iteration time at the same per-site batch sizes (the demo's ``local`` mode: each trainer on
   its own gradient with torch.optim, no wanrt, no gateways). The model is tools/bench_e2e.py's timing
   model: an MLP of 10.5 M parameters (hidden 3200), 3 sites × 1 rank. The fixed-density arm (0.02) is
   measured beside it (``comm_overhead_ratio_fixed_100mbit``). Every run stops after a fixed wall time, and
   steady = seconds per iteration at the first site's leader over the run's later part (the adaptive and
   fixed arms: the second half; compute-only: the last two thirds). A fixed time rather than a fixed
   iteration count because compute-only sites do not wait for each other: with iteration counts, a site
   with a small batch finishes first and leaves the cores to the others, which then look faster than they
   are while all of them share the machine.

For 2 and 3 the controller's density warm-up is off: it would hold the density at 0.25 (20 MB per
iteration on this model, seconds per iteration at 100 Mbit/s) for its 200 iterations, and both measure
the steady state the controller reaches, not the warm-up (the simulated bandwidth benchmark likewise steps
the link only after its warm-up ended).

``--quick`` (with ``--daemons``) runs a reduced form: the demo's ``--quick`` comparison for one seed, and
2 and 3 on the same trainers with shorter phases (12 s per step phase, 12 s / 6 s overhead runs): fewer
decisions after each step and a shorter steady state, the same quantities.
"""

from __future__ import annotations

import dataclasses
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
from wanrt.protocol.job_settings import per_site

#: estimator updates after a step at which the error is read (the simulated key reads the same)
UPDATES_AFTER_STEP = 10
HIGH_BPS, LOW_BPS = 100e6, 30e6
#: the warm-up is off for the link measurements (see the module docstring)
NO_WARMUP = {"warmup_iterations": 0}
#: the step run's prior (``bw_initial_bps``), above both rates: with the prior at the high rate the idle
#: rule's raises stop at it, and a return to 100 Mbit/s read 100 whether or not it was measured (issue 25)
STEP_PRIOR_BPS = 200e6


@dataclass(frozen=True)
class DaemonPlan:
    tta: DemoConfig
    seeds: tuple[int, ...]
    #: trainers of the link measurements (model, sites, ranks); each run changes only its links
    link: DemoConfig
    #: seconds per phase of the step trace
    step_s: float
    #: seconds of training of each overhead run: with wanrt, and compute-only
    overhead_s: float
    local_s: float


def make_plan(quick: bool, seeds: int | None = None) -> DaemonPlan:
    base = dataclasses.replace(DEFAULT, fluctuating=False, eval_every=0, target_loss=1e-6, max_iters=100_000)
    # the same trainers in both forms, only shorter phases in the quick one: with a smaller model the
    # messages (~30 kB at hidden 1024) fit in the links' burst and no delivery sample is taken, so the
    # quick form would measure the idle rule alone, a different quantity
    link = dataclasses.replace(base, ranks=1, model_hidden=3200)
    if quick:
        return DaemonPlan(QUICK, tuple(range(seeds or 1)), link, step_s=12.0, overhead_s=12.0, local_s=6.0)
    return DaemonPlan(DEFAULT, tuple(range(seeds or 2)), link, step_s=30.0, overhead_s=40.0, local_s=20.0)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


# -- 1: time to target ----------------------------------------------------------------------------------


def measure_tta(plan: DaemonPlan, out: Path) -> dict[str, Any]:
    runs: list[dict[Mode, RunResult]] = []
    #: the convergence model the adaptive arm's scheduler had: Demo.run resolves it as `wanrt demo` does
    #: (the config's file, its own-workload profile with ``auto_profile``, else the analytic stand-in)
    profiles: list[dict[str, Any]] = []
    for seed in plan.seeds:
        cfg = dataclasses.replace(plan.tta, seed=seed)
        with Demo(cfg, out / f"tta-seed{seed}", progress=False, on_line=_say) as demo:
            runs.append({mode: demo.run(mode) for mode in ARMS})
            made = demo.profile
            profiles.append(
                {"kind": "stand-in" if cfg.profile is None else "file", "path": cfg.profile}
                if made is None
                else {
                    "kind": "own workload",
                    "path": str(made.path),
                    "seconds": made.seconds,
                    "cached": made.cached,
                }
            )
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
        "tta_convergence_profile": profiles,
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


def _steady_s(r: RunResult, t_from: float) -> float:
    """Seconds per iteration at the first site's leader over the steps that ended after ``t_from``."""
    steps = [(i, t) for i, t in r.step_times if t >= t_from]
    if len(steps) < 2:
        raise ValueError(f"{r.mode}: fewer than 2 steps after {t_from:.1f} s")
    (i0, t0), (i1, t1) = steps[0], steps[-1]
    return (t1 - t0) / (i1 - i0)


def _error(r: RunResult, d: Any) -> float:
    rate = _rate_at(r.link_trace, d.t)
    return float(abs(d.bandwidth_estimate_bps - rate) / rate)


def estimate_errors(r: RunResult, after: int = UPDATES_AFTER_STEP) -> dict[str, Any]:
    """Per step of ``r.link_trace``: the estimate's relative error at the ``after``-th decide tick and at
    the ``after``-th estimator update after it, and at the end of the phase."""
    trace = r.link_trace
    steps = [t for (t, bps), (_, before) in zip(trace[1:], trace, strict=False) if bps != before]
    ticks = [d for d in r.decisions if d.bandwidth_estimate_bps is not None and d.kind == "tick"]
    out: list[dict[str, Any]] = []
    for i, ts in enumerate(steps):
        end = steps[i + 1] if i + 1 < len(steps) else r.train_s
        phase = [d for d in ticks if ts < d.t <= end]
        updates = [d for d in phase if d.bandwidth_step is not None]
        at_tick = phase[after - 1] if len(phase) >= after else None
        at_update = updates[after - 1] if len(updates) >= after else None
        last = phase[-1] if phase else None
        out.append(
            {
                "step_at_s": ts,
                "to_bps": _rate_at(trace, ts),
                "ticks": len(phase),
                "updates": len(updates),
                "error_at_tick": None if at_tick is None else _error(r, at_tick),
                "estimate_at_tick_bps": None if at_tick is None else at_tick.bandwidth_estimate_bps,
                "seconds_to_tick": None if at_tick is None else at_tick.t - ts,
                "error_at_update": None if at_update is None else _error(r, at_update),
                "seconds_to_update": None if at_update is None else at_update.t - ts,
                "error_at_phase_end": None if last is None else _error(r, last),
                "estimate_at_phase_end_bps": None if last is None else last.bandwidth_estimate_bps,
            }
        )
    return {"steps": out}


def measure_link(plan: DaemonPlan, out: Path) -> dict[str, Any]:
    res: dict[str, Any] = {}
    with Demo(plan.link, out / "link", progress=False, on_line=_say) as demo:
        res["link_parameters"] = demo.parameters
        # 3: overhead at 100 Mbit/s, 40 ms RTT, no fluctuation; each run stops after a fixed time
        arm = dataclasses.replace(plan.link, bandwidth_bps=HIGH_BPS, max_train_s=plan.overhead_s)
        local = dataclasses.replace(arm, max_train_s=plan.local_s)
        adaptive = demo.run("adaptive", label="overhead-adaptive", links=arm, scheduler_control=NO_WARMUP)
        fixed = demo.run("wanrt", label="overhead-fixed", links=arm)
        batches = dict(adaptive.final_batch)
        local_adaptive = demo.run("local", label="overhead-local-adaptive-batch", links=local, batch=batches)
        local_fixed = demo.run("local", label="overhead-local", links=local)
        t = {
            "adaptive": _steady_s(adaptive, plan.overhead_s / 2),
            "fixed": _steady_s(fixed, plan.overhead_s / 2),
            "local_adaptive_batch": _steady_s(local_adaptive, plan.local_s / 3),
            "local": _steady_s(local_fixed, plan.local_s / 3),
        }
        res["comm_overhead_ratio_100mbit"] = _ratio(t["adaptive"], t["local_adaptive_batch"])
        res["comm_overhead_ratio_fixed_100mbit"] = _ratio(t["fixed"], t["local"])
        res["overhead_iteration_s"] = t
        res["overhead_final_settings_adaptive"] = adaptive.final_settings
        res["overhead_decisions_committed"] = len(adaptive.commits)
        res["overhead_iterations"] = {
            "adaptive": adaptive.iterations,
            "fixed": fixed.iterations,
            "local_adaptive_batch": local_adaptive.iterations,
            "local": local_fixed.iterations,
        }
        # 2: the step trace on the last site's links
        stepped = run_step(demo, plan)
    res.update(step_part(stepped))
    res["link_config"] = {
        "sites": plan.link.sites,
        "ranks": plan.link.ranks,
        "model_hidden": plan.link.model_hidden,
        "rtt_s": plan.link.rtt_s,
        "step_s": plan.step_s,
        "overhead_s": plan.overhead_s,
        "local_s": plan.local_s,
    }
    return res


def run_step(demo: Demo, plan: DaemonPlan) -> RunResult:
    """The step trace 100 → 30 → 100 Mbit/s on the last site's links (measurement 2)."""
    trace = step_trace(plan.step_s)
    step_links = dataclasses.replace(plan.link, bandwidth_bps=HIGH_BPS, max_train_s=3 * plan.step_s)
    control = {**NO_WARMUP, "bw_initial_bps": STEP_PRIOR_BPS}
    return demo.run("adaptive", label="bw-step", links=step_links, trace=trace, scheduler_control=control)


def step_part(stepped: RunResult) -> dict[str, Any]:
    """``bw_estimate_error`` and what explains it, from the step run's decisions."""
    res: dict[str, Any] = {}
    errs = estimate_errors(stepped)["steps"]

    def worst(key: str) -> float | None:
        vals = [s[key] for s in errs]
        return None if not vals or any(v is None for v in vals) else max(vals)

    res["bw_estimate_error"] = worst("error_at_tick")
    res["bw_estimate_error_at_10_updates"] = worst("error_at_update")
    res["bw_estimate_error_at_phase_end"] = worst("error_at_phase_end")
    res["bw_estimate_error_steps"] = errs
    res["bw_estimate_trace"] = [
        [d.t, d.bandwidth_estimate_bps, d.bandwidth_step]
        for d in stepped.decisions
        if d.kind == "tick" and d.bandwidth_estimate_bps is not None
    ]
    res["bw_link_trace"] = [list(p) for p in stepped.link_trace]
    res["bw_step_iterations"] = stepped.iterations
    return res


def measure_step(plan: DaemonPlan, out: Path) -> dict[str, Any]:
    """Measurement 2 alone (``bench_scheduler.py --only bw``): the same step run on the same trainers."""
    _say(f"bench_scheduler --daemons --only bw: logs in {out}")
    with Demo(plan.link, out / "link", progress=False, on_line=_say) as demo:
        parameters = demo.parameters
        stepped = run_step(demo, plan)
    return {"link_parameters": parameters, **step_part(stepped)}


def measure(plan: DaemonPlan, out: Path) -> dict[str, Any]:
    _say(f"bench_scheduler --daemons: logs in {out}")
    return {**measure_tta(plan, out), **measure_link(plan, out)}


def _settings(st: dict[str, Any]) -> str:
    batches = " ".join(f"{site} {v}" for site, v in sorted(per_site(st, "batch_size").items()))
    return f"at the end: density {st.get('density', 0):.3g}, batch / rank {batches or st.get('batch')}"


def rows(res: dict[str, Any]) -> list[tuple[str, str, str]]:
    def f(v: float | None, fmt: str = ".3f") -> str:
        return "n/a" if v is None else format(v, fmt)

    t = res["overhead_iteration_s"]
    out: list[tuple[str, str, str]] = [
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
    ]
    out += step_rows(res)
    out += [
        ("comm_overhead_ratio_100mbit", f(res["comm_overhead_ratio_100mbit"]), "≤ 1.15 (adaptive / compute)"),
        (
            "  s/it adaptive / compute-only",
            f"{f(t['adaptive'])} / {f(t['local_adaptive_batch'])}",
            _settings(res["overhead_final_settings_adaptive"]),
        ),
        ("comm_overhead_ratio_fixed_100mbit", f(res["comm_overhead_ratio_fixed_100mbit"]), "density 0.02"),
        ("  s/it fixed / compute-only", f"{f(t['fixed'])} / {f(t['local'])}", ""),
    ]
    return out


def step_rows(res: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The table rows of measurement 2 (also printed alone by ``--only bw``)."""

    def f(v: float | None, fmt: str = ".3f") -> str:
        return "n/a" if v is None else format(v, fmt)

    out: list[tuple[str, str, str]] = [
        (
            "bw_estimate_error",
            f(res["bw_estimate_error"]),
            "≤ 0.20 at the 10th decision (decide tick) after each step",
        ),
        (
            "  at the 10th estimator update / phase end",
            f"{f(res['bw_estimate_error_at_10_updates'])} / {f(res['bw_estimate_error_at_phase_end'])}",
            "worse of the two steps",
        ),
    ]
    for s in res["bw_estimate_error_steps"]:
        est = s["estimate_at_tick_bps"]
        out.append(
            (
                f"  step to {s['to_bps'] / 1e6:g} Mbit/s at {s['step_at_s']:.1f} s",
                f"{f(s['error_at_tick'])} / {f(s['error_at_update'])} / {f(s['error_at_phase_end'])}",
                f"estimate {f(None if est is None else est / 1e6, '.1f')} Mbit/s at +10 ticks; "
                f"{s['updates']} updates in {s['ticks']} ticks",
            )
        )
    return out
