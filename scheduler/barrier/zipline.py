"""ZipLine (seed 003, ElasticBSP §5.2–5.3): the barrier that minimises d_Z in one sorted pass.

All four functions return the same optimum (Theorem 2) and differ only in cost:

* :func:`zipline` — the one the scheduler runs: the scan of Algorithm 2 rewritten as array operations,
  O(R·n·log(R·n)) for the sort (= O(R·n·log n) whenever R ≤ n, the paper's bound) and O(R·n) after it,
  no Python loop;
* :func:`zipline_scan` — Algorithm 2 as printed: the candidate set Z kept per worker, min(Z) searched
  each step, O(R·n²);
* :func:`zipline_opt` — §5.3.1: Z kept in arrival order so min(Z) is its head; a candidate is only
  evaluated when the head leaves (Theorem 3 says the others cannot improve), O(R·n) + (1−α)·O(R·n²);
* :func:`zipline_opt_bs` — §5.3.2: Z kept sorted, the element a new arrival replaces located by binary
  search from the matrix M, O(R·n·log n).

The last three are Python loops kept as executable statements of the paper (tests and the benchmark check
them against :func:`zipline`).

How :func:`zipline` vectorises the scan. Sort Ω (ties by worker id, §5.2 Step 1). When the scan reaches
position k, Z holds each worker's latest element at or before k; element j is in Z exactly while
``j ≤ k < next(j)``, where ``next(j)`` is the position of the same worker's following element (Ω's size
if none). Elements leave Z for good and enter in position order, so min(Z) at step k is
``L(k) = min{j : next(j) > k}`` — the first index where the running maximum of ``next`` exceeds k, one
``searchsorted`` over all k at once. The cost of step k is ``t[k] − t[L(k)]``, defined once every worker
has appeared, and the first minimum is the earliest barrier (Corollary 1).
"""

from __future__ import annotations

import bisect
from collections import deque

import numpy as np
import numpy.typing as npt

from scheduler.barrier.choice import BarrierChoice, as_ends, choice_from_counts

__all__ = ["zipline", "zipline_opt", "zipline_opt_bs", "zipline_scan"]


def _sorted_omega(ends: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Ω sorted by time, ties by worker id then iteration; returns (order, position of each (p, i))."""
    flat = ends.ravel()  # row-major: flat index p·R + i grows with p, so a stable sort breaks ties by p
    order = np.argsort(flat, kind="stable")
    pos = np.empty(flat.size, dtype=np.intp)
    pos[order] = np.arange(flat.size, dtype=np.intp)
    return order, pos.reshape(ends.shape)


def zipline(ends: npt.ArrayLike) -> BarrierChoice:
    """The optimal barrier for predicted iteration ends ``ends[p, i]`` (n workers × R iterations)."""
    m = as_ends(ends)
    n, r = m.shape
    size = n * r
    order, pos = _sorted_omega(m)
    nxt = np.full((n, r), size, dtype=np.intp)
    nxt[:, :-1] = pos[:, 1:]
    running = np.maximum.accumulate(nxt.ravel()[order])
    first = int(pos[:, 0].max())  # before this position some worker has no element yet
    ks = np.arange(first, size, dtype=np.intp)
    heads = np.searchsorted(running, ks, side="right")
    t = m.ravel()[order]
    costs = t[ks] - t[heads]
    k = first + int(np.argmin(costs))
    counts = np.count_nonzero(pos <= k, axis=1)
    return choice_from_counts(m, counts, candidates=int(ks.size))


def zipline_scan(ends: npt.ArrayLike) -> BarrierChoice:
    """Algorithm 2 literally: keep Z as one element per worker, search min(Z) at every step."""
    m = as_ends(ends)
    n, r = m.shape
    order, _ = _sorted_omega(m)
    z = np.full(n, np.nan)
    count = np.zeros(n, dtype=np.intp)
    present = 0
    best: tuple[float, np.ndarray] | None = None
    evaluated = 0
    t_flat = m.ravel()
    for idx in order:
        p = int(idx) // r
        if np.isnan(z[p]):
            present += 1
        z[p] = t_flat[idx]
        count[p] = int(idx) % r + 1
        if present == n:
            evaluated += 1
            d = float(t_flat[idx] - z.min())
            if best is None or d < best[0]:
                best = (d, count.copy())
    assert best is not None
    return choice_from_counts(m, best[1], candidates=evaluated)


def zipline_opt(ends: npt.ArrayLike) -> BarrierChoice:
    """§5.3.1 ZipLineOpt: Z in arrival order; evaluate only when the oldest element is the one replaced."""
    m = as_ends(ends)
    n, r = m.shape
    order, _ = _sorted_omega(m)
    t_flat = m.ravel()
    z: deque[int] = deque()  # flat indices of Z, oldest first (hence sorted by position in Ω)
    member = np.full(n, -1, dtype=np.intp)  # flat index of worker p's element in Z, −1 if none
    best_d = np.inf
    best_flat: list[int] = []
    evaluated = 0
    for raw in order:
        idx = int(raw)
        p = idx // r
        old = int(member[p])
        evaluate = False
        if old < 0:
            evaluate = len(z) + 1 == n  # Z becomes complete: the first candidate
        elif z[0] == old:
            evaluate = len(z) == n  # case (i): the head leaves, min(Z) moves to the next element
            z.popleft()
        else:
            z.remove(old)  # case (ii): O(n) search; d cannot improve (Theorem 3), so no evaluation
        z.append(idx)
        member[p] = idx
        if evaluate:
            evaluated += 1
            d = float(t_flat[idx] - t_flat[z[0]])
            if d < best_d:
                best_d, best_flat = d, list(z)
    return choice_from_counts(m, _counts(best_flat, n, r), candidates=evaluated)


def zipline_opt_bs(ends: npt.ArrayLike) -> BarrierChoice:
    """§5.3.2 ZipLineOptBS: Z sorted by (time, worker); the replaced element found by binary search."""
    m = as_ends(ends)
    n, r = m.shape
    order, _ = _sorted_omega(m)
    t_flat = m.ravel()
    keys: list[tuple[float, int]] = []  # (time, worker) of Z, ascending: Ω's tie order
    flats: list[int] = []  # the matching flat indices
    seen = np.zeros(n, dtype=bool)
    best_d = np.inf
    best_flat: list[int] = []
    evaluated = 0
    for raw in order:
        idx = int(raw)
        p, i = divmod(idx, r)
        evaluate = False
        if not seen[p]:
            seen[p] = True
            evaluate = len(keys) + 1 == n
        else:
            prev = (float(m[p, i - 1]), p)  # the element it replaces, from M in O(1)
            at = bisect.bisect_left(keys, prev)
            evaluate = at == 0 and len(keys) == n  # the head left: min(Z) moved
            del keys[at]
            del flats[at]
        keys.append((float(t_flat[idx]), p))
        flats.append(idx)
        if evaluate:
            evaluated += 1
            d = keys[-1][0] - keys[0][0]
            if d < best_d:
                best_d, best_flat = d, list(flats)
    return choice_from_counts(m, _counts(best_flat, n, r), candidates=evaluated)


def _counts(flat_indices: list[int], n: int, r: int) -> npt.NDArray[np.intp]:
    counts = np.zeros(n, dtype=np.intp)
    for idx in flat_indices:
        p, i = divmod(idx, r)
        counts[p] = i + 1
    return counts
