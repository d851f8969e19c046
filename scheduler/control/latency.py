"""The exchange's fixed cost L in ``exchange = L + bytes / B``: round trips and the gateways' per-round
work, which no compression removes (ours; StellaTrain §4.2 has bytes / B only).

Why: Eq. 6 and the idle rule (§4.1 ③) treat the whole exchange as bytes over bandwidth. That holds when
GPU compute is long next to the WAN's round trip. In the demo an iteration computes in 10–40 ms and the
tree's round (leaf → root → leaf) takes a 40 ms round trip plus the gateways' processing on a loaded
machine, so the exchange paces the iteration whatever the payload: the idle rule read that idle as a slow
link and lowered the estimate 100 → 2 Mbit/s on 20–100 Mbit/s links, and the search, pricing an iteration
at its compute, took large batches "for free" (docs/demo.md).

How it is measured: every estimator observation in which the exchange paced the iteration (idle ≥ the
threshold) measures the exchange's time, and so bounds L from above (bytes take ≥ 0 s). L is the
**smallest** such bound over the last ``latency_window`` observations: a
round's latency has a floor and only jitter above it, the smallest payloads in the window come closest to
it, and a window (not all history) forgets a machine that got busier. Subtracting the bytes' time at the
estimate (``comm − bytes / B̂``) was tried: it is a bound only while B̂ is not below the link, and when B̂
was low it pulled L to 0 within a few ticks in the toy loop — the paper's model again, and its collapse.
Nothing is measured until the first observation: L = 0, the paper's model.

Sans-IO: observations carry their values; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections import deque

from wanrt.errors import RemoteProtocolError

__all__ = ["ExchangeLatency"]


class ExchangeLatency:
    """The minimum over a window of upper bounds on the exchange's fixed cost, seconds."""

    def __init__(self, window: int) -> None:
        self.window = int(window)
        self._bounds: deque[float] = deque(maxlen=max(1, self.window))

    @property
    def enabled(self) -> bool:
        return self.window > 0

    @property
    def latency_s(self) -> float:
        """L, seconds (0 while off or before any observation)."""
        if not self.enabled or not self._bounds:
            return 0.0
        return min(self._bounds)

    def observe(self, comm_s: float) -> float:
        """An exchange that took at most ``comm_s`` seconds; returns the new L."""
        if not (math.isfinite(comm_s) and comm_s >= 0):
            raise RemoteProtocolError("exchange time must be finite and >= 0", value=comm_s)
        if self.enabled:
            self._bounds.append(float(comm_s))
        return self.latency_s
