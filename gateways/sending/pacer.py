"""The token bucket that paces one WAN link's data at its target rate (the allocator's, or the base rate).

Sans-IO: the node asks how long ``nbytes`` must wait at time ``now``; whoever moves the bytes (the
daemon's writer task, the simulator's link) waits that long.
"""

from __future__ import annotations

from transports.link import DEFAULT_BURST_FLOOR
from transports.token_bucket import TokenBucket

__all__ = ["Pacer"]


class Pacer:
    """Reserve bytes at the link's target rate; the burst follows the rate (see :meth:`_burst`)."""

    def __init__(self, rate_bps: float, now: float) -> None:
        self._bucket = TokenBucket(rate_bps, self._burst(rate_bps), now)

    @staticmethod
    def _burst(rate_bps: float) -> int:
        # the same rule as an emulated link: a bucket smaller than rate x wake-up lateness loses rate
        return max(DEFAULT_BURST_FLOOR, int(rate_bps * 0.02 / 8))

    @property
    def rate_bps(self) -> float:
        return self._bucket.rate_bps

    def set_rate(self, rate_bps: float, now: float) -> None:
        self._bucket.set_rate(rate_bps, now, burst=self._burst(rate_bps))

    def delay(self, nbytes: int, now: float) -> float:
        """Reserve ``nbytes``; seconds to wait before they may leave."""
        return max(0.0, self._bucket.reserve(nbytes, now) - now)
