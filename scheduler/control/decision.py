"""The scheduler's output: one configuration for the whole job, effective from one iteration everywhere.

A :class:`Decision` is a value: frozen, comparable, cheap to log. The policy leaves ``effective_iteration``
empty; the daemon, which knows how far the sites have got and how long an announcement takes to reach
them, fills it with :meth:`Decision.effective_from` before announcing (StellaTrain §4.1 ⑤, "from the
designated iteration"), and hands the filled decision back to the policy with ``confirm``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from wanrt.config import check

__all__ = ["Decision", "DecisionReason"]

DecisionReason = Literal["initial", "bandwidth_change", "latency_change", "periodic", "warmup_stage"]


@dataclass(frozen=True, slots=True)
class Decision:
    #: fraction of gradient elements sent per layer and iteration, in effect now (warm-up included)
    density: float
    #: the density the search chose; ``density`` converges to it when the warm-up ends
    target_density: float
    #: rank ids, ascending, and their batch sizes (same order)
    ranks: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    #: partial-staleness bound, 0 or 1 (§3.3)
    staleness: int
    #: when the policy decided (the caller's clock)
    decided_at: float
    reason: DecisionReason
    #: the bandwidth estimate the plan was made for, bit/s
    bandwidth_bps: float
    #: the model's predictions for this plan (slowest rank's compute, exchange), seconds
    predicted_compute_s: float
    predicted_exchange_s: float
    #: filled by the daemon: the first iteration this decision applies to
    effective_iteration: int | None = None

    def __post_init__(self) -> None:
        check(0.0 < self.density <= 1.0, "density", self.density, "must be in (0, 1]")
        check(0.0 < self.target_density <= 1.0, "target_density", self.target_density, "must be in (0, 1]")
        check(
            len(self.ranks) == len(self.batch_sizes) and len(self.ranks) > 0,
            "batch_sizes",
            self.batch_sizes,
            "one batch size per rank, at least one rank",
        )
        check(list(self.ranks) == sorted(set(self.ranks)), "ranks", self.ranks, "unique and ascending")
        check(all(b >= 1 for b in self.batch_sizes), "batch_sizes", self.batch_sizes, "all >= 1")
        check(self.staleness in (0, 1), "staleness", self.staleness, "must be 0 or 1")
        check(
            math.isfinite(self.bandwidth_bps) and self.bandwidth_bps > 0,
            "bandwidth_bps",
            self.bandwidth_bps,
            "must be finite and > 0",
        )
        check(
            self.effective_iteration is None or self.effective_iteration >= 0,
            "effective_iteration",
            self.effective_iteration,
            "must be >= 0",
        )

    @property
    def compression_rate(self) -> float:
        """r = 1 − density, the paper's variable."""
        return 1.0 - self.density

    @property
    def total_batch(self) -> int:
        return sum(self.batch_sizes)

    def batch_of(self, rank: int) -> int:
        return self.batch_sizes[self.ranks.index(rank)]

    def effective_from(self, iteration: int) -> Decision:
        """A copy with ``effective_iteration`` set (the daemon's part of the decision)."""
        return dataclasses.replace(self, effective_iteration=iteration)
