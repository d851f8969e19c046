"""Density warm-up: start training dense-ish and decay to the searched density over the first iterations.

StellaTrain searches one density from the bandwidth alone; it has no warm-up. We add one because early
gradients change fast — the loss falls steeply and the gradient's direction and scale move from one step to
the next — so what error feedback holds back goes stale before it is sent, and a stale, accumulated
residual applied late is what produces loss spikes. Deep Gradient Compression (Lin et al., ICLR 2018,
"warm-up training") raises sparsity exponentially over the first epochs for exactly this reason (75 % →
93.75 % → … → 99.9 %), and wanrt's own demo shows a loss spike at a fixed density with staleness 1
(docs/demo.md, "Loss spikes": a late layer applied together with the next).

The schedule is geometric in ``warmup_stages`` equal stages over ``warmup_iterations``: stage ``k`` uses
``d_start · (d_target / d_start)^(k / stages)``, and from ``warmup_iterations`` on the searched density.
Stages rather than a smooth curve because every change of density is a decision announced to every site
for a common iteration; four announcements over the warm-up cost nothing, one per iteration would. A
searched density above the start density (a fast link) wins: warm-up never compresses *more*.
"""

from __future__ import annotations

from scheduler.control.config import SchedulerConfig

__all__ = ["DensityWarmup"]


class DensityWarmup:
    """The staged warm-up schedule; pure function of the iteration (and the config)."""

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.cfg = config if config is not None else SchedulerConfig()

    @property
    def iterations(self) -> int:
        return self.cfg.warmup_iterations

    def stage(self, iteration: int) -> int | None:
        """The warm-up stage ``iteration`` falls in, or None once the warm-up is over (or off)."""
        w = self.cfg.warmup_iterations
        if w <= 0 or iteration >= w:
            return None
        return min(max(iteration, 0) * self.cfg.warmup_stages // w, self.cfg.warmup_stages - 1)

    def stage_start(self, stage: int) -> int:
        """The first iteration of ``stage`` (the effective iteration a stage's decision aims at)."""
        return -(-stage * self.cfg.warmup_iterations // self.cfg.warmup_stages)

    def density(self, iteration: int, target_density: float) -> float:
        """The density to use at ``iteration`` when the searched density is ``target_density``."""
        k = self.stage(iteration)
        start = self.cfg.warmup_start_density
        if k is None or target_density >= start:
            return target_density
        return float(start * (target_density / start) ** (k / self.cfg.warmup_stages))
