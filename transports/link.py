"""How an emulated WAN link behaves: rate, one-way delay, jitter, burst and the bottleneck buffer.

A frozen config (TOML table ``[...shape]`` or a URL query, see :mod:`transports.urls`) consumed by
:class:`transports.shaped.ShapedTransport`. Kept apart from the shaper so configs and the simulator can use
it without importing asyncio code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from wanrt.config import check

__all__ = ["DEFAULT_BURST_FLOOR", "DEFAULT_SHAPE", "LinkShape"]

#: Smallest automatic burst. The shaper wakes about once per chunk, and late when the machine is loaded; a
#: bucket smaller than rate × (wake-up lateness) forfeits tokens and delivers less than the configured rate,
#: so the automatic burst is the larger of this floor and ``rate × burst_window_s``. With 20 ms the shaped
#: goodput stays within 1 % of the rate on a loaded 2-core machine (5 ms lost 4-5 %, tools/bench_transports).
DEFAULT_BURST_FLOOR = 64 * 1024


@dataclass(frozen=True)
class LinkShape:
    """One direction of a link. ``rate_bps`` may be ``inf`` (delay only).

    ``burst`` = ``None`` means automatic (:meth:`burst_for`), recomputed whenever the rate changes.
    ``chunk`` is the pacing granularity: smaller chunks let :meth:`ShapedTransport.set_rate` bite sooner,
    larger ones cost fewer wake-ups. ``queue`` bounds the bytes waiting for the bucket (the bottleneck
    buffer); a full queue blocks ``send`` (back-pressure) instead of dropping, since wanrt's byte streams are
    reliable.
    """

    rate_bps: float = 100e6
    delay_s: float = 0.0
    jitter_s: float = 0.0
    burst: int | None = None
    chunk: int = 16 * 1024
    queue: int = 1 << 20
    burst_window_s: float = 0.02

    def __post_init__(self) -> None:
        check(self.rate_bps > 0 and not math.isnan(self.rate_bps), "rate_bps", self.rate_bps, "must be > 0")
        check(self.delay_s >= 0 and math.isfinite(self.delay_s), "delay_s", self.delay_s, "must be >= 0")
        check(self.jitter_s >= 0 and math.isfinite(self.jitter_s), "jitter_s", self.jitter_s, "must be >= 0")
        check(self.burst is None or self.burst >= 1, "burst", self.burst, "must be >= 1 byte")
        check(1 <= self.chunk <= 1 << 24, "chunk", self.chunk, "must be in [1, 16 MiB]")
        check(self.queue >= 1, "queue", self.queue, "must be >= 1 byte")
        check(0 < self.burst_window_s <= 1, "burst_window_s", self.burst_window_s, "must be in (0, 1] s")

    def burst_for(self, rate_bps: float) -> int:
        """Burst in bytes at ``rate_bps``: the configured one, else max(floor, rate × burst_window)."""
        if self.burst is not None:
            return self.burst
        if math.isinf(rate_bps):
            return 1 << 30
        return max(DEFAULT_BURST_FLOOR, int(rate_bps * self.burst_window_s / 8))


#: Shared default shape: 100 Mbit/s, no delay.
DEFAULT_SHAPE = LinkShape()
