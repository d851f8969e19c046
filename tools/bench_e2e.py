"""End-to-end benchmark: wanrt against real DDP and against our own dense exchange, on the same shaped links.

Three arms, everything real:

* ``ddp``: plain PyTorch ``DistributedDataParallel`` over one gloo group of every rank of every site (what a
  user gets by running DDP across sites; :mod:`wanrt.demo.ddp_arm`), ``torch.optim`` SGD;
* ``dense``: wanrt's own dense exchange (every element in fp32, synchronous) through the gateway daemons;
* ``wanrt``: wanrt's default sparse mode (density 0.02, error feedback, staleness 1) through the gateways.

The links: each site in its own network namespace, a veth per pair of sites, each direction shaped by the
kernel's ``tbf`` (:mod:`wanrt.demo.netns_sites`: a mesh, like the demo's per-peer links and
``tools/bench_round.py``; ``--bridge``: one shared access link per site instead); the DDP ranks and the
gateways run inside the namespaces, so every arm crosses the very same qdiscs. **No added delay**: this kernel
has no ``netem``, and gloo's traffic cannot be delayed from user space, so all arms compare at the same rate
with sub-millisecond RTT (a WAN's RTT would slow the DDP arm's ring all-reduce further). Needs root; without
namespaces the benchmark says why and stops (``--no-ddp`` runs the old two-arm comparison on the gateways'
user-space shaped links with 40 ms RTT).

Two measurements, because a model large enough that communication dominates (≥ 10 M parameters) cannot be
trained to a target on a 2-core CPU within minutes:

1. **Iterations to target and measured time to target** on the demo's model (MLP 0.3 M parameters, digits,
   3 sites × 2 ranks), every arm trained to loss 0.1 on 100 Mbit/s links, ``--seeds`` seeds (default 2).
   The small model's measured TTA ratio is reported too (``tta_measured_speedup_vs_ddp_small``): with
   1.2 MB of gradient, DDP's exchange is cheap and the ratio is small; it is a real, direct measurement.
2. **Steady-state iteration time** at 1 Gbit/s, 500 Mbit/s and 100 Mbit/s: an MLP of 10.5 M parameters
   (hidden 3200; 42 MB of fp32 gradient per iteration), 3 sites × 1 rank, ``--warmup`` iterations skipped
   (``WARMUP_CHEAP`` = 10 at least for wanrt and compute only: their gateways' start-up, see there),
   the mean of the next ``--measure`` (5) taken at global rank 0 (the first site's leader); wanrt's and the
   compute-only run's sub-second iterations over 20, because they move with the machine's load.

Time to target per arm and bandwidth is then **estimated** as iterations to target (1.) × steady
iteration time (2.), and ``tta_speedup_vs_ddp_<bw>`` = DDP's estimate / wanrt's; ``tta_speedup_<bw>``
(dense / wanrt) is kept. The estimate assumes the big model needs as many iterations as the small one, in
the same ratio; it is printed with every input.

``--quick`` (CI, under a minute): 2 sites × 1 rank, the 0.3 M-parameter model, target loss 0.15, one seed,
100 Mbit/s only. DDP and wanrt are trained to the target (their measured TTA), their iteration times come
from those runs; the dense arm is only timed (a short run) and its iteration count is taken to be DDP's
(both are synchronous dense averaging: they take the same steps; the full run measures both). The quick
``tta_speedup_vs_ddp_100mbit`` is therefore the small model's: the ≥ 15 target is a full-run key.
Output: a table on stdout, ``--json PATH``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: import this checkout, not whatever wanrt is installed
    sys.path.insert(0, str(ROOT))

from wanrt.demo.config import DEFAULT, QUICK, DemoConfig, check_device  # noqa: E402
from wanrt.demo.results import RunResult  # noqa: E402
from wanrt.demo.runner import Demo  # noqa: E402
from wanrt.errors import ConfigError  # noqa: E402

#: the workload this benchmark's convergence runs measure: the demo's default before issue 25 (MLP width
#: 512, no dense budget, 2 s trace steps), so its documented numbers keep their meaning; ``wanrt demo``'s
#: default is now a larger model whose dense arm is stopped at a budget, which an iteration-count estimate
#: cannot use
SMALL: Final = DemoConfig()

BANDWIDTHS: tuple[tuple[str, float], ...] = (("1gbit", 1e9), ("500mbit", 500e6), ("100mbit", 100e6))
KEY_BANDWIDTH = "100mbit"
#: --quick's target: past the first, steepest part of the curve, where sparse updates still lag and one
#: run's count says little (the demo's --quick stops at 0.3 to finish sooner)
QUICK_TARGET = 0.15
#: the iterations-to-target runs use the key's links: the measured small-model TTA is then at 100 Mbit/s
CONVERGENCE_BANDWIDTH = 100e6
#: without namespaces (``--no-ddp``) the old comparison: its iterations-to-target runs at 1 Gbit/s
LEGACY_CONVERGENCE_BANDWIDTH = 1e9
#: wanrt and the compute-only run cost well under a second per iteration but move with the machine's load:
#: they are timed over this many iterations (the link-bound DDP and dense arms over ``--measure``)
MEASURE_CHEAP = 20
#: wanrt and compute only skip at least this many iterations before timing (DDP and dense: ``--warmup``).
#: Why more: each wanrt run starts new gateway daemons, whose payload codec loads its fused kernels in a
#: background thread on the first large payload (~1.5 s of CPU per gateway, three gateways, on the same two
#: cores as the trainers: wanrt.codec.kernel_choice). Measured on the full run's model at 100 Mbit/s, the
#: first ~6 wanrt iterations take 0.55-0.75 s against a steady 0.36-0.40 s (docs/client.md); DDP's three
#: warm-up iterations span ~13 s, wanrt's three ~1.5 s. The short-warm-up figure stays in the JSON
#: (``iter_s_wanrt_<bw>_warmup_short``) so the difference is visible.
WARMUP_CHEAP = 10
#: keys whose quick value measures something smaller than the full run's (the 0.3 M model, 2 sites)
FULL_RUN_KEYS = ("tta_speedup_vs_ddp_100mbit", "tta_speedup_100mbit", "iter_speedup_vs_ddp_100mbit")


@dataclass(frozen=True)
class Plan:
    convergence: DemoConfig
    timing: DemoConfig
    warmup: int
    measure: int
    #: quick: time on the convergence runs, with the same trainers
    shared: bool
    seeds: tuple[int, ...]
    #: real DDP on namespaces (False: the old two-arm comparison on user-space shaped links)
    ddp: bool
    bandwidths: tuple[tuple[str, float], ...]
    #: arms trained to the target in the convergence runs
    converge_arms: tuple[str, ...]
    #: the namespaces' layout: a link per pair of sites, or one shared access link per site
    topology: str = "mesh"

    @property
    def arms(self) -> tuple[str, ...]:
        return ("ddp", "dense", "wanrt") if self.ddp else ("dense", "wanrt")


def make_plan(quick: bool, warmup: int | None, measure: int | None, seeds: int | None, ddp: bool) -> Plan:
    w = warmup if warmup is not None else 3
    n_seeds = seeds if seeds is not None else (1 if quick else 2)
    bw = CONVERGENCE_BANDWIDTH if ddp else LEGACY_CONVERGENCE_BANDWIDTH
    links: dict[str, Any] = {"bandwidth_bps": bw, "fluctuating": False}
    if ddp:  # the namespace links add no delay (no netem): every arm runs without one
        links.update(rtt_s=0.0, jitter_s=0.0)
    if quick:
        m = measure if measure is not None else 8
        convergence = dataclasses.replace(
            QUICK, model_hidden=SMALL.model_hidden, target_loss=QUICK_TARGET, **links
        )
        timing_base = convergence
        bandwidths = tuple(b for b in BANDWIDTHS if b[0] == KEY_BANDWIDTH) if ddp else BANDWIDTHS
        converge = ("ddp", "wanrt") if ddp else ("dense", "wanrt")
    else:
        m = measure if measure is not None else 5
        convergence = dataclasses.replace(SMALL, **links)
        timing_base = dataclasses.replace(SMALL, ranks=1, model_hidden=3200, **links)
        bandwidths = BANDWIDTHS
        converge = ("ddp", "dense", "wanrt") if ddp else ("dense", "wanrt")
    timing = dataclasses.replace(timing_base, eval_every=0, max_iters=w + m + 1, target_loss=1e-6)
    return Plan(convergence, timing, w, m, quick, tuple(range(n_seeds)), ddp, bandwidths, converge)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Measured:
    #: per seed, each converged arm trained to the target
    convergence: list[dict[str, RunResult]]
    convergence_params: int
    #: seconds per iteration at steady state, per bandwidth label and arm
    times: dict[str, dict[str, float]]
    timing_params: int
    load: list[float] = field(default_factory=list)
    #: seconds per iteration with no exchange at all (each trainer on its own gradient): this machine's
    #: compute floor for the timing model, hence the most any exchange can gain over DDP here
    local_s: float | None = None


class Bench:
    """The runs of one benchmark: the demo's trainers and gateways, and the DDP ranks, over ``net``."""

    def __init__(self, plan: Plan, out: Path, net: Any) -> None:
        self.plan = plan
        self.out = out
        self.net = net  # NetnsSites or None
        self._booted: dict[str, Any] = {}

    def set_rate(self, bps: float) -> None:
        if self.net is not None:
            self.net.set_rate(bps)

    def boot_ddp(self, cfg: DemoConfig, out_dir: Path, label: str) -> None:
        """Start a DDP run's ranks now (they import torch and join their group while the demo's trainers
        boot: nothing is being measured then); :meth:`run` starts their clock."""
        if not self.plan.ddp:
            return
        from wanrt.demo.ddp_arm import DdpJob

        job = DdpJob(cfg, self.net, out_dir, label=label, on_line=_say)
        try:
            job.start()
        except BaseException:
            job.close()
            raise
        self._booted[label] = job

    def close(self) -> None:
        jobs, self._booted = list(self._booted.values()), {}
        for job in jobs:
            job.close()

    def run(self, arm: str, demo: Demo, cfg: DemoConfig, label: str) -> RunResult:
        self.set_rate(cfg.bandwidth_bps)
        if arm == "ddp":
            from wanrt.demo.ddp_arm import DdpJob

            job = self._booted.pop(label, None)
            if job is None:
                job = DdpJob(cfg, self.net, demo.out_dir, label=label, on_line=_say)
                job.start()
            try:
                return job.run().result
            finally:
                job.close()
        return demo.run("dense" if arm == "dense" else "wanrt", label=label, links=cfg)

    def measured_iterations(self, arm: str) -> int:
        return max(self.plan.measure, MEASURE_CHEAP) if arm in ("wanrt", "local") else self.plan.measure

    def warmup_iterations(self, arm: str) -> int:
        return warmup_for(self.plan, arm)

    def time_local(self, demo: Demo) -> float:
        p = self.plan
        m = self.measured_iterations("local")
        w = self.warmup_iterations("local")
        _say(f"timing: compute only, no exchange ({w} + {m} iterations) ...")
        links = dataclasses.replace(p.timing, max_iters=w + m + 1)
        return demo.run("local", label="local", links=links).steady_iteration_s(warmup=w)

    def time_all(self, demo: Demo, times: dict[str, dict[str, float]], arms: Sequence[str]) -> None:
        p = self.plan
        for label, bps in p.bandwidths:
            row = times.setdefault(label, {})
            for arm in arms:
                if arm in row:
                    continue
                m = self.measured_iterations(arm)
                w = self.warmup_iterations(arm)
                links = dataclasses.replace(p.timing, bandwidth_bps=bps, max_iters=w + m + 1)
                _say(f"timing: {arm} at {label} ({w} + {m} iterations) ...")
                result = self.run(arm, demo, links, f"{label}-{arm}")
                row[arm] = result.steady_iteration_s(warmup=w)
                if w > p.warmup:  # the same run timed from the short warm-up on (see WARMUP_CHEAP)
                    row[f"{arm}_warmup_short"] = _window_s(result, p.warmup, m)


def warmup_for(plan: Plan, arm: str) -> int:
    """Iterations skipped before timing ``arm`` (see :data:`WARMUP_CHEAP`)."""
    return max(plan.warmup, WARMUP_CHEAP) if arm in ("wanrt", "local") else plan.warmup


def _window_s(result: RunResult, warmup: int, measure: int) -> float:
    """Mean seconds per iteration of the ``measure`` iterations after ``warmup`` (one run, any window)."""
    steps = [(i, t) for i, t in result.step_times if warmup <= i <= warmup + measure]
    (i0, t0), (i1, t1) = steps[0], steps[-1]
    return (t1 - t0) / max(1, i1 - i0)


@contextlib.contextmanager
def _network(plan: Plan) -> Iterator[Any]:
    if not plan.ddp:
        yield None
        return
    from sims.netns.topology import Topology
    from wanrt.demo.netns_sites import NetnsSites

    topology: Topology = "bridge" if plan.topology == "bridge" else "mesh"
    with NetnsSites(plan.convergence.sites, plan.convergence.bandwidth_bps, topology=topology) as net:
        yield net


def measure(plan: Plan, out: Path) -> Measured:
    times: dict[str, dict[str, float]] = {}
    conv: list[dict[str, RunResult]] = []
    load = [os.getloadavg()[0]]
    with _network(plan) as net:
        bench = Bench(plan, out, net)
        try:
            return _measure(plan, out, bench, net, times, conv, load)
        finally:
            bench.close()


def _measure(
    plan: Plan,
    out: Path,
    bench: Bench,
    net: Any,
    times: dict[str, dict[str, float]],
    conv: list[dict[str, RunResult]],
    load: list[float],
) -> Measured:
    conv_params = 0
    for seed in plan.seeds:
        cfg = dataclasses.replace(plan.convergence, seed=seed)
        run_dir = out / f"convergence-seed{seed}"
        if "ddp" in plan.converge_arms:
            bench.boot_ddp(cfg, run_dir, "converge-ddp")
        with Demo(cfg, run_dir, progress=False, on_line=_say, netns=net) as demo:
            runs: dict[str, RunResult] = {}
            for arm in plan.converge_arms:
                _say(f"convergence (seed {seed}): {arm} to loss {cfg.target_loss:g} ...")
                runs[arm] = bench.run(arm, demo, cfg, f"converge-{arm}")
            conv.append(runs)
            conv_params = demo.parameters
            if plan.shared:
                label = next(lb for lb, bps in BANDWIDTHS if bps == cfg.bandwidth_bps)
                if label in dict(plan.bandwidths):
                    times[label] = {
                        a: r.steady_iteration_s(warmup=warmup_for(plan, a)) for a, r in runs.items()
                    }
                    if "wanrt" in runs:
                        times[label]["wanrt_warmup_short"] = runs["wanrt"].steady_iteration_s(
                            warmup=plan.warmup
                        )
                bench.time_all(demo, times, plan.arms)  # quick: no compute-only run (the minute is tight)
                load.append(os.getloadavg()[0])
                return Measured(conv, conv_params, times, conv_params, load)
    first_label, first_bps = plan.bandwidths[0]
    if plan.ddp:
        first = dataclasses.replace(plan.timing, bandwidth_bps=first_bps)
        bench.boot_ddp(first, out / "timing", f"{first_label}-ddp")
    with Demo(plan.timing, out / "timing", progress=False, on_line=_say, netns=net) as demo:
        bench.time_all(demo, times, plan.arms)
        local = bench.time_local(demo)
        load.append(os.getloadavg()[0])
        return Measured(conv, conv_params, times, demo.parameters, load, local)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 else None


def _fmt_x(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.2f}×"


def report(plan: Plan, measured: Measured, elapsed: float) -> dict[str, Any]:
    conv, times = measured.convergence, measured.times
    per_seed: dict[str, list[int]] = {a: [] for a in plan.converge_arms}
    for seed, runs in zip(plan.seeds, conv, strict=True):
        for a in plan.converge_arms:
            its = runs[a].iters_to_target
            if its is None:
                _say(f"warning: {a} (seed {seed}) did not reach the target; counting its iteration cap")
            per_seed[a].append(its if its is not None else runs[a].iterations)
    n: dict[str, float] = {a: sum(v) / len(v) for a, v in per_seed.items()}
    estimated_counts = [a for a in plan.arms if a not in n]
    for a in estimated_counts:  # quick: dense takes DDP's steps (both synchronous dense averaging)
        n[a] = n["ddp"]
    tta_measured = {a: [r[a].tta_s for r in conv] for a in plan.converge_arms}
    mean_tta = {
        a: (sum(v) / len(v) if v and all(t is not None for t in v) else None)  # type: ignore[misc]
        for a, v in tta_measured.items()
    }
    c, t = plan.convergence, plan.timing
    out: dict[str, Any] = {
        "method": (
            "tta estimated as iters_to_target (small model, measured) x steady iteration time (large model, "
            "measured at each bandwidth)"
            + ("; quick: small model for both, dense count = DDP's" if plan.shared else "")
        ),
        "quick": plan.shared,
        "real_ddp": plan.ddp,
        "device": plan.timing.device,
        "links": (
            (
                "network namespaces joined pairwise (mesh), tc tbf on each direction of every link, no added "
                "delay (kernel without netem)"
                if plan.topology == "mesh"
                else "network namespaces behind a bridge, tc tbf on every site's uplink and downlink, no "
                "added delay (kernel without netem)"
            )
            if plan.ddp
            else "unix sockets shaped by the gateways (rate, 40 ms RTT)"
        ),
        "iters_to_target_estimated_for": estimated_counts,
        "iters_to_target_per_seed": per_seed,
        "convergence": {
            "parameters": measured.convergence_params,
            "target_loss": c.target_loss,
            "bandwidth_bps": c.bandwidth_bps,
            "rtt_s": c.rtt_s,
            "sites": c.sites,
            "ranks": c.ranks,
            "seeds": list(plan.seeds),
            "measured_tta_s": tta_measured,
            "final_loss": {a: [r[a].final_loss for r in conv] for a in plan.converge_arms},
            "final_accuracy": {a: [r[a].final_accuracy for r in conv] for a in plan.converge_arms},
            "wan_bytes_per_iteration": {
                a: [r[a].wan_bytes_sent / max(1, r[a].iterations) for r in conv] for a in plan.converge_arms
            },
        },
        "timing": {
            "parameters": measured.timing_params,
            "sites": t.sites,
            "ranks": t.ranks,
            "rtt_s": t.rtt_s,
            "density": t.density,
            "warmup": plan.warmup,
            "warmup_wanrt_and_local": warmup_for(plan, "wanrt"),
            "measured_iterations": plan.measure,
            "measured_iterations_wanrt_and_local": max(plan.measure, MEASURE_CHEAP),
            "from_convergence_runs": plan.shared,
        },
        "load_average_1min": measured.load,
        "elapsed_s": elapsed,
        "full_run_keys": list(FULL_RUN_KEYS),
    }
    for a in plan.arms:
        out[f"iters_to_target_{a}"] = n[a]
    out["iters_to_target_ratio"] = _ratio(n["wanrt"], n["dense"])
    for a in plan.converge_arms:
        out[f"tta_measured_s_{a}_small"] = mean_tta[a]
    out["iter_s_local_compute"] = measured.local_s
    if plan.ddp:
        out["ceiling_iter_speedup_vs_ddp_100mbit"] = _ratio(
            times.get(KEY_BANDWIDTH, {}).get("ddp"), measured.local_s
        )
        out["iters_to_target_ratio_vs_ddp"] = _ratio(n["wanrt"], n["ddp"])
        out["tta_measured_speedup_vs_ddp_small"] = _ratio(mean_tta["ddp"], mean_tta["wanrt"])
    rows = []
    for label, bps in plan.bandwidths:
        it = times[label]
        tta = {a: n[a] * it[a] for a in plan.arms}
        for a in plan.arms:
            out[f"iter_s_{a}_{label}"] = it[a]
        if "wanrt_warmup_short" in it:
            out[f"iter_s_wanrt_{label}_warmup_short"] = it["wanrt_warmup_short"]
            out[f"tta_est_s_{a}_{label}"] = tta[a]
        out[f"iter_speedup_{label}"] = _ratio(it["dense"], it["wanrt"])
        out[f"tta_speedup_{label}"] = _ratio(tta["dense"], tta["wanrt"])
        row = [f"{bps / 1e6:g} Mbit/s"]
        if plan.ddp:
            out[f"iter_speedup_vs_ddp_{label}"] = _ratio(it["ddp"], it["wanrt"])
            out[f"tta_speedup_vs_ddp_{label}"] = _ratio(tta["ddp"], tta["wanrt"])
            out[f"ddp_vs_dense_iter_{label}"] = _ratio(it["dense"], it["ddp"])
            row += [f"{it['ddp']:.3f}"]
        row += [f"{it['dense']:.3f}", f"{it['wanrt']:.3f}"]
        row += [f"{tta[a]:.0f}" for a in plan.arms]
        if plan.ddp:
            key = out[f"tta_speedup_vs_ddp_{label}"]
            mark = " (quick: small model)" if plan.shared and label == KEY_BANDWIDTH else ""
            row.append(_fmt_x(key) + mark)
        row.append(_fmt_x(out[f"tta_speedup_{label}"]))
        rows.append(tuple(row))
    head = ["link"]
    if plan.ddp:
        head += ["DDP s/it"]
    head += ["dense s/it", "wanrt s/it"] + [f"{a} TTA s" for a in plan.arms]
    if plan.ddp:
        head.append("TTA speedup vs DDP")
    head.append("vs dense")
    print(_table(tuple(head), rows))
    counts = ", ".join(
        f"{a} {n[a]:g} {per_seed.get(a, '(= DDP’s, not measured in --quick)')}" for a in plan.arms
    )
    print(
        f"\niterations to target loss {c.target_loss:g} ({measured.convergence_params / 1e6:.2f} M-parameter "
        f"demo model, {c.sites}×{c.ranks} ranks, {c.bandwidth_bps / 1e6:g} Mbit/s, measured, mean of "
        f"{len(plan.seeds)} seed(s)): {counts}"
    )
    if plan.ddp:
        measured_line = ", ".join(
            f"{a} {mean_tta[a]:.1f} s" if mean_tta[a] is not None else f"{a} not reached"
            for a in plan.converge_arms
        )
        print(
            f"measured time to target on that model: {measured_line}; DDP / wanrt = "
            f"{_fmt_x(out['tta_measured_speedup_vs_ddp_small'])}"
        )
    rtt = "no added delay (no netem)" if plan.ddp else f"{t.rtt_s * 1e3:g} ms RTT"
    print(
        f"iteration times: {measured.timing_params / 1e6:.2f} M-parameter MLP, {t.sites}×{t.ranks} ranks, "
        f"{rtt}, wanrt density {t.density:g}, mean of {plan.measure} iterations"
        + ("" if plan.shared else f" (wanrt and compute only: {max(plan.measure, MEASURE_CHEAP)})")
        + f" after {plan.warmup} warm-up ({warmup_for(plan, 'wanrt')} for wanrt and compute only)"
        + (" (quick: from the convergence runs; dense from a short run)" if plan.shared else "")
    )
    print("TTA estimate = iterations to target × steady iteration time (see the module docstring)")
    if measured.local_s is not None:
        ceiling = out.get("ceiling_iter_speedup_vs_ddp_100mbit")
        print(
            f"compute only (no exchange, same trainers and model): {measured.local_s:.3f} s/it"
            + (
                f"; DDP at 100 Mbit/s / that = {_fmt_x(ceiling)}, the most any exchange can gain over DDP "
                "per iteration on this machine at this load"
                if ceiling is not None
                else ""
            )
        )
    if plan.shared and plan.ddp:
        print(
            f"--quick: {', '.join(FULL_RUN_KEYS)} measure the 0.3 M-parameter model here; their targets "
            "apply to the full run (10.5 M parameters)"
        )
    print(f"load average (1 min) at start/end: {', '.join(f'{x:.1f}' for x in measured.load)}")
    return out


def _table(head: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
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
    ap.add_argument("--measure", type=int, help="iterations timed per bandwidth and arm")
    ap.add_argument("--seeds", type=int, help="convergence runs averaged (default 2; 1 with --quick)")
    ap.add_argument(
        "--no-ddp",
        dest="ddp",
        action="store_false",
        help="no namespaces: the old dense-vs-wanrt comparison on the gateways' shaped unix links",
    )
    ap.add_argument(
        "--bridge",
        action="store_true",
        help="one shared access link per site (a bridge) instead of a link per pair of sites",
    )
    ap.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the wanrt, dense and compute-only trainers compute (cuda: one rank per site per GPU; "
        "the DDP arm runs on CPU only, so cuda needs --no-ddp)",
    )
    ap.add_argument(
        "--round-topology",
        help="the gateways' WAN round topology for the wanrt and dense arms (default: the demo's, "
        f"{DEFAULT.topology}); allpairs: sparse rounds take one hop (docs/round_bench.md)",
    )
    args = ap.parse_args(argv)
    if args.device == "cuda" and args.ddp:
        _say("bench_e2e: --device cuda: the DDP arm runs on CPU only; add --no-ddp")
        return 2
    if args.ddp:
        from wanrt.demo.netns_sites import netns_unavailable

        reason = netns_unavailable()
        if reason is not None:
            _say(f"bench_e2e: the real-DDP arm needs network namespaces: {reason} (run as root, or --no-ddp)")
            return 2
    plan = make_plan(args.quick, args.warmup, args.measure, args.seeds, args.ddp)
    if args.bridge:
        plan = dataclasses.replace(plan, topology="bridge")
    if args.round_topology:
        rt = args.round_topology
        plan = dataclasses.replace(
            plan,
            convergence=dataclasses.replace(plan.convergence, topology=rt),
            timing=dataclasses.replace(plan.timing, topology=rt),
        )
    if args.device != "cpu":
        plan = dataclasses.replace(
            plan,
            convergence=dataclasses.replace(plan.convergence, device=args.device),
            timing=dataclasses.replace(plan.timing, device=args.device),
        )
        try:
            check_device(plan.timing)
            check_device(plan.convergence)
        except ConfigError as exc:
            _say(f"bench_e2e: {exc.message}")
            return 2
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="wanrt-bench-e2e-"))
    _say(f"bench_e2e: logs in {out}")
    t0 = time.monotonic()
    data = report(plan, measure(plan, out), time.monotonic() - t0)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
