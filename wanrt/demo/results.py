"""What one demo run measured, the dense-vs-wanrt comparison, the printed table and the JSON.

Ratios are oriented so that bigger is better for wanrt, except ``final_loss_ratio`` (wanrt over dense,
≈ 1 means the same quality): ``tta_speedup`` = dense time-to-target / wanrt's, ``iter_speedup`` = wanrt
iterations per second / dense's, ``bytes_ratio`` = dense WAN bytes / wanrt's (both to their stop).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Comparison", "CurvePoint", "RunResult", "compare", "format_table", "write_json"]


@dataclass(frozen=True)
class CurvePoint:
    """The training-split loss after ``iteration`` steps, ``t`` seconds after the run's start."""

    t: float
    iteration: int
    loss: float
    accuracy: float


@dataclass(frozen=True)
class RunResult:
    mode: str
    iterations: int
    target_loss: float
    #: seconds from the start until the training-split loss first fell to the target; None if it never did
    tta_s: float | None
    iters_to_target: int | None
    #: seconds from the start to the end of the last step
    train_s: float
    final_loss: float
    final_accuracy: float
    curve: tuple[CurvePoint, ...]
    #: (iteration, seconds since the start) at the end of every step of the first site's leader
    step_times: tuple[tuple[int, float], ...]
    wan_bytes_sent: int
    wan_bytes_received: int
    bytes_sent_per_site: Mapping[str, int]
    rounds_completed: Mapping[str, int]
    #: how many different final parameter sets the S × R trainers ended with (1 = all identical)
    distinct_final_models: int

    @property
    def iters_per_s(self) -> float:
        return self.iterations / self.train_s if self.train_s > 0 else 0.0

    def steady_iteration_s(self, warmup: int) -> float:
        """Mean seconds per iteration after the first ``warmup`` iterations (connection set-up, first
        compressions, the pipeline filling up), from the first site leader's step times."""
        steps = [(i, t) for i, t in self.step_times if i >= warmup]
        if len(steps) < 2:
            raise ValueError(f"need at least 2 steps after {warmup} warm-up iterations, got {len(steps)}")
        (i0, t0), (i1, t1) = steps[0], steps[-1]
        return (t1 - t0) / (i1 - i0)

    @property
    def reached(self) -> bool:
        return self.tta_s is not None

    @property
    def initial_loss(self) -> float:
        return self.curve[0].loss if self.curve else math.nan

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["curve"] = [dataclasses.asdict(p) for p in self.curve]
        out["step_times"] = [list(s) for s in self.step_times]
        out["bytes_sent_per_site"] = dict(self.bytes_sent_per_site)
        out["rounds_completed"] = dict(self.rounds_completed)
        out["iters_per_s"] = self.iters_per_s
        out["reached_target"] = self.reached
        return out


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0 or not math.isfinite(num) or not math.isfinite(den):
        return None
    return num / den


@dataclass(frozen=True)
class Comparison:
    dense: RunResult
    wanrt: RunResult

    @property
    def tta_speedup(self) -> float | None:
        return _ratio(self.dense.tta_s, self.wanrt.tta_s)

    @property
    def iter_speedup(self) -> float | None:
        return _ratio(self.wanrt.iters_per_s, self.dense.iters_per_s)

    @property
    def final_loss_ratio(self) -> float | None:
        return _ratio(self.wanrt.final_loss, self.dense.final_loss)

    @property
    def bytes_ratio(self) -> float | None:
        return _ratio(float(self.dense.wan_bytes_sent), float(self.wanrt.wan_bytes_sent))

    @property
    def bytes_per_iter_ratio(self) -> float | None:
        d = _ratio(float(self.dense.wan_bytes_sent), float(self.dense.iterations))
        w = _ratio(float(self.wanrt.wan_bytes_sent), float(self.wanrt.iterations))
        return _ratio(d, w)

    @property
    def iters_to_target_ratio(self) -> float | None:
        w, d = self.wanrt.iters_to_target, self.dense.iters_to_target
        return _ratio(None if w is None else float(w), None if d is None else float(d))

    def to_json(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tta_speedup": self.tta_speedup,
            "iter_speedup": self.iter_speedup,
            "final_loss_ratio": self.final_loss_ratio,
            "bytes_ratio": self.bytes_ratio,
            "bytes_per_iter_ratio": self.bytes_per_iter_ratio,
            "iters_to_target_ratio": self.iters_to_target_ratio,
            "dense": self.dense.to_json(),
            "wanrt": self.wanrt.to_json(),
        }
        out.update(extra or {})
        return out


def compare(dense: RunResult, wanrt: RunResult) -> Comparison:
    return Comparison(dense, wanrt)


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def _x(r: float | None, better: str) -> str:
    return "n/a" if r is None else f"{r:.2f}× {better}"


def format_table(c: Comparison) -> str:
    """The side-by-side summary the demo prints."""
    d, w = c.dense, c.wanrt

    def tta(r: RunResult) -> str:
        return f"{r.tta_s:.1f} s" if r.tta_s is not None else f"not reached ({r.iterations} it)"

    def its(r: RunResult) -> str:
        return str(r.iters_to_target) if r.iters_to_target is not None else "—"

    rows = [
        (f"time to loss ≤ {d.target_loss:g}", tta(d), tta(w), _x(c.tta_speedup, "faster")),
        ("iterations to target", its(d), its(w), _x(c.iters_to_target_ratio, "(wanrt/dense)")),
        ("iterations / s", f"{d.iters_per_s:.2f}", f"{w.iters_per_s:.2f}", _x(c.iter_speedup, "faster")),
        ("WAN bytes sent", _bytes(d.wan_bytes_sent), _bytes(w.wan_bytes_sent), _x(c.bytes_ratio, "fewer")),
        (
            "WAN bytes / iteration",
            _bytes(d.wan_bytes_sent / max(d.iterations, 1)),
            _bytes(w.wan_bytes_sent / max(w.iterations, 1)),
            _x(c.bytes_per_iter_ratio, "fewer"),
        ),
        ("final train loss", f"{d.final_loss:.4f}", f"{w.final_loss:.4f}", _x(c.final_loss_ratio, "")),
        ("held-out accuracy", f"{100 * d.final_accuracy:.1f} %", f"{100 * w.final_accuracy:.1f} %", ""),
        (
            "identical final models",
            "yes" if d.distinct_final_models == 1 else f"no ({d.distinct_final_models})",
            "yes" if w.distinct_final_models == 1 else f"no ({w.distinct_final_models})",
            "",
        ),
    ]
    head = ("", "dense (DDP-like)", "wanrt", "wanrt vs dense")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(head)).rstrip()]
    lines.append("  ".join("-" * wd for wd in widths))
    lines += ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip() for r in rows]
    return "\n".join(lines)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` atomically (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
