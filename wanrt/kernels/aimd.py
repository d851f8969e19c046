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
* **Trend and margin.** Gradient magnitudes drift over training (typically shrinking many-fold), and with
  error feedback the accumulated gradient grows for the first steps; a controller that only reacts lags a
  steady drift by one step forever. The log-change of ``v_aim`` per step is smoothed (EWMA,
  ``trend_weight``), damped (``trend_damping``, so a decelerating drift is not overshot) and applied to the
  next ``v``; and ``v`` is set ``margin_sigmas`` standard deviations of the recent prediction error below
  the prediction (at most what lets the count reach ``sqrt(buffer_factor)`` × aim), so a volatile layer
  passes more candidates — still trimmed to the cap — instead of falling short.
* **Safety net.** Nothing passing, fewer passing than ``fill_floor × k_block``, or more passing than the
  candidate buffer holds, makes the compressor do one exact selection over all block sums (a second pass,
  bounded); that also measures ``v_aim`` exactly and re-anchors ``v``. The floor is what makes the payload
  carry the density it was given: with error feedback on a steady gradient the residual's block sums pile
  up against a cliff (the tail's measured elasticity sits at its 64 clip), where a 1 % error in ``v``
  moves the count by half, and a threshold predicted from the last step alone sent 2–457 of 625 blocks in
  3–4 steps of 20 (docs/kernels.md, "Holding the density").
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
    "targets",
    "update",
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
    #: fewest passing blocks a step may send without selecting again exactly (``fill_floor * k_block``)
    floor: int = 1

    @property
    def dense(self) -> bool:
        """True when the payload cap already covers every block (nothing to threshold)."""
        return self.cap >= self.n_blocks


def targets(dense_len: int, block_size: int, density: float, cfg: CompressorConfig) -> SelectionTargets:
    """k_block = ceil(round(density * numel) / block_size), and the aim, cap and buffer derived from it.

    ``aim = (1 + headroom) * k_block + margin_sigmas * sqrt(k_block)``, ``cap = cap_factor * k_block``,
    ``buffer = buffer_factor * aim``, all capped at the number of blocks.
    """
    nb = -(-dense_len // block_size)
    k = max(1, round(density * dense_len))
    kb = min(nb, max(1, -(-k // block_size)))
    # Poisson noise of a count around kb is ~sqrt(kb): aim that many standard deviations higher too, so a
    # small layer (kb of a few dozen blocks) does not fall short every other step by chance alone
    aim = min(nb, math.ceil((1.0 + cfg.headroom) * kb + cfg.margin_sigmas * math.sqrt(kb)))
    cap = min(nb, math.ceil(cfg.cap_factor * kb))
    buffer = min(nb, max(aim, cap, math.ceil(cfg.buffer_factor * aim)))
    floor = min(kb, max(1, math.ceil(cfg.fill_floor * kb)))
    return SelectionTargets(kb, aim, cap, buffer, nb, floor)


@dataclass
class ThresholdState:
    """What the controller remembers about one layer between steps (all in log space where it matters)."""

    v: float
    #: smoothed per-step change of log(v_aim): the trend
    log_drift: float = 0.0
    #: smoothed squared error of the one-step-ahead prediction of log(v_aim): the volatility
    err_var: float = 0.0
    #: log(v_aim) measured or estimated at the previous step, and the prediction made for this step
    last_log_aim: float | None = None
    pred_log_aim: float | None = None
    #: -(d ln count / d ln v) of the block-sum tail, last measured
    steepness: float | None = None

    def as_dict(self) -> dict[str, float | None]:
        return {
            "v": self.v,
            "log_drift": self.log_drift,
            "err_var": self.err_var,
            "last_log_aim": self.last_log_aim,
            "pred_log_aim": self.pred_log_aim,
            "steepness": self.steepness,
        }

    @classmethod
    def from_dict(cls, d: dict[str, float | None]) -> ThresholdState:
        def opt(name: str) -> float | None:
            x = d.get(name)
            return None if x is None else float(x)

        v = d["v"]
        if v is None:
            raise ValueError("v is missing")
        return cls(
            v=float(v),
            log_drift=float(d.get("log_drift") or 0.0),
            err_var=float(d.get("err_var") or 0.0),
            last_log_aim=opt("last_log_aim"),
            pred_log_aim=opt("pred_log_aim"),
            steepness=opt("steepness"),
        )


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
    sigma = math.log(count_at / max(count_above, 0.5)) / math.log(ratio)
    return min(max(sigma, _STEEPNESS_RANGE[0]), _STEEPNESS_RANGE[1])


def update(
    st: ThresholdState,
    count: int,
    aim_v: float | None,
    count_above_probe: int,
    t: SelectionTargets,
    cfg: CompressorConfig,
) -> None:
    """Move ``st.v`` after a step in which ``count`` blocks passed it.

    ``aim_v`` is the exact threshold that would have passed ``t.aim`` blocks this step when it is known
    (``count >= aim``, or an exact pass ran), else None; ``count_above_probe`` counts the passing blocks at
    ``probe_ratio`` times ``aim_v`` (or ``v`` when ``aim_v`` is None).
    """
    v = st.v
    if aim_v is not None:
        st.steepness = _elasticity(t.aim, count_above_probe, cfg.probe_ratio)
    elif count >= 8:
        st.steepness = _elasticity(count, count_above_probe, cfg.probe_ratio)
    sigma = st.steepness if st.steepness is not None else _DEFAULT_STEEPNESS
    if aim_v is not None and aim_v <= FLT_MIN:
        # fewer than `aim` nonzero blocks: pass all of them; forget trend and volatility
        st.v, st.log_drift, st.err_var, st.last_log_aim, st.pred_log_aim = FLT_MIN, 0.0, 0.0, None, None
        return
    # log(v_aim) this step: measured, or (too few passed) extrapolated below v by the elasticity
    est = math.log(aim_v) if aim_v is not None else math.log(v) + math.log(max(count, 0.5) / t.aim) / sigma
    w = cfg.trend_weight
    if st.pred_log_aim is not None:
        st.err_var += w * ((est - st.pred_log_aim) ** 2 - st.err_var)
    if st.last_log_aim is not None:
        st.log_drift += w * ((est - st.last_log_aim) - st.log_drift)
    st.last_log_aim = est
    st.pred_log_aim = est + st.log_drift
    if aim_v is not None:  # at least `aim` passed: additive increase by the measured gap aim_v - v >= 0
        level = aim_v
    elif count < t.k_block:  # too few: multiplicative decrease, sized by the estimate, clipped
        level = v * min(max(math.exp(est) / v, cfg.md_floor), cfg.md_ceiling)
    else:  # the payload is full but fewer than `aim` passed: a small decrease to the estimate
        level = min(v, math.exp(est))
    # then anticipate: the smoothed trend, minus a margin of the recent prediction error — at most what
    # lets the expected count reach sqrt(buffer_factor) x aim, so the margin alone never overflows
    margin = min(cfg.margin_sigmas * math.sqrt(st.err_var), math.log(cfg.buffer_factor) / (2.0 * sigma))
    st.v = _f32(level * math.exp(cfg.trend_damping * st.log_drift - margin))
