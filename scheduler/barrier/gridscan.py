"""The baselines ZipLine is measured against (seed 003, ElasticBSP §5.1): GridScan, FullGridScan, naive.

GridScan takes one *designated* element, and from every other worker's row the element closest to it,
as a candidate Z. The paper's Algorithm 1 is not in our copy of the text; "close" is read here as *the
earliest element at or after the designated one*. That reading makes the designated element min(Z), and it
is what makes FullGridScan the exhaustive method the paper calls it (§6.1.1): if Z* is optimal and m its
earliest element, designating m picks in every row an element no later than Z*'s, so d ≤ d_{Z*}.

* :func:`grid_scan` — designated row = the worker with the earliest first end (Algorithm 1 line 4), its R
  elements as designated: R candidates, not optimal in general;
* :func:`full_grid_scan` — every row designated: R·n candidates, optimal. The paper scans each other row
  linearly, O(R²·n²); here each row is binary-searched for all R·n designated values at once,
  O(R·n²·log R), same candidates, same answer;
* :func:`naive_search` — every one of the R^n sets Z; only for tiny cases (tests).
"""

from __future__ import annotations

import itertools
from typing import Final

import numpy as np
import numpy.typing as npt

from scheduler.barrier.choice import BarrierChoice, as_ends, choice_from_counts
from wanrt.errors import ConfigError

__all__ = ["MAX_NAIVE_SETS", "full_grid_scan", "grid_scan", "naive_search"]

#: R^n sets are enumerated one by one in Python; beyond this a test would take minutes.
MAX_NAIVE_SETS: Final = 200_000


def grid_scan(ends: npt.ArrayLike) -> BarrierChoice:
    """Algorithm 1: the designated row is the one with the earliest first predicted end."""
    m = as_ends(ends)
    n, r = m.shape
    designated = m[int(np.argmin(m[:, 0]))]
    # before[q, j] = how many of row q's ends precede designated[j]: all rows, all R values at once, O(R²n)
    before = np.count_nonzero(m[:, :, None] < designated[None, None, :], axis=1)
    valid = np.all(before < r, axis=0)
    picks = m[np.arange(n)[:, None], np.minimum(before, r - 1)]
    return _best(m, designated, picks.max(axis=0), valid)


def full_grid_scan(ends: npt.ArrayLike) -> BarrierChoice:
    """FullGridScan: every element of every row designated in turn (exhaustive)."""
    m = as_ends(ends)
    r = m.shape[1]
    designated = m.ravel()
    t_sync = np.full(designated.size, -np.inf)
    valid = np.ones(designated.size, dtype=bool)
    for q in range(m.shape[0]):  # one row against all R·n designated values: memory stays O(R·n)
        idx = np.searchsorted(m[q], designated, side="left")
        valid &= idx < r
        np.maximum(t_sync, m[q, np.minimum(idx, r - 1)], out=t_sync)
    return _best(m, designated, t_sync, valid)


def _best(
    m: npt.NDArray[np.float64],
    designated: npt.NDArray[np.float64],
    t_sync: npt.NDArray[np.float64],
    valid: npt.NDArray[np.bool_],
) -> BarrierChoice:
    """Pick the cheapest candidate, then the earliest barrier (Corollary 1), and rebuild its picks.

    A designated element's candidate is, per row, the first end at or after it (its own row included:
    that is the element itself or an equal earlier one); a row with nothing there leaves no candidate.
    """
    costs = np.where(valid, t_sync - designated, np.inf)
    best = int(np.lexsort((t_sync, costs))[0])
    counts = np.count_nonzero(m < designated[best], axis=1) + 1
    return choice_from_counts(m, counts, candidates=int(np.count_nonzero(valid)))


def naive_search(ends: npt.ArrayLike) -> BarrierChoice:
    """All R^n candidate sets (§5.1 naive search); the reference for tiny cases."""
    m = as_ends(ends)
    n, r = m.shape
    if r**n > MAX_NAIVE_SETS:
        raise ConfigError(f"R^n must be ≤ {MAX_NAIVE_SETS} for the naive search", key="ends", value=(n, r))
    best: tuple[float, float, tuple[int, ...]] | None = None
    rows = np.arange(n)
    for combo in itertools.product(range(r), repeat=n):
        vals = m[rows, combo]
        key = (float(vals.max() - vals.min()), float(vals.max()), combo)
        if best is None or key[:2] < best[:2]:
            best = key
    assert best is not None
    return choice_from_counts(m, np.asarray(best[2], dtype=np.intp) + 1, candidates=r**n)
