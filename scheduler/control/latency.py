"""The exchange's fixed cost L in ``exchange = L + bytes / B``: round trips and the gateways' per-round
work, which no compression removes (ours; StellaTrain §4.2 has bytes / B only).

Why: Eq. 6 and the idle rule (§4.1 ③) treat the whole exchange as bytes over bandwidth. That holds when
GPU compute is long next to the WAN's round trip. In the demo an iteration computes in 10–40 ms and the
tree's round (leaf → root → leaf) takes a 40 ms round trip plus the gateways' processing on a loaded
machine, so the exchange paces the iteration whatever the payload: the idle rule read that idle as a slow
link and lowered the estimate 100 → 2 Mbit/s on 20–100 Mbit/s links, and the search, pricing an iteration
at its compute, took large batches "for free" (docs/demo.md).

How it is measured: every estimator observation in which the exchange paced the iteration (idle ≥ the
threshold) measures the exchange's time at the payload then running; the caller passes it net of the
bytes' time at the estimate (``time − bytes / B̂``). L is the **median** of the last ``latency_window``
such values: what the fixed part of an exchange typically takes, jitter included, so that the idle rule
lowers the estimate only on an exchange slower than that — a link that got slower — and not on the
jitter of a loaded machine. The minimum was tried first and dropped: it is the floor of the jitter (on
the demo under load 23 ms against 50–160 ms exchanges), so all the jitter read as bytes and the estimate
collapsed to 0.7 Mbit/s as with the paper's rule; and with a B̂ below the link it fell to 0.
Nothing is measured until the first observation: L = 0, the paper's model.

Sans-IO: observations carry their values; nothing here reads a clock.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from wanrt.errors import RemoteProtocolError

__all__ = ["ExchangeLatency"]


class ExchangeLatency:
    """The median over a window of measured exchange times, seconds (module docstring)."""

    def __init__(self, window: int) -> None:
        self.window = int(window)
        self._bounds: deque[float] = deque(maxlen=max(1, self.window))

    @property
    def enabled(self) -> bool:
        return self.window > 0

    @property
    def count(self) -> int:
        """Exchange times in the window."""
        return len(self._bounds) if self.enabled else 0

    @property
    def latency_s(self) -> float:
        """L, seconds (0 while off or before any observation)."""
        if not self.enabled or not self._bounds:
            return 0.0
        return float(statistics.median(self._bounds))

    def observe(self, comm_s: float) -> float:
        """An exchange that paced its iteration and took ``comm_s`` seconds beyond its bytes' time at the
        estimate; returns the new L."""
        if not (math.isfinite(comm_s) and comm_s >= 0):
            raise RemoteProtocolError("exchange time must be finite and >= 0", value=comm_s)
        if self.enabled:
            self._bounds.append(float(comm_s))
        return self.latency_s
