"""Per link (one direction), its rate from the receiver's tail dispersion, filtered so that the threshold
that makes a tail a sample does not bias it.

Why a censored median. A receiving gateway measures a large message's tail only when it took at least
``rx_min_tail_s`` (gateways/sending/rx_dispersion.py: a shorter one may have crossed inside a burst); a
shorter tail is counted as *fast* (``link.<sender>.rx_fast``). Without the fast ones the samples are a
biased selection whenever the typical tail is near the threshold: in the real-daemon step run, after the
rise back to 100 Mbit/s the plan's ~200 kB aggregates had tails of ~10 ms, and only those that a loaded
receiver or sender had slowed past 20 ms were samples — the healthy 100 Mbit/s links read 44-72 Mbit/s
(docs/scheduler.md). Counting the fast tails as +∞ and taking the median over all recent tails (weighted
by count) gives the median tail: measured when most tails are measurable (a>c at 30 Mbit/s: 23-34 Mbit/s
windows), "fast" when most are not — then the direction carries its messages faster than it can be
measured at this plan, it is not the bottleneck, and it is left out (its sender's sample too: the sender
cannot measure a message the receiver saw cross in a few ms either, it only adds its round trip).

Why a median and not BBR's max: on the receiver a CPU stall batches reads, which makes a tail read slow
(the stall inside it) *or* fast (the stall just before its half-way read, the rest read at once): both
tails are there — 3.8-36 Mbit/s windows on a 30 Mbit/s link into the loaded root gateway, and 118-198
Mbit/s windows on 100 Mbit/s links — so a max filter takes the fast outliers. ``link_rx_filter = "max"``
keeps the max over the measured windows (the fast majority still leaves a link out).

Sans-IO: counters and ``now`` are passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from wanrt.errors import RemoteProtocolError

__all__ = ["RxLink", "weighted_median"]


def weighted_median(values: list[tuple[float, float]]) -> float:
    """The smallest value whose cumulative weight reaches half the total (``values``: (value, weight > 0))."""
    total = sum(w for _, w in values)
    acc = 0.0
    for v, w in sorted(values):
        acc += w
        if acc >= total / 2:
            return v
    return math.inf if not values else max(v for v, _ in values)


@dataclass(slots=True)
class RxLink:
    """One direction's receiver-tail windows: rates with their tail counts, and the fast tails."""

    bytes0: float
    secs0: float
    n0: float
    fast0: float
    seen_at: float
    #: (time, rate bit/s or inf for fast tails, tails)
    samples: list[tuple[float, float, float]] = field(default_factory=list)
    rate_bps: float | None = None
    #: when the filter last gave a rate, and when it last said "fast" (the newer one holds)
    measured_at: float | None = None
    fast_at: float | None = None
    #: the last measured window (bytes, tail seconds)
    window: tuple[float, float] = (0.0, 0.0)

    def observe(
        self,
        *,
        nbytes: float,
        seconds: float,
        n: float | None,
        fast: float | None,
        now: float,
        min_s: float,
        max_age: float,
        min_samples: int,
        how: str,
    ) -> float | None:
        """Cumulative counters (``n``: measured tails, ``fast``: too short to measure; None from a
        gateway that does not report them); returns a new window's rate (bit/s), if one completed."""
        vals = (nbytes, seconds, now, 0.0 if n is None else n, 0.0 if fast is None else fast)
        if not all(math.isfinite(v) for v in vals) or min(vals[:2]) < 0 or min(vals[3:]) < 0:
            raise RemoteProtocolError("rx counters must be finite and >= 0", value=vals)
        self.seen_at = now
        n_now = self.n0 if n is None else n
        fast_now = self.fast0 if fast is None else fast
        if nbytes < self.bytes0 or seconds < self.secs0 or n_now < self.n0 or fast_now < self.fast0:
            self.bytes0, self.secs0, self.n0, self.fast0 = nbytes, seconds, n_now, fast_now  # a restart
            return None
        self.samples = [s for s in self.samples if now - s[0] <= max_age]
        if fast_now > self.fast0:
            self.samples.append((now, math.inf, fast_now - self.fast0))
            self.fast0 = fast_now
        rate = None
        if seconds - self.secs0 >= min_s:
            rate = 8.0 * (nbytes - self.bytes0) / (seconds - self.secs0)
            tails = max(1.0, n_now - self.n0) if n is not None else 1.0
            self.samples.append((now, rate, tails))
            self.window = (nbytes - self.bytes0, seconds - self.secs0)
            self.bytes0, self.secs0, self.n0 = nbytes, seconds, n_now
        if sum(w for _, _, w in self.samples) < min_samples:
            return rate  # too few tails for the filter
        median = weighted_median([(r, w) for _, r, w in self.samples])
        measured = [r for _, r, _ in self.samples if math.isfinite(r)]
        if math.isinf(median) or not measured:
            self.fast_at = now
            self.rate_bps = None
        else:
            self.rate_bps = median if how == "median" else max(measured)
            self.measured_at = now
        return rate

    def judged(self, now: float, max_age: float) -> tuple[str, float | None]:
        """("rate", bit/s) if the newest fresh judgement is a rate, ("fast", None) if it is "fast",
        ("none", None) if neither is fresh."""
        m = self.measured_at if self.measured_at is not None and now - self.measured_at <= max_age else None
        f = self.fast_at if self.fast_at is not None and now - self.fast_at <= max_age else None
        if f is not None and (m is None or f >= m):
            return "fast", None
        if m is not None and self.rate_bps is not None:
            return "rate", self.rate_bps
        return "none", None
