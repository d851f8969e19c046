"""The terms of StellaTrain's objective (Eq. 1–6, §4.2), vectorised over candidate configurations.

Shapes: per-rank arrays have the ranks on the last axis; everything broadcasts, so the search evaluates
thousands of (total batch, allocation, r) candidates in one call.

* Eq. 2/iteration time: ``t_i = x_i / f_i(x_i) = max(α_i/β_i, x_i/β_i)``.
* Eq. 3, the coefficient of variation ``σ/μ`` of the ``t_i``. The paper prints the numerator as
  ``sqrt(Σ t_i² − (Σ t_i)²)``, which is negative under the root for any two positive times; we use what
  the text says it is, the population standard deviation over the mean.
* Eq. 4, global iteration speed ``Σx_i · f_k(x_k)/x_k = Σx_i / max_i t_i`` (the slowest rank paces all).
* Eq. 5, TTA per sample ``(1 + ḡ(r, Σx)) / (Eq. 4)``.
* Eq. 6, ``r ≥ 1 − B/m · t_i``: the compressed exchange must fit in the compute time. ``m`` is the bytes
  the exchange would move uncompressed (parameters × bytes per kept element, so that ``(1 − r)·m`` is the
  payload), ``B`` is in bytes/s here (callers hold bit/s and divide by 8).
* Eq. 1, ``TTA + λ·CV``, with TTA divided by the ideal ``1/Σβ_i`` (every GPU saturated, no penalty) so that
  λ weighs two dimensionless numbers; the paper leaves the scale of λ open.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = [
    "G_FLOOR",
    "coefficient_of_variation",
    "eq6_r_lower_bound",
    "global_speed",
    "iteration_times",
    "objective",
    "tta_per_sample",
]

F64 = npt.NDArray[np.float64]

#: ḡ is a relative loss difference and may be negative (a configuration better than the profile's
#: baseline); ``1 + ḡ`` is kept above this so a noisy surrogate cannot make TTA zero or negative
G_FLOOR = -0.95


def iteration_times(alpha: npt.ArrayLike, beta: npt.ArrayLike, x: npt.ArrayLike) -> F64:
    """``x_i / f_i(x_i)`` (Eq. 2), seconds of compute per iteration, ranks on the last axis."""
    a = np.asarray(alpha, dtype=np.float64)
    b = np.asarray(beta, dtype=np.float64)
    xv = np.asarray(x, dtype=np.float64)
    return np.maximum(a / b, xv / b)


def coefficient_of_variation(t: npt.ArrayLike) -> F64:
    """Eq. 3: population standard deviation over mean of the per-rank iteration times (last axis)."""
    tv = np.asarray(t, dtype=np.float64)
    mean = tv.mean(axis=-1)
    return np.asarray(tv.std(axis=-1) / mean, dtype=np.float64)


def global_speed(x: npt.ArrayLike, t: npt.ArrayLike) -> F64:
    """Eq. 4: samples per second of the whole job, ``Σx_i / max_i t_i``."""
    xv = np.asarray(x, dtype=np.float64)
    tv = np.asarray(t, dtype=np.float64)
    return np.asarray(xv.sum(axis=-1) / tv.max(axis=-1), dtype=np.float64)


def tta_per_sample(g: npt.ArrayLike, speed: npt.ArrayLike) -> F64:
    """Eq. 5: seconds per sample scaled by the convergence penalty, ``(1 + ḡ) / speed``."""
    gv = np.maximum(np.asarray(g, dtype=np.float64), G_FLOOR)
    return np.asarray((1.0 + gv) / np.asarray(speed, dtype=np.float64), dtype=np.float64)


def eq6_r_lower_bound(bandwidth_bytes_per_s: npt.ArrayLike, model_bytes: float, t: npt.ArrayLike) -> F64:
    """Eq. 6: the smallest compression rate whose payload ``(1 − r)·m`` moves within ``t`` at ``B``."""
    bv = np.asarray(bandwidth_bytes_per_s, dtype=np.float64)
    tv = np.asarray(t, dtype=np.float64)
    return np.asarray(1.0 - bv / model_bytes * tv, dtype=np.float64)


def objective(g: npt.ArrayLike, speed: npt.ArrayLike, cv: npt.ArrayLike, beta_sum: float, lam: float) -> F64:
    """Eq. 1 with normalised TTA: ``(Eq. 5) · Σβ_i + λ · (Eq. 3)``."""
    return np.asarray(
        tta_per_sample(g, speed) * beta_sum + lam * np.asarray(cv, dtype=np.float64), dtype=np.float64
    )
