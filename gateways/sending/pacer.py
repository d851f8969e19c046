"""The token bucket that paces one WAN link's data at its target rate (the allocator's, or the base rate).

Sans-IO: the node asks how long ``nbytes`` must wait at time ``now``; whoever moves the bytes (the
daemon's writer task, the simulator's link) waits that long.

Why the bucket holds 60 ms of the rate (``[gateway] pacer_burst_s``). The pacer releases bytes into the
socket at most ``burst`` ahead of its schedule, so the bytes the kernel still has to send when the
gateway's event loop is busy elsewhere are about one burst: a stall longer than that leaves the link idle,
and the time is not made up (the bucket refills only to ``burst``). Measured on 3 sites, tbf 100 Mbit/s
pairwise (docs/round_bench.md, "Session 14"): a writer stalled 43 ms while its trainer's 10 MB push came
in, and with a 20 ms bucket the links idled 20–40 ms per 5 M round; with 60 ms the round took what it
took unpaced (client round 0.597 s both ways against 0.615–0.619 s), while the pacer still holds the
link to its rate over any longer span (rate × T + burst bytes in T seconds).
"""

from __future__ import annotations

from typing import Final

from transports.link import DEFAULT_BURST_FLOOR
from transports.token_bucket import TokenBucket

__all__ = ["PACER_BURST_S", "Pacer"]

#: Default bucket as time at the link's rate (see the module docstring).
PACER_BURST_S: Final = 0.06


class Pacer:
    """Reserve bytes at the link's target rate; the bucket holds ``burst_s`` of the rate (at least
    :data:`~transports.link.DEFAULT_BURST_FLOOR`), following the rate when it changes."""

    def __init__(self, rate_bps: float, now: float, burst_s: float = PACER_BURST_S) -> None:
        self._burst_s = burst_s
        self._bucket = TokenBucket(rate_bps, self._burst(rate_bps), now)

    def _burst(self, rate_bps: float) -> int:
        return max(DEFAULT_BURST_FLOOR, int(rate_bps * self._burst_s / 8))

    @property
    def rate_bps(self) -> float:
        return self._bucket.rate_bps

    def set_rate(self, rate_bps: float, now: float) -> None:
        self._bucket.set_rate(rate_bps, now, burst=self._burst(rate_bps))

    def delay(self, nbytes: int, now: float) -> float:
        """Reserve ``nbytes``; seconds to wait before they may leave."""
        return max(0.0, self._bucket.reserve(nbytes, now) - now)
