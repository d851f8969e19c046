"""The demo's picture: training loss against wall time for every arm and, with the scheduler, what it saw and
chose over the same wall time.

Wall time, not iterations, is the x axis because that is what a WAN changes: the runs need a similar number
of iterations, but wanrt's are cheaper. Below the loss, for the adaptive run: the fluctuating link's true
rate (from the trace the demo wrote, as its gateway played it) against the scheduler's bandwidth estimate
(from its decisions file), then the density and each site's per-rank batch size in force, drawn from the
iteration each decision took effect (mapped to time by the first site's step times), not from when it was
decided. Rendered with matplotlib's Agg backend (no display needed), through an explicit Figure/canvas so
importing this module changes no global matplotlib state.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wanrt.demo.results import ARM_LABELS, Comparison, RunResult
from wanrt.protocol.job_settings import per_site

__all__ = ["plot_loss_vs_time", "settings_over_time"]

COLORS = {"dense": "tab:gray", "wanrt": "tab:blue", "adaptive": "tab:green"}
#: short words for the scheduler's decision reasons (scheduler.control.decision.DecisionReason)
REASON_LABELS = {
    "initial": "first plan",
    "bandwidth_change": "bandwidth moved",
    "latency_change": "latency moved",
    "periodic": "periodic",
    "warmup_stage": "warm-up stage",
}
SITE_COLORS = ("tab:purple", "tab:orange", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "k", "tab:red")


def _time_of_iteration(r: RunResult, iteration: int) -> float | None:
    """When ``iteration`` (0-based) began at the first site: the end of the step before it."""
    if iteration <= 0:
        return 0.0
    its = [i for i, _ in r.step_times]
    k = bisect.bisect_left(its, iteration)
    if k >= len(its):
        return None  # never reached
    return r.step_times[k][1]


def settings_over_time(r: RunResult) -> list[tuple[float, dict[str, Any]]]:
    """(seconds since the start, settings in force from then on), starting with the run's initial ones."""
    current = dict(r.settings)
    out: list[tuple[float, dict[str, Any]]] = [(0.0, dict(current))]
    for d in r.commits:
        assert d.effective_iteration is not None and d.values is not None
        t = _time_of_iteration(r, d.effective_iteration)
        if t is None:
            continue
        current.update(d.values)
        out.append((t, dict(current)))
    return out


def _steps(points: Sequence[tuple[float, float]], end: float) -> tuple[list[float], list[float]]:
    xs = [t for t, _ in points] + [end]
    ys = [v for _, v in points]
    return xs, [*ys, ys[-1]] if ys else []


def plot_loss_vs_time(c: Comparison, path: Path, *, title: str) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    a = c.adaptive
    rows = 1 if a is None else 3
    fig = Figure(figsize=(8.5, 4.8 if rows == 1 else 9.6), dpi=120)
    FigureCanvasAgg(fig)
    heights = [1.0] if rows == 1 else [1.6, 1.0, 1.0]
    axes = fig.subplots(rows, 1, squeeze=False, gridspec_kw={"height_ratios": heights})
    ax = axes[0][0]
    for r in c.arms:
        xs = [p.t for p in r.curve]
        ys = [p.loss for p in r.curve]
        label = (
            ARM_LABELS[r.mode] if a is not None else ("wanrt" if r.mode == "wanrt" else ARM_LABELS[r.mode])
        )
        ax.plot(xs, ys, marker=".", markersize=3, color=COLORS[r.mode], label=f"{label}: {r.iterations} it")
        if r.tta_s is not None:
            ax.axvline(r.tta_s, color=COLORS[r.mode], linestyle=":", linewidth=1)
            ax.annotate(
                f"{r.tta_s:.0f} s",
                (r.tta_s, c.dense.target_loss),
                textcoords="offset points",
                xytext=(3, 6),
                color=COLORS[r.mode],
                fontsize=8,
            )
    ax.axhline(c.dense.target_loss, color="tab:red", linestyle="--", linewidth=1, label="target loss")
    ax.set_yscale("log")
    ax.set_ylabel("training-split cross-entropy")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_xlabel("wall time since start (s)")
    if a is not None:
        # the adaptive run's own time span (the dense run is often several times longer)
        axes[2][0].sharex(axes[1][0])
        _plot_bandwidth(axes[1][0], a)
        _plot_settings(axes[2][0], a, fixed_density=c.wanrt.settings.get("density"))
        axes[2][0].set_xlim(0, max(a.train_s, 1e-3))
        axes[2][0].set_xlabel("wall time since the adaptive run's start (s)")
    fig.tight_layout()
    fig.savefig(str(path))
    return path


def _plot_bandwidth(ax: Any, a: RunResult) -> None:
    end = a.train_s
    if a.link_trace:
        xs, ys = _steps([(t, bps / 1e6) for t, bps in a.link_trace], end)
        ax.step(xs, ys, where="post", color="tab:gray", label="fluctuating link: true rate (trace)")
    est = [(d.t, d.bandwidth_estimate_bps / 1e6) for d in a.decisions if d.bandwidth_estimate_bps is not None]
    est = [(t, v) for t, v in est if 0.0 <= t <= end]
    if est:
        xs, ys = _steps(est, end)
        ax.step(xs, ys, where="post", color="tab:green", label="scheduler's bandwidth estimate")
    ax.set_ylabel("Mbit/s")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("adaptive run: the link and what the scheduler believed", fontsize=9)


def _plot_settings(ax: Any, a: RunResult, *, fixed_density: Any = None) -> None:
    end = a.train_s
    timeline = settings_over_time(a)
    dens = [(t, float(s["density"])) for t, s in timeline if isinstance(s.get("density"), (int, float))]
    lines = []
    if dens:
        xs, ys = _steps(dens, end)
        lines += ax.step(xs, ys, where="post", color="tab:green", label="density")
    if isinstance(fixed_density, (int, float)):
        fixed = ax.axhline(fixed_density, color="tab:blue", linestyle=":", linewidth=1)
        fixed.set_label("fixed arm's density")
        lines.append(fixed)
    ax.set_ylabel("density")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    right = ax.twinx()
    batches = [(t, s, per_site(s, "batch_size")) for t, s in timeline]
    sites = sorted(a.final_batch) or sorted(site for _, _, b in batches for site in b)
    for i, site in enumerate(dict.fromkeys(sites)):
        pts = [(t, float(b.get(site, s.get("batch", 0)))) for t, s, b in batches]
        xs, ys = _steps(pts, end)
        lines += right.step(
            xs,
            ys,
            where="post",
            color=SITE_COLORS[i % len(SITE_COLORS)],
            linestyle="--",
            label=f"batch / rank, site {site}",
        )
    right.set_ylabel("batch / rank")
    right.set_ylim(bottom=0)
    # each committed decision's reason, at the time it was decided, with the bandwidth it was planned for
    for d in a.commits:
        if d.reason and 0.0 <= d.t <= end:
            bw = "" if d.bandwidth_estimate_bps is None else f" @ {d.bandwidth_estimate_bps / 1e6:.0f}M"
            label = REASON_LABELS.get(d.reason, d.reason) + bw
            ax.annotate(
                label,
                (d.t, 0.02),
                xycoords=("data", "axes fraction"),
                rotation=90,
                fontsize=6,
                color="dimgray",
                va="bottom",
                ha="right",
            )
    ax.legend(lines, [ln.get_label() for ln in lines], fontsize=8, loc="upper right")
    ax.set_title("adaptive run: settings in force (from each decision's effective iteration)", fontsize=9)
