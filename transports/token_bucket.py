"""A sans-IO token bucket: the pacing rule of an emulated WAN link, with time passed in.

The classic rate limiter (as in Linux ``tbf``): tokens are bytes, refilled at ``rate_bps / 8`` per second up
to ``burst``. Unlike a "may I send?" limiter it lets the balance go *negative*: :meth:`reserve` always
accepts the bytes and returns the time at which they may leave, so one large send is paced exactly instead
of being starved by a bucket smaller than the message. No clock inside: the shaper, the benchmarks and the
simulator pass ``now`` (any monotonic seconds), which makes it exact under a fake clock.
"""

from __future__ import annotations

import math

from wanrt.config import check

__all__ = ["TokenBucket"]


class TokenBucket:
    """``rate_bps`` bits per second, at most ``burst`` bytes sent back-to-back; starts full at ``now``."""

    def __init__(self, rate_bps: float, burst: int, now: float = 0.0) -> None:
        _check(rate_bps, burst)
        self._rate = float(rate_bps)
        self._burst = int(burst)
        self._tokens = float(burst)
        self._stamp = float(now)

    @property
    def rate_bps(self) -> float:
        return self._rate

    @property
    def burst(self) -> int:
        return self._burst

    def tokens(self, now: float) -> float:
        """Balance in bytes at ``now`` (negative while reserved bytes are still waiting to leave)."""
        self._refill(now)
        return self._tokens

    def reserve(self, nbytes: int, now: float) -> float:
        """Take ``nbytes`` (any size); return the time, ``>= now``, at which they may be sent."""
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        self._refill(now)
        self._tokens -= nbytes
        return self.ready_at(now)

    def ready_at(self, now: float) -> float:
        """When the balance is back to zero, i.e. when everything reserved so far may have left.

        Re-evaluate after :meth:`set_rate`: a debt made at the old rate is repaid at the new one.
        """
        self._refill(now)
        if self._tokens >= 0 or math.isinf(self._rate):
            return now
        return now + (-self._tokens) * 8.0 / self._rate

    def set_rate(self, rate_bps: float, now: float, burst: int | None = None) -> None:
        """Change rate (and optionally burst) from ``now`` on; tokens earned so far count at the old rate."""
        new_burst = self._burst if burst is None else int(burst)
        _check(rate_bps, new_burst)
        self._refill(now)
        self._rate = float(rate_bps)
        self._burst = new_burst
        self._tokens = min(self._tokens, float(new_burst))

    def _refill(self, now: float) -> None:
        elapsed = now - self._stamp
        if elapsed > 0:
            if math.isinf(self._rate):
                self._tokens = float(self._burst)
            else:
                self._tokens = min(float(self._burst), self._tokens + elapsed * self._rate / 8.0)
            self._stamp = now
        # A clock that steps back (elapsed < 0) earns nothing and keeps the later stamp.


def _check(rate_bps: float, burst: int) -> None:
    check(rate_bps > 0, "rate_bps", rate_bps, "must be > 0 bit/s (use inf for an unlimited rate)")
    check(burst >= 1, "burst", burst, "must be >= 1 byte")
