"""Local micro-steps per site chosen by ElasticBSP's ZipLine (seed 003, §3–4): a sans-IO policy object.

Why: every WAN iteration is one step at every site, so a fast site idles at the WAN barrier while a slow
one computes (BSP's waiting), and ADJUST_BS cannot grow a memory-bound site's per-step batch (AntDT §IV-E
Eq. 4 answers with gradient-accumulation steps instead). ElasticBSP places the barrier where the workers'
predicted iteration ends are closest and lets each worker run as many local iterations as fit before it;
in wanrt a site runs ``local_steps`` k micro-steps (gradients accumulated) per WAN iteration, so the k's
ZipLine picks are the ``iterations`` of its :class:`~scheduler.barrier.choice.BarrierChoice`.

Prediction (§4, "a stable environment"): from a common barrier start t0 = 0, site s's j-th micro-step ends
at ``j · interval_s`` (j = 1..R), interval_s = the median of its last ``window`` per-micro-step compute
times (``trainer.micro_step_s``, the WAN iteration's compute / k: the median so one slow report does not
move the barrier).

Choice: ZipLine minimises the absolute wait d_Z and takes the earliest barrier among equal ones (Corollary
1). With measured (never exactly commensurate) intervals the absolute minimum is often a far barrier (0.1 s
vs 0.29 s: 29 and 10 steps, d_Z = 0 s, against 3 and 1 steps, d_Z = 0.01 s), which multiplies the samples
and the gradients' age per WAN iteration for a saving nobody notices. So ZipLine runs for each lookahead
r = 1..R (each site at most r micro-steps) and the smallest r wins whose waiting share d_Z / t_sync is
within ``wait_slack`` of the best share over all r: the earliest barrier that is as good as any, up to the
slack. R (``lookahead``) therefore bounds the fastest site's k, and every site's k, so the samples of one
WAN iteration are at most R × today's.

Learning rate (STAR §IV-C, "scaling learning rate after switching": r_new = (M_new / M) · r_SSGD, after
Goyal et al. 2017's linear scaling rule): k's > 1 make one WAN iteration average S = Σ_s k_s·b_s·ranks_s
samples instead of S_base = Σ_s b_s·ranks_s, so its update is a larger batch's, with a smaller variance, at
the same step size. Each announcement of k's carries the job's ``lr_scale`` = S / S_base (``linear``), its
square root (``sqrt``: the variance-matching rule often used for adaptive optimizers), or nothing
(``none``), capped at ``max_lr_scale``; k = 1 everywhere gives 1 again (:func:`lr_scale_for`).

Hysteresis (a dead band): the k's in force stay while their waiting share, under the current intervals,
is within ``wait_slack`` + ``min_gain`` of the best share any barrier reaches; only beyond it new k's are
proposed (each change costs a two-phase announcement and shifts the batch weights). Noise in the intervals
then does not re-announce; a straggler that appears or recovers (a share of tens of %) does.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np

from scheduler.barrier.choice import BarrierChoice
from scheduler.barrier.elastic import predict_ends
from scheduler.barrier.zipline import zipline
from wanrt.config import check
from wanrt.errors import LocalProtocolError
from wanrt.protocol.job_settings import MAX_LOCAL_STEPS, MAX_LR_SCALE

__all__ = [
    "LR_SCALINGS",
    "LocalStepsChoice",
    "LocalStepsConfig",
    "LocalStepsPolicy",
    "best_share",
    "choose_local_steps",
    "lr_scale_for",
    "wait_share",
]

#: the per-micro-step times a site keeps (more is no better a median and only lags a real change)
MAX_WINDOW: Final = 1024
#: how the job's learning rate follows the samples per WAN iteration (see the module docstring)
LR_SCALINGS: Final = ("linear", "sqrt", "none")
LrScaling = Literal["linear", "sqrt", "none"]


@dataclass(frozen=True)
class LocalStepsConfig:
    """``[scheduler.stragglers.local_steps]``: ZipLine-chosen local micro-steps per site (off by default).

    * ``enabled`` — announce ``local_steps@<site>`` (and the matching ``batch_weight@<site>``).
    * ``lookahead`` — R, ElasticBSP's predicted iterations per worker; 15 is the paper's SmallR (Table 2).
      It is also the largest k any site gets.
    * ``window`` — per-micro-step times per site whose median is its interval.
    * ``wait_slack`` — the waiting share (d_Z / t_sync) an earlier barrier may exceed the best by (10 %:
      a median of 8 samples of a ±10 % noisy time is off by a few %, and a barrier's share moves with it).
    * ``min_gain`` — how much more than the choice's slack the k's in force may wait before new ones are
      announced (10 %: the dead band is best + 20 %).
    * ``lr_scaling`` — the job's ``lr_scale`` announced with the k's: ``linear`` (STAR §IV-C), ``sqrt``
      or ``none`` (no ``lr_scale`` announced: the one in force stays). ``none`` by default, from the
      end-to-end measurement (docs/local_steps.md): on the emulated-straggler demo, whose SGD rate 0.3 is
      already near the largest stable one, ``linear`` (×6.5–7) diverged and ``sqrt`` (×2.5) oscillated and
      took 1.4–1.5× as long; with a rate of 0.1 (headroom) both cut the time to target (sqrt 1.8–1.9×,
      linear 1.6–1.7×). The scheduler cannot see the headroom, so the user opts in.
    * ``max_lr_scale`` — the cap on that scale: a safety bound, not a tuned value. With R = 15 and equal
      sites linear scaling could ask for ~15×; the most any rule asked for in the runs measured was 7.
    """

    enabled: bool = False
    lookahead: int = 15
    window: int = 8
    wait_slack: float = 0.1
    min_gain: float = 0.1
    lr_scaling: LrScaling = "none"
    max_lr_scale: float = 8.0

    def __post_init__(self) -> None:
        check(type(self.enabled) is bool, "enabled", self.enabled, "true or false")
        check(
            type(self.lookahead) is int and 1 <= self.lookahead <= MAX_LOCAL_STEPS,
            "lookahead",
            self.lookahead,
            f"an integer in [1, {MAX_LOCAL_STEPS}] (the trainers' local_steps bound)",
        )
        check(
            type(self.window) is int and 1 <= self.window <= MAX_WINDOW,
            "window",
            self.window,
            f"an integer in [1, {MAX_WINDOW}]",
        )
        for key in ("wait_slack", "min_gain"):
            value = getattr(self, key)
            check(math.isfinite(value) and 0.0 <= value < 1.0, key, value, "a fraction in [0, 1)")
        check(self.lr_scaling in LR_SCALINGS, "lr_scaling", self.lr_scaling, " or ".join(LR_SCALINGS))
        cap = self.max_lr_scale
        ok = isinstance(cap, (int, float)) and not isinstance(cap, bool) and math.isfinite(cap)
        check(
            ok and 1.0 <= cap <= MAX_LR_SCALE,
            "max_lr_scale",
            cap,
            f"a number in [1, {MAX_LR_SCALE:g}] (the trainers' lr_scale bound)",
        )


@dataclass(frozen=True)
class LocalStepsChoice:
    """The chosen k per site, the barrier's predicted waiting share and the ZipLine choice behind it."""

    steps: dict[str, int]
    share: float
    barrier: BarrierChoice


def wait_share(intervals: Sequence[float], steps: Sequence[int]) -> float:
    """d_Z / t_sync of a superstep where site s runs ``steps[s]`` micro-steps of ``intervals[s]`` seconds:
    the share of the superstep the first site to arrive waits."""
    arrivals = [k * t for k, t in zip(steps, intervals, strict=True)]
    top = max(arrivals)
    return 0.0 if top <= 0 else (top - min(arrivals)) / top


def choose_local_steps(intervals: Sequence[float], lookahead: int, wait_slack: float) -> BarrierChoice:
    """ZipLine over predicted ends ``j · interval_s`` for each lookahead r = 1..R; the smallest r whose
    waiting share is within ``wait_slack`` of the best (see the module docstring)."""
    t = np.asarray(intervals, dtype=np.float64)
    if t.ndim != 1 or t.size < 1 or not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise LocalProtocolError("micro-step intervals must be finite and > 0", value=str(intervals)[:80])
    ends = predict_ends(np.zeros_like(t), t, lookahead)
    choices = [zipline(ends[:, :r]) for r in range(1, lookahead + 1)]
    shares = [c.wait / c.t_sync if c.t_sync > 0 else 0.0 for c in choices]
    best = min(shares)
    return next(c for c, s in zip(choices, shares, strict=True) if s <= best + wait_slack)


def lr_scale_for(samples: float, base_samples: float, rule: LrScaling, cap: float) -> float | None:
    """The job's learning-rate factor when a WAN iteration averages ``samples`` instead of the
    ``base_samples`` of k = 1 (STAR §IV-C's r_new = (M_new / M) · r for ``linear``; its square root for
    ``sqrt``), at most ``cap``; None for ``none`` (announce nothing)."""
    if rule == "none":
        return None
    if not (math.isfinite(samples) and math.isfinite(base_samples) and samples > 0 and base_samples > 0):
        raise LocalProtocolError(
            "samples per WAN iteration must be finite and > 0", value=(samples, base_samples)
        )
    ratio = samples / base_samples
    scale = ratio if rule == "linear" else math.sqrt(ratio)
    return float(min(cap, scale))


def best_share(intervals: Sequence[float], lookahead: int) -> float:
    """The least waiting share any barrier within the lookahead reaches."""
    t = np.asarray(intervals, dtype=np.float64)
    ends = predict_ends(np.zeros_like(t), t, lookahead)
    return min(
        (c.wait / c.t_sync if c.t_sync > 0 else 0.0)
        for c in (zipline(ends[:, :r]) for r in range(1, lookahead + 1))
    )


class LocalStepsPolicy:
    """Per-site micro-step times in, ``local_steps`` per site out (only when they should change)."""

    def __init__(self, sites: Sequence[str], cfg: LocalStepsConfig | None = None) -> None:
        self.cfg = cfg or LocalStepsConfig()
        self.sites = tuple(sorted(sites))
        self._times: dict[str, deque[float]] = {s: deque(maxlen=self.cfg.window) for s in self.sites}
        #: the k's in force (committed decisions; 1 = every trainer's default)
        self.running: dict[str, int] = dict.fromkeys(self.sites, 1)
        self._known: set[str] = set()  # sites whose k in force is known (reported or committed)
        self.last_choice: LocalStepsChoice | None = None

    def observe(self, site: str, micro_step_s: float, now: float, steps: float | None = None) -> None:
        """One WAN iteration of ``site``: its compute time per micro-step, and the k it reports running.
        The reported k is taken once, before any commit (a restarted scheduler learns the k's in force);
        after that the commits say it, since reports of the old k go on until the effective iteration.
        (``now`` is unused: the intervals are a window of iterations, not of time.)"""
        del now
        if site not in self._times:
            return
        if site not in self._known and steps is not None and math.isfinite(steps):
            self.running[site] = min(MAX_LOCAL_STEPS, max(1, int(steps)))
            self._known.add(site)
        if not math.isfinite(micro_step_s) or micro_step_s <= 0:
            return
        self._times[site].append(float(micro_step_s))

    def intervals(self) -> dict[str, float] | None:
        """Each site's predicted micro-step interval (median of its window), None until every site has one."""
        if any(not w for w in self._times.values()):
            return None
        return {s: float(np.median(np.fromiter(w, dtype=np.float64))) for s, w in self._times.items()}

    def decide(self, now: float) -> dict[str, int] | None:
        """The k per site to announce, or None (no data yet, or no change worth ``min_gain``)."""
        del now
        iv = self.intervals()
        if iv is None:
            return None
        times = [iv[s] for s in self.sites]
        choice = choose_local_steps(times, self.cfg.lookahead, self.cfg.wait_slack)
        steps = dict(zip(self.sites, choice.iterations, strict=True))
        share = wait_share(times, choice.iterations)
        self.last_choice = LocalStepsChoice(steps, share, choice)
        if steps == self.running:
            return None
        # dead band: the k's in force stay while they wait at most min_gain more than the choice may
        now_share = wait_share(times, [self.running[s] for s in self.sites])
        if now_share <= best_share(times, self.cfg.lookahead) + self.cfg.wait_slack + self.cfg.min_gain:
            return None
        return steps

    def committed(self, steps: Mapping[str, int]) -> None:
        """These k's run from the decision's effective iteration (a manual change too)."""
        for s, k in steps.items():
            if s in self.running:
                self.running[s] = int(k)
                self._known.add(s)
