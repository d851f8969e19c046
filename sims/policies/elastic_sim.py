"""A small virtual-time simulation of WAN supersteps: BSP, ADJUST_BS and ZipLine-chosen local steps
(ElasticBSP §4) side by side on the same heterogeneous sites and the same noise (``tools/bench_stragglers.py``
part 7, key ``elastic_wait_reduction``).

The model, one WAN round at a time:

* site s runs micro-steps of its per-step batch b_s at throughput v_s (samples/s); a micro-step takes
  ``b_s / v_s`` times a noise N(1, ``noise``²) (clipped at 0.5) drawn per site and micro-step from the seed,
  the same draws in every arm (a paired comparison: arm A's j-th micro-step of site s is arm B's);
* a round ends when the last site finishes its micro-steps (the WAN barrier), then the exchange takes
  ``exchange_s`` (the WAN; every arm pays it once per round);
* waiting = the site-seconds spent idle at the barrier, ``Σ_s (max_s' C_s' − C_s)``. Its share of the
  compute phase's site-seconds, ``Σ_s (max − C_s) / (n · max)``, is the quantity every arm is compared by:
  per unit of computing time, so an arm with longer rounds is not credited for having fewer of them;
* arms: **bsp** (k = 1, today's batches); **adjust_bs** (AntDT Eq. 3: per-step batches ∝ v_s with the
  global batch kept, no memory bound); **adjust_bs_capped** (the same with each per-step batch ≤ today's,
  a memory-bound GPU: with the global batch kept nothing can move); **elastic** (today's batches, k_s from
  :class:`~scheduler.barrier.local_steps_policy.LocalStepsPolicy` fed with ``warmup`` BSP rounds of noisy
  per-micro-step times, then fixed).

Samples/s counts every micro-step's batch over the rounds' compute and exchange time. More samples per WAN
round are not free in convergence (a larger effective batch, older gradients at the barrier); this sim
measures only time and waiting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from scheduler.barrier.local_steps_policy import LocalStepsConfig, LocalStepsPolicy
from scheduler.stragglers.batch_alloc import allocate_greedy
from wanrt.config import check

__all__ = ["ArmResult", "ElasticSimConfig", "run_elastic_sim"]


@dataclass(frozen=True)
class ElasticSimConfig:
    #: samples/s per site: one 3× slower site, one 2×, two fast ones (a typical mixed-generation job)
    rates: tuple[float, ...] = (320.0, 320.0, 160.0, 107.0)
    batch: int = 32  # per-step batch at every site (already at the GPU's memory bound in the capped arm)
    noise: float = 0.05
    exchange_s: float = 0.3
    rounds: int = 400
    warmup: int = 16
    seed: int = 0
    local_steps: LocalStepsConfig = field(default_factory=lambda: LocalStepsConfig(enabled=True))

    def __post_init__(self) -> None:
        check(len(self.rates) >= 1 and min(self.rates) > 0, "rates", self.rates, "one rate > 0 per site")
        check(self.batch >= 1, "batch", self.batch, "≥ 1")
        check(0.0 <= self.noise < 0.5, "noise", self.noise, "[0, 0.5)")
        check(self.exchange_s >= 0.0, "exchange_s", self.exchange_s, "≥ 0 s")
        check(self.rounds >= 1 and self.warmup >= 1, "rounds", self.rounds, "rounds, warmup ≥ 1")


@dataclass(frozen=True)
class ArmResult:
    wait_share: float  # idle site-seconds at the barrier / the compute phase's site-seconds
    wait_per_round_s: float  # idle site-seconds per round, averaged over sites
    samples_per_s: float
    batches: tuple[int, ...]
    steps: tuple[int, ...]


def _noise(cfg: ElasticSimConfig, max_steps: int) -> npt.NDArray[np.float64]:
    """rounds × sites × micro-steps multipliers, one draw per (round, site, micro-step) for every arm."""
    rng = np.random.default_rng(cfg.seed)
    draws = rng.normal(1.0, cfg.noise, size=(cfg.rounds, len(cfg.rates), max_steps))
    return np.maximum(draws, 0.5)


def _arm(
    cfg: ElasticSimConfig,
    noise: npt.NDArray[np.float64],
    batches: npt.NDArray[np.int64],
    steps: npt.NDArray[np.int64],
) -> ArmResult:
    v = np.asarray(cfg.rates, dtype=np.float64)
    micro = batches / v  # seconds per micro-step
    mask = np.arange(noise.shape[2])[None, :] < steps[:, None]  # sites × micro-steps actually run
    compute = (noise * mask[None, :, :]).sum(axis=2) * micro[None, :]  # rounds × sites
    top = compute.max(axis=1)
    idle = (top[:, None] - compute).sum(axis=1)
    n = len(cfg.rates)
    samples = float((batches * steps).sum()) * cfg.rounds
    return ArmResult(
        wait_share=float(idle.sum() / (n * top.sum())),
        wait_per_round_s=float(idle.mean() / n),
        samples_per_s=samples / float((top + cfg.exchange_s).sum()),
        batches=tuple(int(b) for b in batches),
        steps=tuple(int(k) for k in steps),
    )


def _elastic_steps(cfg: ElasticSimConfig) -> npt.NDArray[np.int64]:
    """What the scheduler would announce after ``warmup`` BSP rounds of noisy per-micro-step telemetry."""
    sites = [f"s{i}" for i in range(len(cfg.rates))]
    pol = LocalStepsPolicy(sites, cfg.local_steps)
    rng = np.random.default_rng(cfg.seed + 1_000_003)  # telemetry noise, apart from the run's
    for r in range(cfg.warmup):
        for s, v in zip(sites, cfg.rates, strict=True):
            pol.observe(s, cfg.batch / v * max(0.5, float(rng.normal(1.0, cfg.noise))), float(r))
    chosen = pol.decide(float(cfg.warmup)) or pol.running
    return np.array([chosen[s] for s in sites], dtype=np.int64)


def run_elastic_sim(cfg: ElasticSimConfig) -> dict[str, ArmResult]:
    """Every arm on the same sites and noise."""
    n = len(cfg.rates)
    today = np.full(n, cfg.batch, dtype=np.int64)
    ones = np.ones(n, dtype=np.int64)
    total = int(today.sum())
    adjusted = allocate_greedy(np.asarray(cfg.rates), total, lo=1)
    capped = allocate_greedy(np.asarray(cfg.rates), total, lo=1, hi=today)
    steps = _elastic_steps(cfg)
    noise = _noise(cfg, int(steps.max()))
    return {
        "bsp": _arm(cfg, noise, today, ones),
        "adjust_bs": _arm(cfg, noise, np.asarray(adjusted, dtype=np.int64), ones),
        "adjust_bs_capped": _arm(cfg, noise, np.asarray(capped, dtype=np.int64), ones),
        "elastic": _arm(cfg, noise, today, steps),
    }
