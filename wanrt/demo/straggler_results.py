"""``wanrt demo --straggler``'s comparison: the same slowed site, mitigation off (``wanrt``) and on
(``mitigated``: the scheduler's straggler policy), side by side.

``straggler_tta_gain`` = time-to-target with mitigation off / on (> 1: ADJUST_BS helped); the benchmark key
``emulated_straggler_tta_gain`` in tools/bench_stragglers.py is this ratio over a persistent straggler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from wanrt.demo.results import RunResult
from wanrt.protocol.job_settings import per_site

__all__ = ["StragglerComparison", "format_straggler_table"]


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den <= 0 else num / den


@dataclass(frozen=True)
class StragglerComparison:
    straggler: str
    off: RunResult
    on: RunResult

    @property
    def tta_gain(self) -> float | None:
        return _ratio(self.off.tta_s, self.on.tta_s)

    @property
    def iter_speedup(self) -> float | None:
        return _ratio(self.on.iters_per_s, self.off.iters_per_s)

    @property
    def iters_ratio(self) -> float | None:
        """Iterations to target, on / off (≈ 1: moving samples between sites did not cost convergence)."""
        on, off = self.on.iters_to_target, self.off.iters_to_target
        return _ratio(None if on is None else float(on), None if off is None else float(off))

    def first_adjust_s(self) -> float | None:
        """When the first committed decision changed a batch size (seconds after the start)."""
        for d in self.on.commits:
            if d.values and per_site(d.values, "batch_size"):
                return d.t
        return None

    def to_json(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {
            "straggler": self.straggler,
            "straggler_tta_gain": self.tta_gain,
            "straggler_iter_speedup": self.iter_speedup,
            "straggler_iters_ratio": self.iters_ratio,
            "first_adjust_s": self.first_adjust_s(),
            "off": self.off.to_json(),
            "on": self.on.to_json(),
            **(extra or {}),
        }


def _batches(r: RunResult) -> str:
    return " ".join(f"{s} {b}" for s, b in sorted(r.final_batch.items()))


def _num(v: float | None, fmt: str, unit: str = "") -> str:
    return "—" if v is None else f"{v:{fmt}}{unit}"


def format_straggler_table(c: StragglerComparison) -> str:
    def its(r: RunResult) -> str:
        return "—" if r.iters_to_target is None else str(r.iters_to_target)

    rows = [
        ("", "mitigation off", "mitigation on", "on vs off"),
        (
            f"time to loss ≤ {c.off.target_loss:g}",
            _num(c.off.tta_s, ".1f", " s"),
            _num(c.on.tta_s, ".1f", " s"),
            _num(c.tta_gain, ".2f", "× faster"),
        ),
        ("iterations to target", its(c.off), its(c.on), _num(c.iters_ratio, ".2f", "×")),
        (
            "iterations / s",
            f"{c.off.iters_per_s:.2f}",
            f"{c.on.iters_per_s:.2f}",
            _num(c.iter_speedup, ".2f", "× faster"),
        ),
        ("batch / rank (end)", _batches(c.off), _batches(c.on), ""),
        ("first ADJUST_BS", "—", _num(c.first_adjust_s(), ".1f", " s"), ""),
        ("scheduler decisions", "—", f"{len(c.on.commits)} committed", ""),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    gain = c.tta_gain
    lines.append(
        f"straggler {c.straggler}: mitigation "
        + (
            "could not be compared (a run missed the target)"
            if gain is None
            else f"{gain:.2f}× faster to target"
        )
    )
    return "\n".join(lines)
