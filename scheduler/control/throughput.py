"""Step ② of the optimisation cycle (StellaTrain §4.1): the throughput model of one GPU, Eq. 2.

``f(x) = min(β/α · x, β)``: below the batch size ``α`` the GPU is not saturated and throughput grows
linearly with the batch; above it the GPU runs at ``β`` samples/s. The iteration (compute) time is therefore
``x / f(x) = max(α/β, x/β)``: a floor ``α/β`` that no smaller batch gets under, then linear.

The paper fits ``(α, β)`` with Nelder–Mead from the (batch, throughput) telemetry. Telemetry is noisy and,
in steady state, comes from one or two batch sizes only, so the fit here is made robust in three ways:

* a bounded window of recent observations per rank (a GPU's speed drifts; old points describe another GPU);
* points are summarised per batch size by their median (one slow iteration — a GC pause, a co-tenant — must
  not move the fit) and weighted by how often that batch size was seen;
* the parameters are fitted in log space (both stay positive) with a tiny pull towards a data-derived prior
  (the largest median throughput for β, the median batch for α), which only decides the directions the data
  leave open: points all below the knee fix only β/α, points all above it fix only β. The pull is 1e-4 of a
  unit log-error, negligible wherever the data speak.

With fewer distinct batch sizes than ``throughput_min_batches`` the model does not fit: it takes the observed
point as the knee (``α = x``, ``β = f(x)``), the conservative reading ("a larger batch will not run
faster, a smaller one will not run quicker") until the scheduler has seen a second batch size.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.optimize import minimize

from wanrt.errors import ConfigError, RemoteProtocolError

__all__ = ["ThroughputFit", "ThroughputModel", "fit_throughput", "throughput"]

#: weight of the pull towards the prior, relative to a unit squared log-error of one point
_PRIOR_WEIGHT = 1e-4


@dataclass(frozen=True, slots=True)
class ThroughputFit:
    """Fitted Eq. 2 parameters of one GPU; ``fitted`` False: the knee fallback (too few batch sizes)."""

    alpha: float
    beta: float
    fitted: bool
    points: int

    def throughput(self, x: float | npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """f(x) in samples/s (Eq. 2)."""
        return throughput(x, self.alpha, self.beta)

    def iteration_time(self, x: float | npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """x / f(x) = max(α/β, x/β), seconds of compute per iteration."""
        xv = np.asarray(x, dtype=np.float64)
        return np.maximum(self.alpha / self.beta, xv / self.beta)


def throughput(x: float | npt.NDArray[np.float64], alpha: float, beta: float) -> npt.NDArray[np.float64]:
    """Eq. 2: ``min(β/α · x, β)``."""
    xv = np.asarray(x, dtype=np.float64)
    return np.minimum(beta / alpha * xv, beta)


def _summarise(
    xs: npt.NDArray[np.float64], ys: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Distinct batch sizes, the median throughput at each, and how many points each has."""
    ux = np.unique(xs)
    med = np.array([np.median(ys[xs == u]) for u in ux])
    cnt = np.array([float(np.count_nonzero(xs == u)) for u in ux])
    return ux, med, cnt


def fit_throughput(
    batches: npt.ArrayLike,
    samples_per_s: npt.ArrayLike,
    *,
    min_batches: int = 2,
    start: ThroughputFit | None = None,
) -> ThroughputFit:
    """Fit Eq. 2 to observed points by Nelder–Mead on squared log-errors (robust summary, see module doc).

    ``start``: the previous fit of the same rank; refits then start from it (and from the median batch as
    a guard against a stale kink) instead of three cold starts.
    """
    xs = np.asarray(batches, dtype=np.float64).ravel()
    ys = np.asarray(samples_per_s, dtype=np.float64).ravel()
    if xs.shape != ys.shape or xs.size == 0:
        raise ConfigError(
            "need as many throughputs as batch sizes, at least one", key="points", value=xs.size
        )
    if not (np.isfinite(xs).all() and np.isfinite(ys).all() and (xs > 0).all() and (ys > 0).all()):
        raise ConfigError("batch sizes and throughputs must be finite and > 0", key="points")
    ux, med, cnt = _summarise(xs, ys)
    if ux.size < min_batches:
        # the knee fallback: the most seen batch size is taken as α, its median throughput as β
        i = int(np.argmax(cnt))
        return ThroughputFit(float(ux[i]), float(med[i]), False, int(xs.size))
    w = cnt / cnt.sum()
    lx, ly = np.log(ux), np.log(med)
    prior = np.array([float(np.median(lx)), float(ly.max())])

    def loss(theta: npt.NDArray[np.float64]) -> float:
        la, lb = float(theta[0]), float(theta[1])
        # log f(x) = log β + min(log x − log α, 0)
        pred = lb + np.minimum(lx - la, 0.0)
        return float(np.sum(w * (pred - ly) ** 2) + _PRIOR_WEIGHT * np.sum((theta - prior) ** 2))

    best: tuple[float, npt.NDArray[np.float64]] | None = None
    # the objective is piecewise smooth with a kink at each observed x; a few starts around the observed
    # range keep Nelder–Mead from stalling on the wrong side of a kink
    starts = [
        np.array([la0, float(ly.max())]) for la0 in (float(lx.min()), float(np.median(lx)), float(lx.max()))
    ]
    if start is not None and start.fitted:
        starts = [np.array([math.log(start.alpha), math.log(start.beta)]), starts[1]]
    for z0 in starts:
        res = minimize(
            loss, z0, method="Nelder-Mead", options={"xatol": 1e-5, "fatol": 1e-10, "maxiter": 1000}
        )
        val = float(res.fun)
        if best is None or val < best[0]:
            best = (val, np.asarray(res.x, dtype=np.float64))
    assert best is not None
    alpha, beta = math.exp(float(best[1][0])), math.exp(float(best[1][1]))
    return ThroughputFit(alpha, beta, True, int(xs.size))


class ThroughputModel:
    """The Eq. 2 model of one rank, refitted lazily from a bounded window of (batch, samples/s) points."""

    def __init__(self, *, window: int = 64, min_batches: int = 2) -> None:
        self._points: deque[tuple[float, float]] = deque(maxlen=window)
        self._min_batches = min_batches
        self._fit: ThroughputFit | None = None
        self._dirty = False

    def observe(self, batch_size: float, samples_per_s: float) -> None:
        """Add one iteration's point.

        A non-finite or non-positive value is a :class:`RemoteProtocolError`: it came from a rank's
        telemetry, so the service drops that message and keeps serving instead of fitting nonsense.
        """
        ok = math.isfinite(batch_size) and math.isfinite(samples_per_s)
        if not ok or batch_size <= 0 or samples_per_s <= 0:
            raise RemoteProtocolError(
                "throughput telemetry must be finite and > 0", value=(batch_size, samples_per_s)
            )
        self._points.append((float(batch_size), float(samples_per_s)))
        self._dirty = True

    @property
    def n_points(self) -> int:
        return len(self._points)

    def fit(self) -> ThroughputFit | None:
        """The current fit (None before the first observation); refits only when points changed."""
        if not self._points:
            return None
        if self._dirty or self._fit is None:
            xs = np.array([p[0] for p in self._points])
            ys = np.array([p[1] for p in self._points])
            self._fit = fit_throughput(xs, ys, min_batches=self._min_batches, start=self._fit)
            self._dirty = False
        return self._fit
