"""``wanrt demo --mode``: the dense baseline beside wanrt in each exchange mode, one table row per mode.

A run's WAN iterations count exchanges: one per step for per-step exchange, one per outer step for the
outer loop (``wanrt.DiLoCo``: ``ctx.iteration`` counts outer steps). Progress is compared in *inner steps*
(optimizer steps on a batch, what compute costs): an outer step of H inner steps is H of them. The H in
force at each WAN iteration is the arm's ``outer_steps``, changed by every committed ``outer_steps`` the
scheduler announced (the ``auto`` arm), from its effective iteration on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from wanrt.demo.results import RunResult

__all__ = ["ModeRow", "format_mode_table", "inner_steps", "mode_rows", "modes_json"]


def inner_steps(r: RunResult, iterations: int, start_h: int) -> int:
    """Inner steps in the first ``iterations`` WAN iterations of ``r``, whose H starts at ``start_h``."""
    changes = sorted(
        (d.effective_iteration, int(d.values["outer_steps"]))
        for d in r.commits
        if d.values is not None and d.effective_iteration is not None and "outer_steps" in d.values
    )
    total, h, at = 0, start_h, 0
    for effective, new_h in changes:
        if effective >= iterations:
            break
        total += (max(effective, at) - at) * h
        at, h = max(effective, at), new_h
    return total + (iterations - at) * h


@dataclass(frozen=True)
class ModeRow:
    mode: str
    run: RunResult
    #: inner steps to the target (None: not reached)
    inner_steps_to_target: int | None
    #: the H in force at the end
    final_outer_steps: int

    @property
    def bytes_per_inner_step(self) -> float:
        steps = inner_steps_of_run(self)
        return self.run.wan_bytes_sent / steps if steps else math.nan


def inner_steps_of_run(row: ModeRow) -> int:
    return inner_steps(row.run, row.run.iterations, _start_h(row))


def _start_h(row: ModeRow) -> int:
    return int(row.run.settings.get("outer_steps", 1))


def mode_rows(dense: RunResult, runs: Mapping[str, RunResult]) -> list[ModeRow]:
    """The dense row first, then one per mode (each run's ``settings`` holds its starting H)."""
    rows = []
    for mode, r in [("dense", dense), *runs.items()]:
        h0 = int(r.settings.get("outer_steps", 1))
        its = r.iters_to_target
        steps = None if its is None else inner_steps(r, its, h0)
        final = r.final_settings.get("outer_steps", h0)
        rows.append(ModeRow(mode, r, steps, int(final)))
    return rows


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0 or not math.isfinite(a) or not math.isfinite(b):
        return None
    return a / b


def format_mode_table(rows: Sequence[ModeRow]) -> str:
    dense = rows[0].run
    head = (
        f"{'mode':<10}{'H end':>6}{'exchanges':>10}{'inner steps':>12}{'time to target':>16}"
        f"{'WAN bytes':>12}{'bytes vs dense':>15}{'test acc':>9}{'identical':>10}"
    )
    lines = [head]
    for row in rows:
        r = row.run
        tta = "not reached" if r.tta_s is None else f"{r.tta_s:.1f} s"
        steps = "-" if row.inner_steps_to_target is None else str(row.inner_steps_to_target)
        ratio = _ratio(float(dense.wan_bytes_sent), float(r.wan_bytes_sent))
        shown = "-" if row.mode == "dense" or ratio is None else f"{ratio:.0f}x less"
        lines.append(
            f"{row.mode:<10}{row.final_outer_steps:>6}{r.iterations:>10}{steps:>12}{tta:>16}"
            f"{r.wan_bytes_sent / 1e6:>10.1f}MB{shown:>15}{r.final_accuracy:>9.3f}"
            f"{'yes' if r.distinct_final_models == 1 else 'NO':>10}"
        )
    return "\n".join(lines)


def modes_json(rows: Sequence[ModeRow], extra: Mapping[str, Any]) -> dict[str, Any]:
    dense = rows[0].run
    out: dict[str, Any] = dict(extra)
    out["modes"] = {
        row.mode: {
            "iterations": row.run.iterations,
            "inner_steps_to_target": row.inner_steps_to_target,
            "tta_s": row.run.tta_s,
            "wan_bytes_sent": row.run.wan_bytes_sent,
            "bytes_to_target_vs_dense": _ratio(float(dense.wan_bytes_sent), float(row.run.wan_bytes_sent)),
            "tta_vs_dense": _ratio(dense.tta_s, row.run.tta_s),
            "test_accuracy": row.run.final_accuracy,
            "final_loss": row.run.final_loss,
            "final_outer_steps": row.final_outer_steps,
            "distinct_final_models": row.run.distinct_final_models,
        }
        for row in rows
    }
    return out
