"""The demo's headline against real DDP: every other arm's ratios over the ``ddp`` arm, as a table and JSON.

Kept beside :mod:`wanrt.demo.results` rather than inside it: the DDP arm exists only with ``--ddp`` (it
needs root and network namespaces), and the comparison among the gateway arms is unchanged by it. Ratios
are oriented as there (bigger is better for the arm, except ``iters_to_target`` and ``final_loss``, which
are arm over DDP): ``tta_speedup_vs_ddp`` = DDP's time to target / the arm's.
"""

from __future__ import annotations

import math
from typing import Any

from wanrt.demo.results import ARM_LABELS, Comparison, RunResult

__all__ = ["DDP_ARM_LABEL", "ddp_headline", "ddp_json", "format_ddp_table"]

DDP_ARM_LABEL = "real DDP (gloo)"
#: JSON key prefix per arm: the fixed arm is wanrt's headline, so it carries no prefix
_PREFIX = {"wanrt": "", "dense": "dense_", "adaptive": "adaptive_"}


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0 or not math.isfinite(num) or not math.isfinite(den):
        return None
    return num / den


def _its(r: RunResult) -> float | None:
    return None if r.iters_to_target is None else float(r.iters_to_target)


def ratios_vs_ddp(ddp: RunResult, r: RunResult) -> dict[str, float | None]:
    return {
        "tta_speedup_vs_ddp": _ratio(ddp.tta_s, r.tta_s),
        "iter_speedup_vs_ddp": _ratio(r.iters_per_s, ddp.iters_per_s),
        "bytes_per_iter_ratio_vs_ddp": _ratio(
            ddp.wan_bytes_sent / max(ddp.iterations, 1), r.wan_bytes_sent / max(r.iterations, 1)
        ),
        "iters_to_target_ratio_vs_ddp": _ratio(_its(r), _its(ddp)),
        "final_loss_ratio_vs_ddp": _ratio(r.final_loss, ddp.final_loss),
    }


def ddp_json(ddp: RunResult, c: Comparison) -> dict[str, Any]:
    """``ddp`` (the run) and, per arm, ``<prefix>tta_speedup_vs_ddp`` and the other ratios."""
    out: dict[str, Any] = {"ddp": ddp.to_json()}
    for r in c.arms:
        for key, value in ratios_vs_ddp(ddp, r).items():
            out[_PREFIX[r.mode] + key] = value
    return out


def _x(r: float | None, better: str) -> str:
    return "n/a" if r is None else f"{r:.2f}× {better}".rstrip()


def format_ddp_table(ddp: RunResult, c: Comparison) -> str:
    """One column for DDP's own figures, one per arm with its figure and its ratio over DDP."""

    def tta(r: RunResult) -> str:
        return f"{r.tta_s:.1f} s" if r.tta_s is not None else f"not reached ({r.iterations} it)"

    def per_it(r: RunResult) -> float:
        return r.wan_bytes_sent / max(r.iterations, 1)

    head = ["", DDP_ARM_LABEL, *(ARM_LABELS[r.mode] for r in c.arms)]
    rows: list[list[str]] = []

    def row(label: str, own: Any, key: str, better: str) -> None:
        cells = [label, own(ddp)]
        for r in c.arms:
            cells.append(f"{own(r)} ({_x(ratios_vs_ddp(ddp, r)[key], better)})")
        rows.append(cells)

    row(f"time to loss ≤ {ddp.target_loss:g}", tta, "tta_speedup_vs_ddp", "faster")
    row(
        "iterations to target",
        lambda r: str(r.iters_to_target) if r.iters_to_target is not None else "—",
        "iters_to_target_ratio_vs_ddp",
        "",
    )
    row("iterations / s", lambda r: f"{r.iters_per_s:.2f}", "iter_speedup_vs_ddp", "faster")
    row("WAN MB / iteration", lambda r: f"{per_it(r) / 1e6:.2f}", "bytes_per_iter_ratio_vs_ddp", "fewer")
    row("final train loss", lambda r: f"{r.final_loss:.4f}", "final_loss_ratio_vs_ddp", "")
    n = len(head)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(n)]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(head)).rstrip()]
    lines.append("  ".join("-" * wd for wd in widths))
    lines += ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip() for r in rows]
    lines.append(
        "(DDP's WAN bytes: the kernel's counters of the sites' uplinks, TCP/IP headers included; the other "
        "arms': the gateways' own counters)"
    )
    return "\n".join(lines)


def ddp_headline(ddp: RunResult, c: Comparison) -> str:
    """The one line the demo leads with when it ran real DDP."""
    speed = ratios_vs_ddp(ddp, c.wanrt)["tta_speedup_vs_ddp"]
    if speed is None:
        return "headline: no time-to-target ratio against real DDP (an arm did not reach the target)"
    how = f"{speed:.2f}× faster than" if speed >= 1 else f"{1 / speed:.2f}× slower than"
    return (
        f"headline: wanrt reached loss {ddp.target_loss:g} {how} real DDP "
        f"(gloo all-reduce over the same {len(ddp.bytes_sent_per_site)}-site namespace links)"
    )
