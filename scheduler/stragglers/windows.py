"""Time-windowed samples: the Monitor's sliding windows (AntDT §V-D, §VI-A2), time passed in."""

from __future__ import annotations

import math
from collections import deque

from wanrt.errors import LocalProtocolError

__all__ = ["TimeWindow"]


class TimeWindow:
    """Samples (t, value, weight) of the last ``span_s`` seconds; means in O(1) from running sums.

    ``max_samples`` bounds memory whatever the report rate: the oldest samples go first.
    """

    def __init__(self, span_s: float, max_samples: int) -> None:
        self.span_s = span_s
        self._max = max_samples
        self._items: deque[tuple[float, float, float]] = deque()
        self._sum = 0.0
        self._wsum = 0.0

    def add(self, t: float, value: float, weight: float = 1.0) -> None:
        if not (math.isfinite(t) and math.isfinite(value) and math.isfinite(weight) and weight > 0):
            raise LocalProtocolError("window samples must be finite with weight > 0", value=(t, value))
        if self._items and t < self._items[-1][0]:
            raise LocalProtocolError("window samples must arrive in time order", value=t)
        self._items.append((t, value, weight))
        self._sum += value * weight
        self._wsum += weight
        while len(self._items) > self._max:
            self._pop()

    def prune(self, now: float) -> None:
        """Drop samples at or before ``now − span_s``."""
        while self._items and self._items[0][0] <= now - self.span_s:  # the window is (now − span, now]
            self._pop()
        if not self._items:
            self._sum = self._wsum = 0.0  # no drift left behind by the running sums

    def _pop(self) -> None:
        _, v, w = self._items.popleft()
        self._sum -= v * w
        self._wsum -= w

    def mean(self) -> float | None:
        """Weighted mean of the samples held, None if empty."""
        return self._sum / self._wsum if self._items and self._wsum > 0 else None

    def sums(self) -> tuple[float, float]:
        """(Σ value·weight, Σ weight) of the samples held."""
        return (self._sum, self._wsum) if self._items else (0.0, 0.0)

    def coverage(self, now: float) -> float:
        """Fraction of the window the samples span (0 with fewer than one sample)."""
        if not self._items:
            return 0.0
        return min(1.0, (now - self._items[0][0]) / self.span_s)

    def clear(self) -> None:
        self._items.clear()
        self._sum = self._wsum = 0.0

    def __len__(self) -> int:
        return len(self._items)
