"""The (pre-conditioned) gradient noise scale φ that STAR's progress model needs (STAR §IV-C, Eq. 1–3).

STAR counts the updates a synchronisation mode needs for a given progress as ``n_u = 1 + φ / b`` for an
update built from b samples, with φ the pre-conditioned gradient noise scale (PGNS)
``φ = tr(P Σ Pᵀ) / |P g|²`` (Σ the per-sample gradient covariance, g the true gradient; McCandlish et al.
2018, "An Empirical Model of Large-Batch Training"; Pollux, OSDI '21). STAR pre-computes φ per model;
wanrt estimates it online instead, the way McCandlish et al. do in their Appendix A.1, from gradients that
exist anyway: each site leader holds its site's gradient (a *small* batch b_i) and the job's average over
all sites (the *big* batch B = Σ b_i). For a mean of b i.i.d. per-sample gradients
``E|G_b|² = |G|² + tr(Σ)/b``, so two batch sizes give two equations:

    S    = (mean_i |G_i|² − |G_B|²) / (mean_i 1/b_i − 1/B)       (unbiased estimate of tr Σ)
    |G|² = |G_B|² − S / B                                          (unbiased estimate of |G|²)

Both are noisy; as McCandlish et al. advise, each is smoothed by an exponential moving average (with
bias correction for the first steps) and only then divided: ``φ = S̄ / |G|²̄``. A diagonal pre-conditioner
(e.g. Adam's 1/√v̂) is applied to the gradients first when given, which turns the simple noise scale into
the PGNS. The scheduler needs only the squared norms, so leaders can send three floats per step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from scheduler.stragglers.config import NoiseConfig
from wanrt.errors import ConfigError, LocalProtocolError

__all__ = ["NoiseScale", "noise_scale_terms"]


def noise_scale_terms(
    small_sq: Sequence[float], small_batch: Sequence[int], big_sq: float, big_batch: int
) -> tuple[float, float]:
    """One step's unbiased (tr Σ, |G|²) estimates from the sites' and the job's squared gradient norms."""
    if len(small_sq) == 0 or len(small_sq) != len(small_batch):
        raise ConfigError("one squared norm per site batch is needed", key="small_sq")
    inv_small = float(np.mean([1.0 / b for b in small_batch]))
    gap = inv_small - 1.0 / big_batch
    if not gap > 0:
        raise ConfigError(
            "the big batch must be larger than the small ones", key="big_batch", value=big_batch
        )
    s = (float(np.mean(small_sq)) - big_sq) / gap
    g2 = big_sq - s / big_batch
    return s, g2


class NoiseScale:
    """Online φ estimate from per-site gradient statistics."""

    def __init__(self, cfg: NoiseConfig | None = None) -> None:
        self.cfg = cfg or NoiseConfig()
        self._s = 0.0
        self._g2 = 0.0
        self._weight = 0.0  # Σ of EMA weights so far, for bias correction
        self.steps = 0

    def observe_norms(
        self, small_sq: Sequence[float], small_batch: Sequence[int], big_sq: float, big_batch: int
    ) -> None:
        """Squared norms |G_i|² of each site's gradient (batch b_i) and |G_B|² of their weighted mean."""
        values = [*small_sq, big_sq]
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise LocalProtocolError("squared gradient norms must be finite and ≥ 0", value=values)
        s, g2 = noise_scale_terms(small_sq, small_batch, big_sq, big_batch)
        beta = self.cfg.ema
        self._s = beta * self._s + (1.0 - beta) * s
        self._g2 = beta * self._g2 + (1.0 - beta) * g2
        self._weight = beta * self._weight + (1.0 - beta)
        self.steps += 1

    def observe_gradients(
        self,
        site_grads: Sequence[npt.ArrayLike],
        site_batches: Sequence[int],
        precondition: npt.ArrayLike | None = None,
    ) -> None:
        """Full gradients (one flat vector per site, each the mean over that site's batch)."""
        if len(site_grads) < 2 or len(site_grads) != len(site_batches):
            raise ConfigError("at least two site gradients with their batch sizes", key="site_grads")
        grads = [np.asarray(g, dtype=np.float64).ravel() for g in site_grads]
        if precondition is not None:
            p = np.asarray(precondition, dtype=np.float64).ravel()
            grads = [p * g for g in grads]
        b = np.asarray(site_batches, dtype=np.float64)
        big = np.sum([bi * g for bi, g in zip(b, grads, strict=True)], axis=0) / b.sum()
        self.observe_norms([float(g @ g) for g in grads], list(site_batches), float(big @ big), int(b.sum()))

    @property
    def trace(self) -> float:
        """Smoothed tr(Σ) estimate (0 before any step)."""
        return self._s / self._weight if self._weight else 0.0

    @property
    def grad_sq(self) -> float:
        """Smoothed |G|² estimate (0 before any step)."""
        return self._g2 / self._weight if self._weight else 0.0

    @property
    def phi(self) -> float:
        """φ = tr Σ / |G|² (the configured initial value before any step; ≥ 0)."""
        if not self._weight:
            return self.cfg.initial
        s, g2 = max(self.trace, 0.0), self.grad_sq
        if g2 <= 0.0:
            # the true gradient is lost in the noise: every extra sample helps; report a large finite φ so
            # the progress model stays comparable instead of producing inf − inf
            return 1e12 if s > 0 else self.cfg.initial
        return s / g2
