"""The demo's picture: training loss against wall time, dense baseline and wanrt on one axis.

Wall time, not iterations, is the x axis because that is what a WAN changes: both runs need a similar number
of iterations, but wanrt's are cheaper. Rendered with matplotlib's Agg backend (no display needed), chosen
through an explicit Figure/canvas so importing this module changes no global matplotlib state.
"""

from __future__ import annotations

from pathlib import Path

from wanrt.demo.results import Comparison, RunResult

__all__ = ["plot_loss_vs_time"]

COLORS = {"dense": "tab:gray", "wanrt": "tab:blue"}


def plot_loss_vs_time(c: Comparison, path: Path, *, title: str) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.8), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    runs: tuple[tuple[str, RunResult], ...] = (("dense (DDP-like)", c.dense), ("wanrt", c.wanrt))
    for label, r in runs:
        xs = [p.t for p in r.curve]
        ys = [p.loss for p in r.curve]
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
    ax.set_xlabel("wall time since start (s)")
    ax.set_ylabel("training-split cross-entropy")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(str(path))
    return path
