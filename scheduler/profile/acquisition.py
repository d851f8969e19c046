"""Expected improvement and the paper's EI variant (StellaTrain §4.3, Algorithm 1 lines 14–15).

Standard EI asks "which (r, x) most likely beats the best point so far?" and would spend the probes near one
optimum. StellaTrain wants ḡ to be good for *every* r the scheduler might pick as the bandwidth moves, so
its variant draws r at random and lets EI choose only the batch: "randomly selects r and chooses x that
maximizes the expected decrease in the loss". The incumbent for that decrease is the GP's best predicted
value *at that r* (no probe has run at exactly this r), so EI ranks batch sizes by how much they are
expected to improve on what the model already believes is best for this compression rate.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from scipy.stats import norm

__all__ = ["batch_candidates", "choose_batch", "expected_improvement"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


def expected_improvement(mean: npt.ArrayLike, std: npt.ArrayLike, best: float, xi: float = 0.0) -> F64:
    """EI for *minimisation*: ``E[max(best − ξ − Y, 0)]`` with ``Y ~ N(mean, std²)``; 0 where std is 0."""
    mu = np.asarray(mean, dtype=np.float64)
    sd = np.asarray(std, dtype=np.float64)
    gain = best - xi - mu
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(sd > 0, gain / np.where(sd > 0, sd, 1.0), 0.0)
    ei = np.where(sd > 0, gain * norm.cdf(z) + sd * norm.pdf(z), np.maximum(gain, 0.0))
    return np.asarray(np.maximum(ei, 0.0), dtype=np.float64)


def batch_candidates(lo: int, hi: int, count: int) -> I64:
    """Up to ``count`` distinct integers in [lo, hi], log-spaced (batch effects are multiplicative)."""
    if hi - lo + 1 <= count:
        return np.arange(lo, hi + 1, dtype=np.int64)
    return np.asarray(np.unique(np.round(np.geomspace(lo, hi, count)).astype(np.int64)), dtype=np.int64)


def choose_batch(
    predict: Callable[[F64, F64], tuple[F64, F64]],
    r: float,
    candidates: I64,
    *,
    xi: float = 0.0,
) -> tuple[int, F64]:
    """The candidate batch maximising EI at compression ``r`` (ties: the smallest batch), and all EI values.

    ``predict(r_array, batch_array) -> (mean, std)`` of the modelled quantity (lower is better).
    """
    xs = np.asarray(candidates, dtype=np.float64)
    mean, std = predict(np.full_like(xs, r), xs)
    ei = expected_improvement(mean, std, float(np.min(mean)), xi)
    return int(candidates[int(np.argmax(ei))]), ei
