"""What one simulation run produced, and its table and JSON forms.

Round time of (iteration, layer): from the first push of that layer by any site to the moment the last
site's trainer received its aggregate — what a synchronous job waits for. Iteration time: the gap between
a site's consecutive iteration starts (compute included), averaged over sites.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from sims.des.link import LinkSample

__all__ = ["LinkResult", "SimResult"]


@dataclass
class LinkResult:
    """One direction of one link: totals and its time series."""

    src: str
    dst: str
    bytes_total: int
    writes: int
    lost_writes: int
    busy_s: float
    series: LinkSample
    pacer_bps: list[float] = field(default_factory=list)


@dataclass
class SimResult:
    """See the module docstring. ``aggregates`` maps (site, iteration, layer) to (arrival time, payload
    digest, number of sites in the aggregate)."""

    scenario: str
    seed: int
    sites: tuple[str, ...]
    iterations: int
    layers: int
    finished: bool
    virtual_s: float
    events: int
    wall_s: float
    iteration_start: dict[str, list[float]]
    iteration_done: dict[str, dict[int, float]]
    first_push: dict[tuple[int, int], float]
    last_delivery: dict[tuple[int, int], float]
    round_closed: list[tuple[str, int, int, float, int, bool]]
    links: dict[tuple[str, str], LinkResult]
    frontier: dict[str, tuple[list[float], list[int]]]
    aggregates: dict[tuple[str, int, int], tuple[float, str, int]]
    problems: list[str]

    # -- derived ------------------------------------------------------------------------------------

    def round_times(self) -> list[float]:
        """Per (iteration, layer) delivered everywhere: last delivery − first push, in order."""
        out = []
        for key in sorted(self.first_push):
            if key in self.last_delivery:
                out.append(self.last_delivery[key] - self.first_push[key])
        return out

    def iteration_times(self) -> list[float]:
        """Mean over sites of the gap between consecutive iteration starts, per iteration."""
        gaps: list[list[float]] = []
        for starts in self.iteration_start.values():
            for i in range(1, len(starts)):
                if len(gaps) < i:
                    gaps.append([])
                gaps[i - 1].append(starts[i] - starts[i - 1])
        return [statistics.fmean(g) for g in gaps if g]

    def digests(self) -> dict[tuple[str, int, int], str]:
        return {k: v[1] for k, v in self.aggregates.items()}

    def summary(self) -> dict[str, Any]:
        rt = self.round_times()
        it = self.iteration_times()
        wan = sum(lr.bytes_total for lr in self.links.values())
        return {
            "scenario": self.scenario,
            "sites": len(self.sites),
            "iterations": self.iterations,
            "layers": self.layers,
            "finished": self.finished,
            "virtual_s": self.virtual_s,
            "wall_s": self.wall_s,
            "events": self.events,
            "aggregates": len(self.aggregates),
            "round_mean_s": statistics.fmean(rt) if rt else None,
            "round_p50_s": statistics.median(rt) if rt else None,
            "round_max_s": max(rt) if rt else None,
            "iteration_mean_s": statistics.fmean(it) if it else None,
            "wan_bytes": wan,
            "links": len(self.links),
            "problems": len(self.problems),
        }

    def table(self) -> str:
        s = self.summary()
        rows = [
            ("scenario", s["scenario"]),
            ("sites / iterations / layers", f"{s['sites']} / {s['iterations']} / {s['layers']}"),
            ("finished", s["finished"]),
            ("virtual time s", f"{s['virtual_s']:.4f}"),
            ("wall time s", f"{s['wall_s']:.3f}"),
            ("events", s["events"]),
            ("aggregates delivered", s["aggregates"]),
            ("round time mean / p50 / max s", _fmt3(s["round_mean_s"], s["round_p50_s"], s["round_max_s"])),
            ("iteration time mean s", _fmt3(s["iteration_mean_s"])),
            ("WAN bytes (all directions)", s["wan_bytes"]),
            ("link directions", s["links"]),
            ("problems (links closed, refusals)", s["problems"]),
        ]
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        busiest = sorted(self.links.values(), key=lambda lr: -lr.bytes_total)[:8]
        if busiest:
            lines.append("")
            lines.append(
                f"{'link':<24} {'bytes':>12} {'writes':>8} {'lost':>6} {'busy s':>9} {'mean Mbit/s':>12}"
            )
            for lr in busiest:
                mbps = lr.bytes_total * 8 / lr.busy_s / 1e6 if lr.busy_s > 0 else 0.0
                lines.append(
                    f"{lr.src + ' -> ' + lr.dst:<24} {lr.bytes_total:>12} {lr.writes:>8} {lr.lost_writes:>6} "
                    f"{lr.busy_s:>9.4f} {mbps:>12.2f}"
                )
        for p in self.problems[:5]:
            lines.append(f"problem: {p}")
        return "\n".join(lines)

    def to_json(self, *, series: bool = True) -> dict[str, Any]:
        """Plain JSON: keys ``site/iteration/layer`` for aggregates, ``src->dst`` for links."""
        out: dict[str, Any] = {"summary": self.summary()}
        out["round_times_s"] = self.round_times()
        out["iteration_times_s"] = self.iteration_times()
        out["round_closed"] = [
            {"site": s, "iteration": i, "layer": layer, "duration_s": d, "missing": m, "delivered": ok}
            for s, i, layer, d, m, ok in self.round_closed
        ]
        out["aggregates"] = {
            f"{s}/{i}/{layer}": {"t": t, "digest": h, "sites": n}
            for (s, i, layer), (t, h, n) in sorted(self.aggregates.items())
        }
        links: dict[str, Any] = {}
        for (src, dst), lr in sorted(self.links.items()):
            row: dict[str, Any] = {
                "bytes": lr.bytes_total,
                "writes": lr.writes,
                "lost_writes": lr.lost_writes,
                "busy_s": lr.busy_s,
            }
            if series:
                row["t"] = lr.series.t
                row["bytes_total"] = lr.series.bytes_total
                row["queue_bytes"] = lr.series.queue_bytes
                row["rate_bps"] = lr.series.rate_bps
                row["pacer_bps"] = lr.pacer_bps
            links[f"{src}->{dst}"] = row
        out["links"] = links
        if series:
            out["frontier"] = {s: {"t": t, "frontier": f} for s, (t, f) in sorted(self.frontier.items())}
        out["problems"] = self.problems
        return out


def _fmt3(*values: float | None) -> str:
    return " / ".join("-" if v is None else f"{v:.4f}" for v in values)
