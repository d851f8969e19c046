"""A small discrete-time simulation of BSP iterations with AntDT's straggler injection (seed 001 §VII-A4).

It exists to measure :class:`~sims.policies.straggler_policy.StragglerPolicy` against plain BSP on virtual
time (``tools/bench_stragglers.py``); it lives beside the policy rather than in ``sims/`` only because
that folder belongs to another part of the project (move it there when convenient).

The model, one iteration at a time:

* rank i processes its batch B_i at throughput v_i (samples/s; ``heterogeneity`` spreads the v_i
  uniformly by ±h around ``base_rate``), plus a fixed ``overhead_s`` per iteration, times a multiplicative
  noise N(1, ``noise``²): ``BPT_i = (B_i / v_i + overhead)·noise + delay_i(t)``;
* AntDT's injection: ``delay = SleepDuration × Intensity`` (1.5 s × I) added to every iteration of a
  disturbed rank. *Transient* stragglers: in every 30-minute period each rank is disturbed with
  probability 0.3 for 15 minutes (here starting at a random point of the period, drawn from the seed);
  *persistent* stragglers: ranks delayed from start to end (AntDT's intensity sweep, Table III, injects
  both kinds at 1.5 s × I; its server experiment uses a constant 4 s — ``persistent_delay_s``);
* BSP: the iteration ends when the slowest rank does, ``T = max_i BPT_i``; the job is a fixed number of
  iterations with a fixed global batch, so both arms do the same work and JCT = Σ T;
* the policy arm reports every rank's BPT each iteration and runs the Controller every
  ``decision_every_s`` of virtual time; ADJUST_BS applies from the next iteration. KILL_RESTART costs
  ``restart_s`` during which the job waits (BSP cannot proceed without the rank), and the replacement
  lands on a machine without the contention: the rank's persistent delay is gone, and so is its transient
  one until the end of the current 30-minute period.

The disturbance schedule is a function of virtual time and the noise a function of the iteration index,
both seeded, so the two arms see identical conditions (a paired comparison).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from scheduler.stragglers.config import PolicyConfig
from scheduler.stragglers.decisions import AdjustBatch, KillRestart
from sims.policies.straggler_policy import StragglerPolicy
from wanrt.config import check

__all__ = ["BspSimConfig", "BspSimResult", "run", "speedup"]


@dataclass(frozen=True)
class BspSimConfig:
    ranks: int = 10
    global_batch: int = 40_960  # 4096 per rank on average, as AntDT's Criteo runs (§VII-A2)
    base_rate: float = 4096.0  # samples/s: an average rank takes ~1 s per batch
    heterogeneity: float = 0.0
    overhead_s: float = 0.0
    noise: float = 0.02
    iterations: int = 10_000
    intensity: float = 0.0
    sleep_s: float = 1.5  # AntDT SleepDuration
    period_s: float = 1800.0  # a disturbance window every 30 minutes ...
    on_s: float = 900.0  # ... lasting 15 minutes ...
    probability: float = 0.3  # ... on each rank with probability 0.3
    persistent_ranks: tuple[int, ...] = ()
    persistent_delay_s: float | None = None  # None: SleepDuration × Intensity, like the transient ones
    restart_s: float = 60.0
    decision_every_s: float = 60.0
    seed: int = 0
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    def __post_init__(self) -> None:
        check(self.ranks >= 1, "ranks", self.ranks, "≥ 1")
        check(self.global_batch >= self.ranks, "global_batch", self.global_batch, "≥ ranks")
        check(0.0 <= self.heterogeneity < 1.0, "heterogeneity", self.heterogeneity, "[0, 1)")
        check(0.0 <= self.intensity <= 1.0, "intensity", self.intensity, "[0, 1]")
        check(0.0 < self.on_s <= self.period_s, "on_s", self.on_s, "(0, period_s]")
        check(self.iterations >= 1, "iterations", self.iterations, "≥ 1")


@dataclass(frozen=True)
class BspSimResult:
    jct_s: float
    iteration_s: npt.NDArray[np.float64]
    bpt_s: npt.NDArray[np.float64]  # iterations × ranks
    batches: npt.NDArray[np.int64]  # iterations × ranks
    adjustments: int
    restarts: int


class _Schedule:
    """Which ranks are disturbed at time t: per (rank, period) a coin flip and a start offset."""

    def __init__(self, cfg: BspSimConfig) -> None:
        self.cfg = cfg
        self._rng = np.random.default_rng([cfg.seed, 1])
        self._periods: list[tuple[npt.NDArray[np.bool_], npt.NDArray[np.float64]]] = []

    def delay(self, t: float) -> npt.NDArray[np.float64]:
        c = self.cfg
        k = int(t // c.period_s)
        while len(self._periods) <= k:
            hit = self._rng.random(c.ranks) < c.probability
            start = self._rng.random(c.ranks) * (c.period_s - c.on_s)
            self._periods.append((hit, start))
        hit, start = self._periods[k]
        offset = t - k * c.period_s
        active = hit & (offset >= start) & (offset < start + c.on_s)
        return np.where(active, c.sleep_s * c.intensity, 0.0)

    def clear(self, rank: int, t: float) -> None:
        """The rank moved to another machine: no disturbance for the rest of this period."""
        self.delay(t)
        self._periods[int(t // self.cfg.period_s)][0][rank] = False


def run(cfg: BspSimConfig, *, with_policy: bool) -> BspSimResult:
    """One arm: plain BSP with even batches, or the policy deciding."""
    rng = np.random.default_rng([cfg.seed, 0])
    spread = rng.uniform(1.0 - cfg.heterogeneity, 1.0 + cfg.heterogeneity, cfg.ranks)
    rate = cfg.base_rate * spread
    noise = np.random.default_rng([cfg.seed, 2])
    schedule = _Schedule(cfg)
    names = [f"r{i}" for i in range(cfg.ranks)]
    policy = StragglerPolicy(names, cfg.global_batch, cfg=cfg.policy) if with_policy else None
    batch = np.full(cfg.ranks, cfg.global_batch // cfg.ranks, dtype=np.int64)
    batch[: cfg.global_batch - int(batch.sum())] += 1
    persistent = np.zeros(cfg.ranks)
    pdelay = cfg.sleep_s * cfg.intensity if cfg.persistent_delay_s is None else cfg.persistent_delay_s
    persistent[list(cfg.persistent_ranks)] = pdelay
    t = 0.0
    next_decision = cfg.decision_every_s
    iters = np.empty(cfg.iterations)
    bpts = np.empty((cfg.iterations, cfg.ranks))
    batches = np.empty((cfg.iterations, cfg.ranks), dtype=np.int64)
    adjustments = restarts = 0
    for it in range(cfg.iterations):
        jitter = np.maximum(1.0 + cfg.noise * noise.standard_normal(cfg.ranks), 0.1)
        bpt = (batch / rate + cfg.overhead_s) * jitter + schedule.delay(t) + persistent
        step = float(bpt.max())
        iters[it], bpts[it], batches[it] = step, bpt, batch
        t += step
        if policy is None:
            continue
        for i, name in enumerate(names):
            policy.observe_rank(name, t, float(bpt[i]), int(batch[i]))
        if t < next_decision:
            continue
        next_decision = t + cfg.decision_every_s
        for d in policy.decide_ranks(t):
            if isinstance(d, AdjustBatch):
                batch = np.array([d.batch[n] for n in names], dtype=np.int64)
                adjustments += 1
            elif isinstance(d, KillRestart):
                persistent[names.index(d.member)] = 0.0
                schedule.clear(names.index(d.member), t)
                t += cfg.restart_s
                iters[it] += cfg.restart_s
                restarts += 1
    return BspSimResult(float(iters.sum()), iters, bpts, batches, adjustments, restarts)


def speedup(cfg: BspSimConfig) -> tuple[float, BspSimResult, BspSimResult]:
    """AntDT Table III's metric: JCT(BSP) / JCT(policy) − 1 on identical conditions."""
    base = run(cfg, with_policy=False)
    ours = run(replace(cfg), with_policy=True)
    return base.jct_s / ours.jct_s - 1.0, base, ours
