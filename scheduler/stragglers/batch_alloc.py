"""ADJUST_BS: split a fixed global batch so the slowest rank finishes first (AntDT Eq. 2–4, seed 001).

AntDT §VI-A3 models a rank's batch processing time as linear in its batch, ``F(B_i) = B_i / v_i`` (their
Fig. 7), and minimises the slowest one, Eq. 2: ``min max_i B_i / v_i`` s.t. ``Σ B_i = B``. With a latent
z it becomes Eq. 3: ``min z`` s.t. ``z ≥ B_i / v_i``, ``Σ B_i = B`` — a mixed-integer program because
batch sizes are whole samples.

* :func:`allocate_continuous` — Eq. 3 relaxed: ``B_i ∝ v_i`` (clipped to the bounds by water-filling);
* :func:`allocate_greedy` — exact integer optimum: the continuous floors, then the remaining samples one at
  a time to the rank that would finish the extra sample first. Exact because handing out samples in
  increasing order of their completion time ``k / v_i`` (k-th sample of rank i) takes the B smallest such
  times, which minimises the largest; the floors are a prefix of that order;
* :func:`allocate_milp` — Eq. 3 as written, solved by ``scipy.optimize.milp`` (HiGHS);
* :func:`allocate_accumulation` — Eq. 4 (AntDT-DD, dedicated clusters with k device types): each type
  runs ``C_k`` accumulation steps of micro-batch ``B_k`` between synchronisations,
  ``min max_k C_k·B_k / v_k`` s.t. ``Σ_k n_k·C_k·B_k = B``, ``B̂_k^min ≤ B_k ≤ B̂_k^max``,
  ``Ĉ^min ≤ C_k ≤ Ĉ^max``. The product C_k·B_k is linearised exactly with one binary per (k, c) choice
  and the micro-batch carried in the chosen slot, then solved by ``milp``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.optimize import Bounds, LinearConstraint, milp

from wanrt.errors import ConfigError

__all__ = [
    "AccumulationPlan",
    "DeviceGroup",
    "allocate_accumulation",
    "allocate_continuous",
    "allocate_greedy",
    "allocate_milp",
    "makespan",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def _inputs(
    throughput: npt.ArrayLike, total: int, lo: npt.ArrayLike | int, hi: npt.ArrayLike | int
) -> tuple[FloatArray, FloatArray, FloatArray]:
    v = np.asarray(throughput, dtype=np.float64)
    if v.ndim != 1 or v.size == 0 or not np.all(np.isfinite(v)) or np.any(v <= 0):
        raise ConfigError("throughputs must be a non-empty list of finite values > 0", key="throughput")
    lo_a = np.broadcast_to(np.asarray(lo, dtype=np.float64), v.shape).copy()
    hi_a = np.broadcast_to(np.asarray(hi, dtype=np.float64), v.shape).copy()
    if np.any(lo_a < 0) or np.any(lo_a > hi_a):
        raise ConfigError("batch bounds must satisfy 0 ≤ min ≤ max", key="min_batch")
    if not lo_a.sum() <= total <= hi_a.sum():
        raise ConfigError(
            f"global batch {total} cannot be split within the per-rank bounds "
            f"[{int(lo_a.sum())}, {int(hi_a.sum())}]",
            key="global_batch",
            value=total,
        )
    return v, lo_a, hi_a


def makespan(batches: npt.ArrayLike, throughput: npt.ArrayLike) -> float:
    """Eq. 2's objective: the slowest rank's predicted BPT ``max_i B_i / v_i``."""
    return float(np.max(np.asarray(batches, dtype=np.float64) / np.asarray(throughput, dtype=np.float64)))


def allocate_continuous(
    throughput: npt.ArrayLike, total: int, lo: npt.ArrayLike | int = 0, hi: npt.ArrayLike | int = np.inf
) -> FloatArray:
    """Eq. 3 over the reals: the water level z with ``Σ clip(z·v_i, lo_i, hi_i) = B``."""
    v, lo_a, hi_a = _inputs(throughput, total, lo, hi)
    return np.clip(_level(v, lo_a, hi_a, total) * v, lo_a, hi_a)


def _level(v: FloatArray, lo: FloatArray, hi: FloatArray, total: float) -> float:
    """Bisection for the water level (Σ clip(z·v) is continuous and non-decreasing in z)."""
    a, b = 0.0, float(np.max(np.minimum(hi, float(total)) / v))
    for _ in range(200):
        mid = 0.5 * (a + b)
        if np.clip(mid * v, lo, hi).sum() < total:
            a = mid
        else:
            b = mid
        if b - a <= 1e-15 * max(b, 1.0):
            break
    return a


def allocate_greedy(
    throughput: npt.ArrayLike, total: int, lo: npt.ArrayLike | int = 0, hi: npt.ArrayLike | int = np.inf
) -> IntArray:
    """Exact integer optimum of Eq. 3: floors of the continuous level, then greedy per sample."""
    v, lo_a, hi_a = _inputs(throughput, total, lo, hi)
    lo_i = np.ceil(lo_a - 1e-9)
    hi_i = np.floor(np.minimum(hi_a, float(total)) + 1e-9)
    z = _level(v, lo_i, hi_i, total)
    b = np.clip(np.floor(z * v), lo_i, hi_i).astype(np.int64)
    left = int(total - b.sum())
    heap = [((int(b[i]) + 1) / v[i], i) for i in range(v.size) if b[i] < hi_i[i]]
    heapq.heapify(heap)
    while left > 0:
        _, i = heapq.heappop(heap)
        b[i] += 1
        left -= 1
        if b[i] < hi_i[i]:
            heapq.heappush(heap, ((int(b[i]) + 1) / v[i], i))
    return b


def allocate_milp(
    throughput: npt.ArrayLike,
    total: int,
    lo: npt.ArrayLike | int = 0,
    hi: npt.ArrayLike | int = np.inf,
    *,
    time_limit_s: float = 10.0,
) -> IntArray:
    """Eq. 3 as a MILP: variables (B_1..B_n integer, z); min z; B_i − v_i·z ≤ 0; Σ B_i = B."""
    v, lo_a, hi_a = _inputs(throughput, total, lo, hi)
    n = v.size
    c = np.zeros(n + 1)
    c[-1] = 1.0
    a_time = np.hstack([np.eye(n), -v[:, None]])
    a_sum = np.hstack([np.ones(n), [0.0]])[None, :]
    cons = [
        LinearConstraint(a_time, -np.inf, 0.0),
        LinearConstraint(a_sum, float(total), float(total)),
    ]
    upper = np.append(np.minimum(hi_a, float(total)), np.inf)
    res = milp(
        c,
        constraints=cons,
        integrality=np.append(np.ones(n), 0.0),
        bounds=Bounds(np.append(lo_a, 0.0), upper),
        options={"time_limit": time_limit_s, "mip_rel_gap": 0.0},
    )
    if res.x is None:
        raise ConfigError(f"Eq. 3 MILP found no allocation: {res.message}", key="global_batch", value=total)
    return np.rint(res.x[:n]).astype(np.int64)


@dataclass(frozen=True)
class DeviceGroup:
    """One device type of Eq. 4: ``count`` devices of per-device throughput ``throughput`` samples/s."""

    count: int
    throughput: float
    min_batch: int  # B̂^min: the saturation point (smaller batches take as long, AntDT Fig. 8)
    max_batch: int  # B̂^max: the largest micro-batch that fits in memory (95 % use, AntDT footnote 5)


@dataclass(frozen=True)
class AccumulationPlan:
    """Eq. 4's answer per group: micro-batch B_k, accumulation steps C_k, predicted time C_k·B_k/v_k."""

    batch: tuple[int, ...]
    steps: tuple[int, ...]
    time_s: tuple[float, ...]

    @property
    def makespan(self) -> float:
        return max(self.time_s)


def allocate_accumulation(
    groups: Sequence[DeviceGroup],
    total: int,
    *,
    min_steps: int = 1,
    max_steps: int = 5,
    time_limit_s: float = 10.0,
) -> AccumulationPlan:
    """Eq. 4 solved exactly: binaries y_kc (group k runs c steps), micro-batch w_kc in the chosen slot.

    Variables per group k and step count c ∈ [Ĉ^min, Ĉ^max]: ``y_kc ∈ {0, 1}``, ``w_kc ∈ ℤ`` with
    ``B̂^min·y_kc ≤ w_kc ≤ B̂^max·y_kc`` and ``Σ_c y_kc = 1``; then ``B_k = Σ_c w_kc`` and
    ``C_k·B_k = Σ_c c·w_kc`` are linear. Defaults Ĉ^min = 1, Ĉ^max = 5 are the paper's examples.
    """
    if not groups:
        raise ConfigError("at least one device group is needed", key="groups")
    if not 1 <= min_steps <= max_steps <= 1000:
        raise ConfigError("accumulation steps must satisfy 1 ≤ min ≤ max ≤ 1000", key="max_steps")
    for g in groups:
        if g.count < 1 or not g.throughput > 0 or not 1 <= g.min_batch <= g.max_batch:
            raise ConfigError(f"bad device group {g}", key="groups", value=g)
    steps = np.arange(min_steps, max_steps + 1)
    k, s = len(groups), steps.size
    # layout: [y_00..y_0s, ..., y_k0..y_ks, w_00..w_ks, z]
    nv = 2 * k * s + 1
    y0, w0, zi = 0, k * s, 2 * k * s
    rows: list[np.ndarray] = []
    lb: list[float] = []
    ub: list[float] = []

    def row() -> np.ndarray:
        return np.zeros(nv)

    def add(r: np.ndarray, low: float, high: float) -> None:
        rows.append(r)
        lb.append(low)
        ub.append(high)

    for gi, g in enumerate(groups):
        r = row()
        r[y0 + gi * s : y0 + (gi + 1) * s] = 1.0
        add(r, 1.0, 1.0)  # exactly one step count
        for ci in range(s):
            r = row()
            r[w0 + gi * s + ci] = 1.0
            r[y0 + gi * s + ci] = -float(g.max_batch)
            add(r, -np.inf, 0.0)  # w ≤ B̂max·y
            r = row()
            r[w0 + gi * s + ci] = 1.0
            r[y0 + gi * s + ci] = -float(g.min_batch)
            add(r, 0.0, np.inf)  # w ≥ B̂min·y
        r = row()
        r[w0 + gi * s : w0 + (gi + 1) * s] = steps / g.throughput
        r[zi] = -1.0
        add(r, -np.inf, 0.0)  # C_k·B_k / v_k ≤ z
    r = row()
    for gi, g in enumerate(groups):
        r[w0 + gi * s : w0 + (gi + 1) * s] = g.count * steps
    add(r, float(total), float(total))  # Σ n_k C_k B_k = B
    c = np.zeros(nv)
    c[zi] = 1.0
    integrality = np.ones(nv)
    integrality[zi] = 0.0
    upper = np.full(nv, np.inf)
    upper[y0:w0] = 1.0
    upper[w0:zi] = max(g.max_batch for g in groups)
    res = milp(
        c,
        constraints=LinearConstraint(np.array(rows), np.array(lb), np.array(ub)),
        integrality=integrality,
        bounds=Bounds(np.zeros(nv), upper),
        options={"time_limit": time_limit_s, "mip_rel_gap": 0.0},
    )
    if res.x is None:
        raise ConfigError(f"Eq. 4 has no solution: {res.message}", key="global_batch", value=total)
    x = np.rint(res.x).astype(np.int64)
    batch, count, times = [], [], []
    for gi, g in enumerate(groups):
        ci = int(np.argmax(x[y0 + gi * s : y0 + (gi + 1) * s]))
        b = int(x[w0 + gi * s + ci])
        batch.append(b)
        count.append(int(steps[ci]))
        times.append(int(steps[ci]) * b / g.throughput)
    return AccumulationPlan(tuple(batch), tuple(count), tuple(times))
