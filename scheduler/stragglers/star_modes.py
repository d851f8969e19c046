"""STAR's synchronisation-mode choice (seed 000, §IV-B/C): which gradients each update waits for.

Given every member's predicted iteration time T_i (N members, total batch M per synchronous step) and the
noise scale φ (:mod:`scheduler.stragglers.noise_scale`), the time to reach a fixed training progress is

* **bsp** — wait for all: ``(1 + φ/M) · max_i T_i`` (Eq. 1 with x = N);
* **x_order** (static, §IV-B) — update with the x fastest: ``T_x = (1 + φ/(x·M/N)) · t_x`` (Eq. 1),
  t_x the x-th smallest predicted time; x = 1 is asynchronous SGD;
* **dynamic** x-order (§IV-B) — members clustered by predicted time, each cluster c_i updates on its own:
  ``T_d = 1 / Σ_i 1/((1 + φ/(n_ci·M/N)) · t_ci)`` (Eq. 2), t_ci the slowest in the cluster. STAR clusters
  agglomeratively without saying where to cut; here the cut is the one Eq. 2 likes best, found exactly
  by dynamic programming over contiguous groups of the sorted times (every cut of a single-linkage
  dendrogram over 1-D times is such a grouping);
* **parent_child** (all-reduce, §IV-B) — the x slowest leave the ring, each attaches to a ring member that
  waits t_w after its own work: ``T_a = (1 + φ/((N − x + q)·M/N)) · (t_ring + t_w)`` (Eq. 3), t_ring the
  slowest ring member, q the removed members whose gradients arrive within t_w. A child's *new iteration
  time* is read as its lateness past the ring (``child_time − t_ring``), since the parent's wait starts
  when its own iteration ends. Between two lateness values T_a only grows with t_w, so the best t_w is 0
  or one of them: the search is exact over those breakpoints.

:func:`choose_mode` picks the smallest predicted time (STAR-H). :func:`brute_force_mode` enumerates a grid
(every x, every contiguous clustering, every (x, t_w) on a t_w grid) as the independent check. When the
mode changes, the update's batch goes from M to ``M_new = y·M/N`` (y gradient reports per update) and the
learning rate follows linearly, ``r_new = (M_new/M)·r_SSGD`` (§IV-C, after Goyal et al. 2017).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from scheduler.stragglers.config import ModeConfig, ModeKind
from wanrt.errors import ConfigError

__all__ = [
    "KIND_RANK",
    "ModeChoice",
    "brute_force_mode",
    "choose_mode",
    "dynamic_x_order",
    "evaluate_mode",
    "parent_child",
    "parent_child_time",
    "predicted_stragglers",
    "progress_time",
    "scaled_lr",
    "static_x_order",
    "tw_sweep",
]

#: Equal predicted times are broken towards the simpler mode: plain BSP first.
KIND_RANK: Final[dict[str, int]] = {"bsp": 0, "x_order": 1, "parent_child": 2, "dynamic": 3}
#: Relative tolerance under which two predicted times count as equal.
TIE_REL: Final = 1e-9
#: Contiguous clusterings are 2^(N−1); the brute force is for checks only.
MAX_BRUTE_MEMBERS: Final = 16


@dataclass(frozen=True)
class ModeChoice:
    """A synchronisation mode and its predicted time to a fixed progress (Eq. 1–3).

    ``groups`` hold member indices: x_order → (the x fastest,); dynamic → the clusters, fastest first;
    parent_child → (ring, children); bsp → (everyone,). ``reports`` is y, the gradient reports one update
    uses, per group (for the learning-rate rule); ``order`` is x (removed members for parent_child,
    clusters for dynamic, N for bsp); ``wait`` is t_w.
    """

    kind: ModeKind
    time: float
    order: int
    wait: float
    groups: tuple[tuple[int, ...], ...]
    reports: tuple[float, ...]

    def same_as(self, other: ModeChoice) -> bool:
        """Same kind and predicted time; also same x and t_w where those define the mode."""
        if self.kind != other.kind or not math.isclose(self.time, other.time, rel_tol=1e-9):
            return False
        return self.kind == "dynamic" or (self.order == other.order and self.wait == other.wait)


def progress_time(phi: float, total_batch: float, n: int, reports: float, t: float) -> float:
    """STAR's ``(1 + φ/(y·M/N)) · t``: updates needed for the progress × time per update."""
    return (1.0 + phi / (reports * total_batch / n)) * t


def scaled_lr(lr_ssgd: float, reports: float, n: int) -> float:
    """§IV-C: ``r_new = (M_new / M) · r_SSGD`` with ``M_new = y·M/N``."""
    return lr_ssgd * reports / n


def predicted_stragglers(times: npt.ArrayLike, ratio: float) -> list[int]:
    """Members whose deviation ratio (T_i − min T)/min T exceeds ``ratio`` (STAR §II: 20 %)."""
    t = np.asarray(times, dtype=np.float64)
    base = float(t.min())
    return [i for i in range(t.size) if base > 0 and (t[i] - base) / base > ratio]


def _check(times: npt.ArrayLike, phi: float, total_batch: float) -> npt.NDArray[np.float64]:
    t = np.asarray(times, dtype=np.float64)
    if t.ndim != 1 or t.size == 0 or not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ConfigError("predicted iteration times must be finite and > 0", key="times")
    if not (math.isfinite(phi) and phi >= 0):
        raise ConfigError("the noise scale must be finite and ≥ 0", key="phi", value=phi)
    if not (math.isfinite(total_batch) and total_batch > 0):
        raise ConfigError("the total batch must be > 0", key="total_batch", value=total_batch)
    return t


def _bsp(t: npt.NDArray[np.float64], phi: float, m: float) -> ModeChoice:
    n = t.size
    return ModeChoice(
        "bsp", progress_time(phi, m, n, n, float(t.max())), n, 0.0, (tuple(range(n)),), (float(n),)
    )


def static_x_order(times: npt.ArrayLike, phi: float, total_batch: float) -> list[ModeChoice]:
    """Eq. 1 for x = 1..N−1 (x = N is bsp)."""
    t = _check(times, phi, total_batch)
    n = t.size
    order = np.argsort(t, kind="stable")
    return [
        ModeChoice(
            "x_order",
            progress_time(phi, total_batch, n, x, float(t[order[x - 1]])),
            x,
            0.0,
            (tuple(int(i) for i in order[:x]),),
            (float(x),),
        )
        for x in range(1, n)
    ]


def _cluster_rate(phi: float, m: float, n: int, size: int, t_max: float) -> float:
    return 1.0 / progress_time(phi, m, n, size, t_max)


def _dynamic_from_cuts(
    t: npt.NDArray[np.float64], order: npt.NDArray[np.intp], cuts: Sequence[int], phi: float, m: float
) -> ModeChoice:
    """Eq. 2 for the clusters ``sorted[cuts[j]:cuts[j+1]]``."""
    n = t.size
    s = t[order]
    rate = 0.0
    groups, reports = [], []
    for a, b in itertools.pairwise(cuts):
        rate += _cluster_rate(phi, m, n, b - a, float(s[b - 1]))
        groups.append(tuple(int(i) for i in order[a:b]))
        reports.append(float(b - a))
    return ModeChoice("dynamic", 1.0 / rate, len(groups), 0.0, tuple(groups), tuple(reports))


def dynamic_x_order(times: npt.ArrayLike, phi: float, total_batch: float) -> ModeChoice | None:
    """Eq. 2 with the best clustering into ≥ 2 contiguous groups of the sorted times (O(N²) DP)."""
    t = _check(times, phi, total_batch)
    n = t.size
    if n < 2:
        return None
    order = np.argsort(t, kind="stable")
    s = t[order]
    best = np.full(n + 1, -np.inf)
    best[0] = 0.0
    back = np.zeros(n + 1, dtype=np.intp)
    for b in range(1, n + 1):
        for a in range(b):
            v = best[a] + _cluster_rate(phi, total_batch, n, b - a, float(s[b - 1]))
            if v > best[b]:
                best[b], back[b] = v, a
    # at least two clusters: the last one starts at some a ≥ 1
    tail = [best[a] + _cluster_rate(phi, total_batch, n, n - a, float(s[n - 1])) for a in range(1, n)]
    a = 1 + int(np.argmax(tail))
    cuts = [n, a]
    while cuts[-1] > 0:
        cuts.append(int(back[cuts[-1]]))
    return _dynamic_from_cuts(t, order, cuts[::-1], phi, total_batch)


def parent_child_time(
    times: npt.ArrayLike,
    phi: float,
    total_batch: float,
    x: int,
    wait: float,
    child_times: npt.ArrayLike | None = None,
) -> tuple[float, int]:
    """Eq. 3 for removing the x slowest and waiting ``wait``; returns (T_a, q)."""
    t = _check(times, phi, total_batch)
    n = t.size
    if not 0 <= x < n:
        raise ConfigError("x must be in 0..N−1", key="x", value=x)
    order = np.argsort(t, kind="stable")
    t_ring = float(t[order[n - x - 1]])
    ct = t if child_times is None else np.asarray(child_times, dtype=np.float64)
    late = ct[order[n - x :]] - t_ring
    q = int(np.count_nonzero(late <= wait))
    return progress_time(phi, total_batch, n, n - x + q, t_ring + wait), q


def parent_child(
    times: npt.ArrayLike,
    phi: float,
    total_batch: float,
    max_removed: int,
    max_wait: float,
    child_times: npt.ArrayLike | None = None,
) -> ModeChoice | None:
    """Best (x, t_w) of Eq. 3 for x = 1..max_removed, t_w ∈ {0} ∪ {children's lateness ≤ max_wait}."""
    t = _check(times, phi, total_batch)
    n = t.size
    order = np.argsort(t, kind="stable")
    ct = t if child_times is None else np.asarray(child_times, dtype=np.float64)
    best: ModeChoice | None = None
    for x in range(1, min(max_removed, n - 1) + 1):
        t_ring = float(t[order[n - x - 1]])
        late = ct[order[n - x :]] - t_ring
        waits = sorted({0.0, *(float(v) for v in late if 0.0 <= v <= max_wait)})
        for w in waits:
            q = int(np.count_nonzero(late <= w))
            val = progress_time(phi, total_batch, n, n - x + q, t_ring + w)
            if best is None or val < best.time:
                ring = tuple(int(i) for i in order[: n - x])
                kids = tuple(int(i) for i in order[n - x :])
                best = ModeChoice("parent_child", val, x, w, (ring, kids), (float(n - x + q),))
    return best


def tw_sweep(
    times: npt.ArrayLike,
    phi: float,
    total_batch: float,
    x: int,
    waits: npt.ArrayLike,
    child_times: npt.ArrayLike | None = None,
) -> npt.NDArray[np.float64]:
    """Eq. 3 over a range of t_w with x fixed: short waits lose the children's gradients (more updates),
    long waits lose time, so the curve is U-shaped whenever the gradients are worth waiting for."""
    return np.array(
        [parent_child_time(times, phi, total_batch, x, float(w), child_times)[0] for w in np.asarray(waits)]
    )


def evaluate_mode(
    mode: ModeChoice,
    times: npt.ArrayLike,
    phi: float,
    total_batch: float,
    child_times: npt.ArrayLike | None = None,
) -> float:
    """Eq. 1–3 time of an already chosen mode under new predictions (to compare it with a new choice).

    x_order keeps x (the first x reports, whoever sends them); parent_child and dynamic keep their member
    groups; t_w is kept.
    """
    t = _check(times, phi, total_batch)
    n = t.size
    if mode.kind == "bsp":
        return _bsp(t, phi, total_batch).time
    if mode.kind == "x_order":
        return progress_time(phi, total_batch, n, mode.order, float(np.sort(t)[mode.order - 1]))
    if mode.kind == "dynamic":
        rate = sum(
            _cluster_rate(phi, total_batch, n, len(g), float(max(t[i] for i in g))) for g in mode.groups
        )
        return 1.0 / rate
    ring, kids = mode.groups
    ct = t if child_times is None else np.asarray(child_times, dtype=np.float64)
    t_ring = float(max(t[i] for i in ring))
    q = sum(1 for i in kids if ct[i] - t_ring <= mode.wait)
    return progress_time(phi, total_batch, n, len(ring) + q, t_ring + mode.wait)


def _pick(cands: Sequence[ModeChoice]) -> ModeChoice:
    """Smallest time; near-ties (TIE_REL) go to the simpler mode, then smaller x, then shorter t_w."""
    low = min(c.time for c in cands)
    close = [c for c in cands if c.time <= low * (1.0 + TIE_REL)]
    return min(close, key=lambda c: (KIND_RANK[c.kind], c.order, c.wait))


def choose_mode(
    times: npt.ArrayLike,
    phi: float,
    total_batch: float,
    cfg: ModeConfig | None = None,
    *,
    child_times: npt.ArrayLike | None = None,
    max_wait: float | None = None,
) -> ModeChoice:
    """STAR-H: bsp unless a straggler is predicted; then the mode with the least Eq. 1–3 time.

    ``max_wait`` (same unit as ``times``) defaults to ``cfg.max_wait_s``.
    """
    cfg = cfg or ModeConfig()
    t = _check(times, phi, total_batch)
    cands = [_bsp(t, phi, total_batch)]
    stragglers = predicted_stragglers(t, cfg.straggler_ratio)
    if not stragglers:
        return cands[0]
    if "x_order" in cfg.modes:
        cands += static_x_order(t, phi, total_batch)
    if "dynamic" in cfg.modes:
        d = dynamic_x_order(t, phi, total_batch)
        cands += [d] if d is not None else []
    if "parent_child" in cfg.modes:
        wait = cfg.max_wait_s if max_wait is None else max_wait
        p = parent_child(t, phi, total_batch, len(stragglers), wait, child_times)
        cands += [p] if p is not None else []
    return _pick(cands)


def brute_force_mode(
    times: npt.ArrayLike,
    phi: float,
    total_batch: float,
    waits: npt.ArrayLike,
    cfg: ModeConfig | None = None,
    *,
    child_times: npt.ArrayLike | None = None,
) -> ModeChoice:
    """The check: Eq. 1–3 at every point of an enumerated grid, argmin with :func:`choose_mode`'s ties."""
    cfg = cfg or ModeConfig()
    t = _check(times, phi, total_batch)
    n = t.size
    if n > MAX_BRUTE_MEMBERS:
        raise ConfigError(f"brute force is limited to {MAX_BRUTE_MEMBERS} members", key="times", value=n)
    cands = [_bsp(t, phi, total_batch)]
    stragglers = predicted_stragglers(t, cfg.straggler_ratio)
    if not stragglers:
        return cands[0]
    order = np.argsort(t, kind="stable")
    if "x_order" in cfg.modes:
        for x in range(1, n):
            tx = float(np.sort(t)[x - 1])
            group = (tuple(int(i) for i in order[:x]),)
            val = progress_time(phi, total_batch, n, x, tx)
            cands.append(ModeChoice("x_order", val, x, 0.0, group, (float(x),)))
    if "dynamic" in cfg.modes:
        for mask in range(1, 1 << (n - 1)):  # every non-empty set of cut points: ≥ 2 clusters
            cuts = [0, *(i + 1 for i in range(n - 1) if mask >> i & 1), n]
            cands.append(_dynamic_from_cuts(t, order, cuts, phi, total_batch))
    if "parent_child" in cfg.modes:
        grid = np.sort(np.asarray(waits, dtype=np.float64))
        for x in range(1, min(len(stragglers), n - 1) + 1):
            best: ModeChoice | None = None
            for w in grid:
                val, q = parent_child_time(t, phi, total_batch, x, float(w), child_times)
                if best is None or val < best.time:
                    ring = tuple(int(i) for i in order[: n - x])
                    kids = tuple(int(i) for i in order[n - x :])
                    best = ModeChoice("parent_child", val, x, float(w), (ring, kids), (float(n - x + q),))
            if best is not None:
                cands.append(best)
    return _pick(cands)
