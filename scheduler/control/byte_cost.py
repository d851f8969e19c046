"""What the payload costs the trainer's CPU per iteration: ``s = a + κ · payload_bytes``, per rank.

Why: StellaTrain's iteration time (Eq. 2, ``x_i / f_i(x_i)``) is GPU compute only; compression and the
sparse optimizer run on CPU threads beside it and the paper finds them cheap (§3: the sparse optimizer 128×
faster than the dense one at 99 % compression), so in Eq. 1 the payload costs nothing as long as Eq. 6
hides its exchange. On CPU trainers — and whenever compression shares cores with training — the bytes are
on the critical path: after backward the leader drains the compression of the last layers, and after the
exchange it applies the sparse update (both ∝ the kept elements). The real-daemon benchmark measured it:
the adaptive arm at density 0.073 (6.1 MB per iteration) took 0.358 s per iteration above compute-only,
the fixed arm at 0.02 (1.7 MB) 0.112 s, i.e. ~56 ms per MB — more than the 100 Mbit/s link's 80 ms per MB
that Eq. 6 budgets (docs/scheduler.md). Worse, with the cost folded into the fitted ``f_i`` the search
reads a denser plan's slower compute as *more time to hide the exchange behind*, so Eq. 6 admits a denser
plan still: the loop that drove the adaptive arm to 3.7× the fixed arm's bytes.

So the trainers' byte-dependent time is measured apart (``compute − forward − backward``: the compression
tail and the update's application), fitted here by least squares on the payload of the plan that ran, and
the search adds ``a_i + κ_i · (1 − r) · m`` to each rank's iteration time. With fewer than two distinct
payloads in the window the line through the origin is taken (``a = 0``, ``κ`` = median seconds / payload):
on the benchmark machine the intercept was small (0.112 s at 1.7 MB against the 56 ms/MB slope: 0.017 s),
and waiting for a second payload would let the first plans run at the paper's free-bytes density.

Sans-IO.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from wanrt.errors import RemoteProtocolError

__all__ = ["ByteCost", "ByteCostFit"]

#: payloads closer than this ratio count as one (a fit needs them apart)
DISTINCT_RATIO = 1.2


@dataclass(frozen=True, slots=True)
class ByteCostFit:
    """Seconds per iteration ``fixed_s + per_byte_s · payload``."""

    fixed_s: float
    per_byte_s: float

    def seconds(self, payload_bytes: float) -> float:
        return self.fixed_s + self.per_byte_s * payload_bytes


class ByteCost:
    """A bounded window of (payload bytes, seconds) of one rank, and its line."""

    def __init__(self, window: int = 64) -> None:
        self._points: deque[tuple[float, float]] = deque(maxlen=window)

    def observe(self, payload_bytes: float, seconds: float) -> None:
        if not (math.isfinite(payload_bytes) and math.isfinite(seconds)) or payload_bytes < 0 or seconds < 0:
            raise RemoteProtocolError(
                "byte cost sample must be finite and >= 0", value=(payload_bytes, seconds)
            )
        self._points.append((float(payload_bytes), float(seconds)))

    def fit(self) -> ByteCostFit | None:
        pts = list(self._points)
        if not pts:
            return None
        xs = [p for p, _ in pts]
        ys = sorted(s for _, s in pts)
        median = ys[len(ys) // 2]
        if min(xs) <= 0:
            return ByteCostFit(median, 0.0)
        if max(xs) < DISTINCT_RATIO * min(xs):
            return ByteCostFit(0.0, median / (sum(xs) / len(xs)))
        n = len(pts)
        mx = sum(xs) / n
        my = sum(s for _, s in pts) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (s - my) for x, s in pts) / sxx
        if slope <= 0:
            return ByteCostFit(median, 0.0)  # no measurable cost per byte (noise)
        fixed = max(0.0, my - slope * mx)
        return ByteCostFit(fixed, slope)
