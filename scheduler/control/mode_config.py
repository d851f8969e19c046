"""The mode choice's knobs (TOML ``[scheduler.mode]``): which exchange modes the scheduler may pick, their
candidates, and the measured convergence factors its cost model weighs them by (docs/scheduler.md, "The
mode choice"; :mod:`scheduler.control.mode_cost`).

Every default is either a measurement (named, with the run that made it) or a cited value; a key exists so
that another workload's measurement replaces ours without code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final, Literal

from wanrt.config import check
from wanrt.protocol.job_settings import MAX_FRAGMENTS, MAX_OUTER_STEPS, OUTER_CODINGS

__all__ = ["MODES", "Mode", "ModeConfig"]

#: per-step sparse exchange (wanrt's StellaTrain loop), DiLoCo (arXiv 2311.08105: H inner steps, then one
#: outer step on the averaged pseudo-gradient), Streaming DiLoCo (arXiv 2501.18512: the model in F fragments,
#: each synchronised in turn and overlapped with the next inner steps)
Mode = Literal["per_step", "diloco", "streaming"]
MODES: Final[tuple[Mode, ...]] = ("per_step", "diloco", "streaming")

#: Inner steps to the target loss over per-step exchange's (density 0.02, fp32), per pseudo-gradient coding
#: at each candidate H of :attr:`ModeConfig.outer_steps`: measured in process on the demo's link-bound
#: workload (MLP width 2048, 3 sites × batch 64, SGD lr 0.3, target train loss 0.1, seed 0) by
#: tools/outer_convergence.py, outer Nesterov lr 0.7 / momentum 0.9 (DiLoCo §3's values); fp32 dense, the
#: low-bit codings at the pseudo-gradient density of :attr:`ModeConfig.outer_density`. Per-step exchange
#: took 105 inner steps there (density 0.02 and dense alike); the outer loop is evaluated at outer steps
#: only, so each entry is an upper bound within H steps (docs/scheduler.md, "The mode choice", has the
#: table). Below 1: on this workload DiLoCo reaches the loss in fewer inner steps (each site's inner
#: steps are full SGD steps, and the outer Nesterov step extrapolates their average).
MEASURED_STEPS_FACTOR: Final[dict[str, tuple[float, ...]]] = {
    "fp32": (0.381, 0.533, 0.61, 0.914, 1.219),
    "int8": (0.724, 0.99, 1.524, 2.438, 3.048),
    "int4": (0.724, 0.99, 1.371, 2.438, 3.048),
    "int2": (0.686, 0.914, 1.524, 2.438, 2.438),
}


@dataclass(frozen=True)
class ModeConfig:
    """``[scheduler.mode]``: the scheduler's choice between per-step exchange and an outer loop.

    * ``enabled`` — off by default: the scheduler then never announces ``outer_steps``/``fragments``.
    * ``modes`` — the modes it may choose (a trainer without an outer loop allows only ``per_step``).
    * ``outer_steps`` / ``fragments`` — the candidate H's and fragment counts (DiLoCo's H = 500 and
      Streaming DiLoCo's P of a few are for LLM steps of seconds; the demo's steps take tens of ms).
    * ``codings`` — the pseudo-gradient value codings it may choose (wanrt/codec/lowbit.py).
    * ``outer_density`` — each coding's pseudo-gradient density: fp32/fp16 dense as in DiLoCo; the low-bit
      codings sparse at 3 % as SparseLoCo (arXiv 2508.15706: 1–3 % with 2-bit values).
    * ``steps_factor`` — per coding, one factor per ``outer_steps`` candidate: inner steps to the target
      over per-step exchange's (:data:`MEASURED_STEPS_FACTOR`; > 1 = the convergence penalty of a larger H
      or fewer bits, < 1 = the outer loop converges in fewer steps).
    * ``stream_factor`` — streaming's steps over DiLoCo's at the same H and coding. Not measured here (no
      streaming loop when this was written); 1.0 follows Streaming DiLoCo (arXiv 2501.18512), which reports
      its loss on par with DiLoCo's at the same H.
    * ``overlap_steps`` — the inner steps a fragment's exchange may overlap (the paper's τ; its delayed
      application is what makes the overlap free of a stall).
    * ``sum_value_bytes`` — bytes per value of a sum of two or more sites' payloads: the gateways sum in
      fp32 (docs/codec.md, "Summed on the way"), so a low-bit payload comes back at 4 bytes per value,
      unless the gateways re-code results (``[gateway.rounds] result_coding = "wire"``): then the
      coding's, e.g. 2/8 + 1/16 for int2 with a scale per 16 values.
    * ``switch_gain`` — a new mode must be predicted this much faster than the running one to replace it
      (hysteresis: a switch costs an outer step's progress and a round of announcements).
    * ``replan_change`` — re-plan when the bandwidth or the step time moved this fraction since the plan.
    * ``per_step_coding`` — the wire dtype the trainers' per-step exchange runs (fixed at connect).
    """

    enabled: bool = False
    modes: tuple[Mode, ...] = MODES
    outer_steps: tuple[int, ...] = (4, 8, 16, 32, 64)
    fragments: tuple[int, ...] = (2, 4)
    codings: tuple[str, ...] = ("fp32", "int8", "int4", "int2")
    outer_density: dict[str, float] = field(
        default_factory=lambda: {"fp32": 1.0, "fp16": 1.0, "int8": 0.03, "int4": 0.03, "int2": 0.03}
    )
    steps_factor: dict[str, tuple[float, ...]] = field(default_factory=lambda: dict(MEASURED_STEPS_FACTOR))
    stream_factor: float = 1.0
    overlap_steps: int = 1
    sum_value_bytes: float = 4.0
    switch_gain: float = 0.10
    replan_change: float = 0.25
    per_step_coding: str = "fp32"
    block_size: int = 16
    scale_block: int = 16

    def __post_init__(self) -> None:
        check(bool(self.modes) and set(self.modes) <= set(MODES), "modes", self.modes, f"some of {MODES}")
        check(len(set(self.modes)) == len(self.modes), "modes", self.modes, "each mode once")
        hs = self.outer_steps
        ok_h = all(type(h) is int and 2 <= h <= MAX_OUTER_STEPS for h in hs)
        check(bool(hs) and ok_h, "outer_steps", hs, f"integers in [2, {MAX_OUTER_STEPS}]")
        check(list(hs) == sorted(set(hs)), "outer_steps", hs, "ascending, each once")
        fs = self.fragments
        ok_f = all(type(f) is int and 2 <= f <= MAX_FRAGMENTS for f in fs)
        check(bool(fs) and ok_f, "fragments", fs, f"integers in [2, {MAX_FRAGMENTS}]")
        check(bool(self.codings) and set(self.codings) <= set(OUTER_CODINGS), "codings", self.codings, "")
        for c in self.codings:
            d = self.outer_density.get(c)
            check(d is not None and 0 < d <= 1, f"outer_density.{c}", d, "a density in (0, 1]")
            row = self.steps_factor.get(c)
            check(
                row is not None and len(row) == len(hs),
                f"steps_factor.{c}",
                row,
                f"one factor per outer_steps candidate ({len(hs)})",
            )
            assert row is not None
            good = all(math.isfinite(x) and 0 < x <= 1000 for x in row)
            check(good, f"steps_factor.{c}", row, "factors in (0, 1000]")
        check(0 < self.stream_factor <= 1000, "stream_factor", self.stream_factor, "in (0, 1000]")
        check(0 <= self.overlap_steps <= 64, "overlap_steps", self.overlap_steps, "in [0, 64]")
        check(0 < self.sum_value_bytes <= 8, "sum_value_bytes", self.sum_value_bytes, "in (0, 8]")
        check(0 <= self.switch_gain <= 10, "switch_gain", self.switch_gain, "in [0, 10]")
        check(0 < self.replan_change <= 10, "replan_change", self.replan_change, "in (0, 10]")
        check(self.per_step_coding in OUTER_CODINGS, "per_step_coding", self.per_step_coding, "a coding")
        check(1 <= self.block_size <= 4096, "block_size", self.block_size, "in [1, 4096]")
        check(1 <= self.scale_block <= 4096, "scale_block", self.scale_block, "in [1, 4096]")
