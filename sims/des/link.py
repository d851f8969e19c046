"""One direction of a modelled WAN link: a byte stream with a rate, a delay, jitter and loss.

What is modelled, and why this way:

* **Rate** (bytes/s), serialised: one write at a time, in order, like a TCP sender's link. A write of
  ``n`` bytes that starts at ``s`` (when the previous one is out) leaves at the time its last byte has
  been serialised. The rate may follow a :class:`~transports.traces.BandwidthTrace` (a seed-002 profile or
  a trace file): serialisation integrates the rate piecewise over the trace's steps, so a rate change
  in the middle of a write takes effect for the rest of it.
* **Send buffer**: the writer may have at most ``buffer_bytes`` written but not yet serialised (the
  socket's send buffer). A slow link therefore backs up into the gateway's EDF queue, where urgent
  layers overtake — exactly as the daemon's bounded transport buffer does.
* **One-way delay** plus **jitter** (uniform in ``[0, jitter_s]``). A TCP stream never reorders, so a
  write never arrives before the previous one: jitter only stretches gaps.
* **Loss**: a byte stream cannot drop bytes. A lost segment is retransmitted about one round trip later
  and everything behind it waits (head-of-line blocking). So loss is modelled as: with probability
  ``loss`` per write, that write arrives ``2 × delay`` later (one RTT); later writes queue behind it.
  Congestion-window collapse after a loss is not modelled.
* **Rate follows the sender's pacer** (``follow_pacer``): seed 002's network model, where the rate a
  scheduler grants a link *is* its speed (``tools/bench_gateway_straggler.py`` emulates the same):
  capacity = rate × (pacer rate / base rate).

Sans-IO: times are passed in; the link returns when things happen and the simulation schedules them.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from transports.traces import BandwidthTrace

__all__ = ["LinkModel", "LinkSample", "WriteTiming"]


class WriteTiming(NamedTuple):
    """When a write starts and ends serialisation, and when its last byte arrives at the receiver.

    A NamedTuple: one is built per simulated write (~4 000 per 1 000-site round), and a frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__``."""

    start: float
    end: float
    arrival: float
    lost: bool


@dataclass(slots=True)
class LinkSample:
    """Per-link time series (sampled by the simulation): time, bytes written so far, backlog, rate."""

    t: list[float] = field(default_factory=list)
    bytes_total: list[int] = field(default_factory=list)
    queue_bytes: list[int] = field(default_factory=list)
    rate_bps: list[float] = field(default_factory=list)


class LinkModel:
    """One direction ``src → dst``; see the module docstring."""

    def __init__(
        self,
        src: str,
        dst: str,
        *,
        rate_bps: float,
        delay_s: float,
        jitter_s: float = 0.0,
        loss: float = 0.0,
        buffer_bytes: int = 256 * 1024,
        trace: BandwidthTrace | None = None,
        rng: np.random.Generator | None = None,
        scale: Callable[[], float] | None = None,
    ) -> None:
        self.src, self.dst = src, dst
        self.rate_Bps = rate_bps / 8.0
        self.delay_s = delay_s
        self.jitter_s = jitter_s
        self.loss = loss
        self.buffer_bytes = buffer_bytes
        self.trace = trace
        self._times: list[float] = [] if trace is None else [t for t, _ in trace.steps]
        self._rng = rng if rng is not None else np.random.default_rng(0)
        self._scale = scale
        self.busy_until = 0.0
        self.last_arrival = 0.0
        self.bytes_total = 0
        self.writes = 0
        self.lost_writes = 0
        self.busy_s = 0.0  # time spent serialising (for the mean rate while busy)
        self._inflight: deque[tuple[float, int]] = deque()  # (serialisation end, bytes) not yet out, in order
        self.queued = 0
        self.series = LinkSample()

    # -- rate ---------------------------------------------------------------------------------------

    def rate_at(self, t: float) -> float:
        """Capacity in bytes/s at time ``t`` (trace step in force, scaled by the sender's pacer)."""
        r = self.rate_Bps
        if self.trace is not None:
            tr = self.trace.rate_at(t)
            if tr is not None:
                r = tr / 8.0
        if self._scale is not None:
            r *= self._scale()
        return r

    def _next_step(self, t: float) -> float:
        """The next time after ``t`` at which the trace may change the rate (inf: never)."""
        trace = self.trace
        if trace is None:
            return math.inf
        period = trace.period
        base = 0.0
        local = t
        if period is not None and t >= period:
            cycles = math.floor(t / period)
            base, local = cycles * period, t - cycles * period
        i = int(np.searchsorted(self._times, local, side="right"))
        if i < len(self._times):
            return base + self._times[i]
        return base + period if period is not None else math.inf

    def serialise(self, start: float, nbytes: int) -> float:
        """When ``nbytes`` starting at ``start`` have left (the rate integrated over trace steps)."""
        if self.trace is None:
            return start + nbytes / self.rate_at(start)
        t, left = start, float(nbytes)
        for _ in range(1_000_000):
            rate = self.rate_at(t)
            step = self._next_step(t)
            can = rate * (step - t)
            if can >= left:
                return t + left / rate
            left -= can
            t = step
        raise RuntimeError("trace integration did not converge")  # pragma: no cover - 1e6 steps per write

    # -- writes -------------------------------------------------------------------------------------

    def has_room(self, now: float) -> bool:
        """The writer may write now (the send buffer is below its bound)."""
        inflight = self._inflight
        while inflight and inflight[0][0] <= now:  # _drain, inlined: once per write
            self.queued -= inflight.popleft()[1]
        return self.queued < self.buffer_bytes

    def room_at(self) -> float:
        """When the oldest write still in the buffer is out (the writer's next chance when full)."""
        return self._inflight[0][0] if self._inflight else 0.0

    def _drain(self, now: float) -> None:
        inflight = self._inflight
        while inflight and inflight[0][0] <= now:
            self.queued -= inflight.popleft()[1]

    def write(self, nbytes: int, now: float) -> WriteTiming:
        """Accept one write at ``now``; returns its timing (the caller schedules the arrival)."""
        inflight = self._inflight
        while inflight and inflight[0][0] <= now:  # _drain, inlined: once per write
            self.queued -= inflight.popleft()[1]
        start = max(now, self.busy_until)
        end = self.serialise(start, nbytes)
        self.busy_until = end
        self.busy_s += end - start
        arrival = end + self.delay_s
        if self.jitter_s > 0:
            arrival += float(self._rng.random()) * self.jitter_s
        lost = self.loss > 0 and float(self._rng.random()) < self.loss
        if lost:
            arrival += 2.0 * self.delay_s
            self.lost_writes += 1
        arrival = max(arrival, self.last_arrival)  # a stream keeps its order
        self.last_arrival = arrival
        self.bytes_total += nbytes
        self.writes += 1
        self._inflight.append((end, nbytes))
        self.queued += nbytes
        return WriteTiming(start, end, arrival, lost)

    def sample(self, now: float, rate_bps: float | None = None) -> None:
        self._drain(now)
        s = self.series
        s.t.append(now)
        s.bytes_total.append(self.bytes_total)
        s.queue_bytes.append(self.queued)
        s.rate_bps.append(self.rate_at(now) * 8.0 if rate_bps is None else rate_bps)
