"""PNG plots of a run (``wanrt sim --plots DIR``): round-time distribution, per-link rate and queue over
time, frontier per site. matplotlib with the Agg backend (no display); imported only when plotting."""

from __future__ import annotations

from pathlib import Path

from sims.des.results import SimResult

__all__ = ["MAX_LINES", "write_plots"]

#: Lines per panel: past a few dozen links or sites a plot is unreadable; the busiest are drawn.
MAX_LINES = 16


def write_plots(result: SimResult, out_dir: str | Path) -> list[Path]:
    """Write the three PNGs into ``out_dir`` (created); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []

    fig, ax = plt.subplots(figsize=(7, 4))
    rt = result.round_times()
    if rt:
        ax.hist([t * 1e3 for t in rt], bins=min(50, max(5, len(rt) // 4)))
    ax.set_xlabel("round time (ms): first push to last delivery")
    ax.set_ylabel("rounds")
    ax.set_title(f"{result.scenario}: {len(rt)} rounds, {len(result.sites)} sites")
    paths.append(_save(fig, out / "round_times.png"))

    busiest = sorted(result.links.values(), key=lambda lr: -lr.bytes_total)[:MAX_LINES]
    fig, (ax_rate, ax_queue) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for lr in busiest:
        s = lr.series
        if not s.t:
            continue
        label = f"{lr.src}->{lr.dst}"
        (line,) = ax_rate.plot(s.t, [r / 1e6 for r in s.rate_bps], label=label)
        if lr.pacer_bps:
            ax_rate.plot(s.t, [r / 1e6 for r in lr.pacer_bps], ls="--", color=line.get_color())
        ax_queue.plot(s.t, [q / 1024 for q in s.queue_bytes], label=label, color=line.get_color())
    ax_rate.set_ylabel("Mbit/s (solid: link, dashed: pacer)")
    ax_queue.set_ylabel("send buffer KiB")
    ax_queue.set_xlabel("virtual time (s)")
    if busiest:
        ax_rate.legend(fontsize=6, ncol=4)
    ax_rate.set_title(f"{result.scenario}: busiest {len(busiest)} link directions")
    paths.append(_save(fig, out / "links.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    for site in list(result.frontier)[:MAX_LINES]:
        ts, fs = result.frontier[site]
        ax.step(ts, fs, where="post", label=site)
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("frontier (newest iteration seen)")
    if result.frontier:
        ax.legend(fontsize=6, ncol=4)
    ax.set_title(f"{result.scenario}: frontier per site")
    paths.append(_save(fig, out / "frontier.png"))
    return paths


def _save(fig: object, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()  # type: ignore[attr-defined]
    fig.savefig(path, dpi=100)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    return path
