"""What the search needs to know about convergence: ḡ(r, Σx), the relative loss penalty (StellaTrain §4.3).

The real ḡ is the Gaussian-process surrogate that ``wanrt profile`` fits and saves
(:class:`scheduler.profile.surrogate.ConvergenceProfile`); both it and the analytic stand-in here satisfy
:class:`ConvergenceModel`, so the search, the simulator and the tests take either.

:class:`PowerLawConvergence` is a *stand-in*, for simulations and for a job started without a profile. Its
form follows two well-known empirical laws rather than anything the paper states:

* batch: past the critical batch size, the samples needed to reach a loss grow about linearly with the
  batch (McCandlish et al., "An Empirical Model of Large-Batch Training", 2018), so the penalty of a batch
  relative to a reference batch is ``batch_coef · (Σx / batch_ref − 1)``;
* compression: with error feedback, what is not sent is only delayed, and the delay of a coordinate grows
  as the density ``d = 1 − r`` falls; measured penalties grow far slower than the ``1/d`` of worst-case
  analyses, so the stand-in uses ``density_coef · (d^−p − 1)`` with a small exponent ``p``.

Its constants are inputs, not results: a benchmark that uses it says so next to the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from wanrt.config import check

__all__ = ["ConvergenceModel", "PowerLawConvergence"]


@runtime_checkable
class ConvergenceModel(Protocol):
    """ḡ(r, Σx) and what the search must know about where it is valid."""

    def penalty(self, r: npt.ArrayLike, total_batch: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """ḡ at each (r, Σx) pair (broadcast): extra loss relative to the profile's baseline, ≥ −1."""
        ...

    @property
    def total_batch_range(self) -> tuple[float, float]:
        """The Σx over which ḡ was measured; the search does not extrapolate beyond it."""
        ...

    @property
    def staleness_penalty(self) -> float | None:
        """Relative loss penalty of staleness 1 over 0 at the same (r, Σx); None if not measured."""
        ...


@dataclass(frozen=True)
class PowerLawConvergence:
    """ḡ = batch_coef·(Σx/batch_ref − 1) + density_coef·((1 − r)^−p − 1); see the module docstring."""

    batch_coef: float = 0.2
    batch_ref: float = 128.0
    density_coef: float = 0.05
    density_exponent: float = 0.5
    min_total_batch: float = 4.0
    max_total_batch: float = 1024.0
    staleness: float | None = 0.0
    #: past ``batch_ref`` the samples grow at least in proportion to the batch (iterations do not fall):
    #: what a job whose learning rate was tuned at ``batch_ref`` and is not scaled with the batch shows
    #: (the demo's MLP at lr 0.3: 165 steps to its target at Σx = 192, 247 at 768; docs/demo.md)
    fixed_lr: bool = False

    def __post_init__(self) -> None:
        check(self.batch_coef >= 0, "batch_coef", self.batch_coef, "must be >= 0")
        check(self.batch_ref > 0, "batch_ref", self.batch_ref, "must be > 0")
        check(self.density_coef >= 0, "density_coef", self.density_coef, "must be >= 0")
        check(0 <= self.density_exponent <= 4, "density_exponent", self.density_exponent, "in [0, 4]")
        check(
            0 < self.min_total_batch <= self.max_total_batch,
            "max_total_batch",
            self.max_total_batch,
            "need 0 < min_total_batch <= max_total_batch",
        )

    def penalty(self, r: npt.ArrayLike, total_batch: npt.ArrayLike) -> npt.NDArray[np.float64]:
        d = np.clip(1.0 - np.asarray(r, dtype=np.float64), 1e-6, 1.0)
        x = np.asarray(total_batch, dtype=np.float64)
        gb = self.batch_coef * (x / self.batch_ref - 1.0)
        if self.fixed_lr:
            gb = np.maximum(gb, x / self.batch_ref - 1.0)
        g = gb + self.density_coef * (d**-self.density_exponent - 1.0)
        return np.asarray(g, dtype=np.float64)

    @property
    def total_batch_range(self) -> tuple[float, float]:
        """With ``fixed_lr``, nothing past ``batch_ref``: the iterations would not fall, and what a batch
        the learning rate was not tuned for costs beyond its compute is unmeasured (the demo's MLP: 1.5×
        the steps at 4× the batch), so the search, which does not extrapolate ḡ, stays below it."""
        hi = min(self.max_total_batch, self.batch_ref) if self.fixed_lr else self.max_total_batch
        return self.min_total_batch, max(hi, self.min_total_batch)

    @property
    def staleness_penalty(self) -> float | None:
        return self.staleness

    @classmethod
    def from_critical_batch(
        cls,
        critical_batch: float,
        batch_ref: float,
        *,
        fixed_lr: bool = False,
        density_coef: float = 0.05,
        density_exponent: float = 0.5,
    ) -> PowerLawConvergence:
        """The stand-in whose batch term is McCandlish et al.'s: samples to a loss ∝ 1 + Σx / B_noise.

        Relative to ``batch_ref`` that is ``1 + ḡ = (B_noise + Σx) / (B_noise + batch_ref)``, i.e.
        ``batch_coef = batch_ref / (B_noise + batch_ref)``: far below the critical batch a larger batch cuts
        the iterations in proportion, far above it the iterations stay the same and every extra sample is
        compute for nothing. The defaults (512, 128) give the stand-in's long-standing 0.2. ``fixed_lr``: see
        the field."""
        check(critical_batch > 0, "standin_critical_batch", critical_batch, "must be > 0")
        check(batch_ref > 0, "standin_batch_ref", batch_ref, "must be > 0")
        return cls(
            batch_coef=batch_ref / (critical_batch + batch_ref),
            batch_ref=batch_ref,
            fixed_lr=fixed_lr,
            density_coef=density_coef,
            density_exponent=density_exponent,
        )
