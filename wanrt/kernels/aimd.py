"""The per-layer threshold ``v`` of cache-aware threshold-v and the AIMD rule that moves it (sans-IO).

StellaTrain §3.2: after each step the number of blocks that passed ``v`` is compared with the target
``k_block = k/16``; when more passed, ``v`` is *increased additively*, when fewer passed it is *decreased
multiplicatively* ("the multiplicative decrease phase ensures that the system backs off quickly"). The paper
gives neither the step sizes nor the first ``v``; here is how we fill them in, and why:

* **Aim above the target.** The controller aims the pass count at ``aim = (1 + headroom) * k_block`` and the
  compressor keeps the largest ``cap`` (default ``k_block``) of the blocks that passed, so a payload holds
  exactly the top ``k_block`` blocks (the paper's "selects the top k/16 cache-aligned blocks") whenever the
  pass count lands anywhere in ``[k_block, buffer]``. Payload size then does not wobble with ``v``, which
  matters because the scheduler sized the compression rate to the WAN bandwidth (§4).
* **Additive increase by a measured step.** When at least ``aim`` blocks passed, the compressor holds all of
  their block sums, so it knows exactly the threshold ``v_aim`` that would have passed ``aim`` blocks *this*
  step; ``v`` is raised by the gap ``v_aim - v`` (>= 0). Raising by a fixed constant instead would either
  crawl (the tail of block sums is steep: 1 % in ``v`` can move the count by 20 % for Gaussian gradients)
  or overshoot.
* **Multiplicative decrease when too few passed.** Then the blocks below ``v`` were never looked at and the
  right ``v`` is unknown, so ``v`` backs off by ``beta = (count/aim) ** (1/steepness)``, clipped to
  ``[md_floor, md_ceiling]``: the measured elasticity of the count w.r.t. ``v`` (probed from the passing
  block sums at ``probe_ratio``) makes the back-off as large as needed, the clip keeps it bounded.
* **Trend.** Gradient magnitudes drift over training (typically shrinking many-fold); a controller that only
  reacts lags a steady drift by one step forever. The log-change of ``v_aim`` per step is smoothed (EWMA,
  ``trend_weight``) and applied to the next ``v``, so a steady drift is tracked without lag.
* **Safety net.** Nothing passing, or more passing than the candidate buffer holds, makes the compressor do
  one exact selection over all block sums (a second pass, bounded and rare); that also measures ``v_aim``
  exactly and re-anchors ``v``.
* **First v** comes from a partial selection: the matching quantile of the sums of a random sample of blocks
  (:func:`initial_threshold`); when the target is too rare for the sample to see, the first step is exact.

Everything here is arithmetic on counts and sums the compressor measured: no arrays, no clocks, no I/O, so
the rule is unit-testable on synthetic observations and runs unchanged in the simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wanrt.kernels.config import CompressorConfig

__all__ = [
    "FLT_MAX",
    "FLT_MIN",
    "SelectionTargets",
    "ThresholdState",
    "initial_threshold",
    "on_measured",
    "on_short",
    "targets",
]

#: ``v`` never goes below the smallest normal fp32, so an all-zero block (sum 0) never passes.
FLT_MIN = float(np.finfo(np.float32).tiny)
FLT_MAX = float(np.finfo(np.float32).max)
#: elasticity assumed before the first measurement (a moderately heavy-tailed gradient)
_DEFAULT_STEEPNESS = 4.0
#: measured elasticities are clipped to this range (beyond 64 a 1 % step in v is already >50 % in count)
_STEEPNESS_RANGE = (0.5, 64.0)


def _f32(v: float) -> float:
    """Clamp to [FLT_MIN, FLT_MAX] and round to fp32, the precision every path compares in."""
    return float(np.float32(min(max(v, FLT_MIN), FLT_MAX)))


@dataclass(frozen=True)
class SelectionTargets:
    """Block counts derived from a layer's size and the density."""

    k_block: int
    aim: int
    cap: int
    buffer: int
    n_blocks: int

    @property
    def dense(self) -> bool:
        """True when the payload cap already covers every block (nothing to threshold)."""
        return self.cap >= self.n_blocks


def targets(dense_len: int, block_size: int, density: float, cfg: CompressorConfig) -> SelectionTargets:
    """k_block = ceil(round(density * numel) / block_size), and the aim, cap and buffer derived from it."""
    nb = -(-dense_len // block_size)
    k = max(1, round(density * dense_len))
    kb = min(nb, max(1, -(-k // block_size)))
    aim = min(nb, math.ceil((1.0 + cfg.headroom) * kb))
    cap = min(nb, math.ceil(cfg.cap_factor * kb))
    buffer = min(nb, max(aim, cap, math.ceil(cfg.buffer_factor * aim)))
    return SelectionTargets(kb, aim, cap, buffer, nb)


@dataclass
class ThresholdState:
    """What the controller remembers about one layer between steps."""

    v: float
    log_drift: float = 0.0
    last_aim_v: float | None = None
    steps_since_aim: int = 0
    steepness: float | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "v": self.v,
            "log_drift": self.log_drift,
            "last_aim_v": self.last_aim_v,
            "steps_since_aim": self.steps_since_aim,
            "steepness": self.steepness,
        }


def initial_threshold(
    sorted_desc_sample: npt.NDArray[np.float32], n_blocks: int, aim: int, cfg: CompressorConfig
) -> float | None:
    """First ``v`` from a random sample of block sums (sorted descending), or None to select exactly.

    The ``aim/n_blocks`` quantile of the population is estimated by the same quantile of the sample; when
    fewer than ``min_sample_rank`` sampled blocks are expected above it, the estimate is mostly noise.
    """
    s = len(sorted_desc_sample)
    if s == 0:
        return None
    rank = aim * s / n_blocks
    if rank < cfg.min_sample_rank:
        return None
    return _f32(float(sorted_desc_sample[min(s - 1, math.ceil(rank) - 1)]))


def _elasticity(count_at: int, count_above: int, ratio: float) -> float:
    """-(d ln count / d ln v) estimated from the counts at v and at v*ratio."""
    if count_at <= 0:
        return _DEFAULT_STEEPNESS
    sigma = math.log(count_at / max(count_above, 0.5)) / math.log(ratio)
    return min(max(sigma, _STEEPNESS_RANGE[0]), _STEEPNESS_RANGE[1])


def on_measured(
    st: ThresholdState, aim_v: float, aim: int, count_above_probe: int, cfg: CompressorConfig
) -> None:
    """At least ``aim`` blocks passed (or an exact pass ran): ``aim_v`` passes exactly ``aim`` of them.

    Additive increase to the measured level, then the smoothed per-step trend. ``aim_v <= FLT_MIN`` means
    fewer than ``aim`` blocks are nonzero at all: v drops to the floor and the trend is forgotten.
    """
    st.steepness = _elasticity(aim, count_above_probe, cfg.probe_ratio)
    if aim_v <= FLT_MIN:
        st.v, st.last_aim_v, st.log_drift, st.steps_since_aim = FLT_MIN, None, 0.0, 0
        return
    if st.last_aim_v is not None and cfg.trend_weight > 0:
        d = math.log(aim_v / st.last_aim_v) / max(1, st.steps_since_aim)
        st.log_drift += cfg.trend_weight * (d - st.log_drift)
    st.last_aim_v = aim_v
    st.steps_since_aim = 1
    st.v = _f32(aim_v * math.exp(st.log_drift))


def on_short(st: ThresholdState, count: int, aim: int, count_above_probe: int, cfg: CompressorConfig) -> None:
    """Fewer than ``aim`` blocks passed: multiplicative decrease sized by the (measured) elasticity."""
    if count >= 8:
        st.steepness = _elasticity(count, count_above_probe, cfg.probe_ratio)
    sigma = st.steepness if st.steepness is not None else _DEFAULT_STEEPNESS
    beta = (max(count, 0.5) / aim) ** (1.0 / sigma)
    beta = min(max(beta, cfg.md_floor), cfg.md_ceiling)
    st.v = _f32(st.v * beta)
    st.steps_since_aim += 1
