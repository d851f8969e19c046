"""The answer every barrier search returns, and the one validation of its input.

ElasticBSP (seed 003, §4.1 Problem 1): each of n workers has R predicted iteration-end times
``S^p = {e_1^p, ..., e_R^p}``; a candidate Z takes one element per worker, costs ``d_Z = max(Z) − min(Z)``
(how long the first worker to arrive waits, τ_wait^b) and puts the barrier at ``t_sync = max(Z)``. Among
equal costs the earliest barrier wins (§4.2, Corollary 1: an earlier barrier leaves less stale gradients).
All search methods share this type so they can be compared field by field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from wanrt.errors import ConfigError

__all__ = ["MAX_ELEMENTS", "BarrierChoice", "as_ends", "choice_from_counts"]

#: n·R above this is refused: the searches hold a few arrays of n·R elements, and 10^7 (80 MB per array)
#: is already far beyond the paper's largest case (n = 1000, R = 150 → 1.5·10^5).
MAX_ELEMENTS: Final = 10_000_000

Ends = npt.NDArray[np.float64]


@dataclass(frozen=True)
class BarrierChoice:
    """Where to put the next barrier.

    ``iterations[p]`` is how many of worker p's predicted iterations end at or before the barrier (1..R),
    i.e. the local steps p runs in this superstep; ``arrivals[p]`` is when p reaches the barrier
    (``ends[p, iterations[p] − 1]``). ``wait`` is the paper's objective d_Z; ``total_wait`` adds every
    worker's idle time (Σ_p t_sync − arrival_p), reported for context only.
    """

    t_sync: float
    wait: float
    iterations: tuple[int, ...]
    arrivals: tuple[float, ...]
    total_wait: float
    candidates: int  # candidate sets Z whose cost the method evaluated

    @property
    def key(self) -> tuple[float, float]:
        """(d_Z, t_sync): the order in which two choices compare (smaller is better)."""
        return (self.wait, self.t_sync)


def as_ends(ends: npt.ArrayLike) -> Ends:
    """Check ``ends`` (n × R, finite, each row non-decreasing) and return it as a float64 array."""
    arr = np.asarray(ends, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ConfigError("ends must be an n × R array with n, R ≥ 1", key="ends", value=arr.shape)
    if arr.size > MAX_ELEMENTS:
        raise ConfigError(f"n·R must be ≤ {MAX_ELEMENTS}", key="ends", value=arr.shape)
    if not np.all(np.isfinite(arr)):
        raise ConfigError("ends must be finite", key="ends")
    if arr.shape[1] > 1 and np.any(np.diff(arr, axis=1) < 0):
        raise ConfigError("each worker's predicted ends must be non-decreasing", key="ends")
    return arr


def choice_from_counts(ends: Ends, counts: npt.NDArray[np.intp], candidates: int) -> BarrierChoice:
    """Build the choice from how many of each worker's iterations precede the barrier."""
    arrivals = ends[np.arange(ends.shape[0]), counts - 1]
    t_sync = float(arrivals.max())
    return BarrierChoice(
        t_sync=t_sync,
        wait=t_sync - float(arrivals.min()),
        iterations=tuple(int(c) for c in counts),
        arrivals=tuple(float(a) for a in arrivals),
        total_wait=float(np.sum(t_sync - arrivals)),
        candidates=candidates,
    )
