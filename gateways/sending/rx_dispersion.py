"""A link's rate from the receiver's own arrival times: the dispersion of each large message's tail.

Why at the receiver: the sender's delivery sample (:mod:`gateways.sending.link_times`, ``[first chunk out,
ack − RTprop]``) cannot tell a token bucket's burst from the link's rate. A policed link (a cloud uplink,
the emulated ``transports.shaped`` link) lets an idle link's first ~20 ms of rate go at once, and each
iteration's aggregate follows an idle gap, so at 30 Mbit/s every ~280 kB sample read ≈ 280 / 205 × 30 ≈
41 Mbit/s (docs/scheduler.md, "The links' delivery rate").

Packet-train dispersion (pathrate; Dovrolis, Ramanathan & Moore, "Packet-dispersion techniques and a
capacity-estimation methodology", IEEE/ACM ToN 2004, §II: a train of back-to-back packets leaves the
bottleneck spaced by its transmission time, so the train's bytes after its first packet over the time
from the first to the last arrival is the bottleneck's rate): within one large message the sender was
backlogged — the whole frame was queued for the transport at once — so the arrival of its bytes is paced
by the bottleneck, and a burst only speeds up the head. So per message of at least ``rx_min_bytes`` on the
wire, the sample is its *tail*: the bytes read after the read that carried the message's half-way byte,
over the time from that read to the read that carried its last byte. That removes the burst whenever the
burst is shorter than half the message (75 kB at 30 Mbit/s against ~140 kB), needs no clock agreement and
no round-trip estimate, and is the same code for TCP over a WAN and for an emulated link (nothing is read
from the emulator). A tail shorter than ``rx_min_tail_s`` gives no sample: it crossed inside a burst (or
one batched read) and reads as any rate at all; it is counted (``fast``), so that the scheduler's filter
does not keep only the tails that something slowed past the threshold (scheduler/control/link_rx.py).

The bytes of the half-way read itself are left out (their arrival before that read's time is unknown),
exactly as the first packet of a train is. Positions are in the link's byte stream: the I/O adapter feeds
every read (time, size) and, when a large message completes, its end position (the bytes read less those
not yet cut into frames) and its wire size. A read that carries the end of one message and the start of
the next is handled by positions, not reads. Bounded memory: a ring of the last ``rx_ring_reads`` reads
(time, cumulative bytes); a message whose half-way byte has left the ring gives no sample.

Sans-IO: times are passed in.
"""

from __future__ import annotations

from collections import deque

from gateways.sending.config import DeliveryConfig

__all__ = ["RxDispersion"]


class RxDispersion:
    """One incoming link's tail-dispersion samples, summed: ``rx_bytes`` over ``rx_s`` (module docstring)."""

    def __init__(self, config: DeliveryConfig | None = None) -> None:
        self.cfg = config if config is not None else DeliveryConfig()
        #: bytes read on this link, all connections together (stream positions count from here)
        self.total = 0
        #: (time, cumulative bytes after the read), oldest first; only the current connection's reads
        self._reads: deque[tuple[float, int]] = deque(maxlen=self.cfg.rx_ring_reads)
        #: cumulative tail bytes and tail seconds of the samples taken (the telemetry's rx_bytes / rx_s)
        self.rx_bytes = 0
        self.rx_s = 0.0
        self.samples = 0
        #: large messages whose tail was too short to measure (the scheduler's censored median counts them
        #: as fast: leaving them out would keep only the tails something slowed past the threshold)
        self.fast = 0
        #: the last sample (bytes, seconds), for logs and tests
        self.last: tuple[int, float] | None = None
        #: what the last :meth:`message` call gave: its sample, or whether its tail was too fast to time
        #: (both unset: it was not timeable at all), for the probe trains (gateways/sending/probe_trains.py)
        self.latest: tuple[int, float] | None = None
        self.latest_fast = False

    def new_stream(self) -> None:
        """A new connection: its bytes are not contiguous with the old one's, so the ring starts over."""
        self._reads.clear()

    def read(self, now: float, nbytes: int) -> None:
        """``nbytes`` were read from the link at ``now``."""
        if nbytes <= 0:
            return
        self.total += nbytes
        self._reads.append((now, self.total))

    def message(self, end: int, size: int) -> tuple[int, float] | None:
        """A message of ``size`` wire bytes ended at stream position ``end`` (``total`` less the bytes read
        but not yet framed); returns the tail sample (bytes, seconds) it gave, if any."""
        cfg = self.cfg
        self.latest, self.latest_fast = None, False
        if not cfg.rx_enabled or size < cfg.rx_min_bytes or end > self.total or not self._reads:
            return None
        half = end - size // 2
        t_half: float | None = None
        pos_half = 0
        t_end: float | None = None
        # newest first: the message is recent, its reads are at the ring's end. A read covers the
        # positions (previous read's cumulative, its cumulative]; the half-way read is known only once a
        # read ending before ``half`` is found (else the half-way byte may have come in a forgotten read)
        for t, cum in reversed(self._reads):
            if cum < half:
                break
            if cum >= end:
                t_end = t  # going backwards, the last read reaching ``end`` is the one that carried it
            t_half, pos_half = t, cum
        else:
            return None
        if t_end is None or t_half is None:
            return None
        nbytes = end - pos_half
        seconds = t_end - t_half
        if nbytes <= 0 or seconds < cfg.rx_min_tail_s:
            self.fast += 1  # inside one read, or within a burst: any rate at all, but not a slow one
            self.latest_fast = True
            return None
        self.rx_bytes += nbytes
        self.rx_s += seconds
        self.samples += 1
        self.last = self.latest = (nbytes, seconds)
        return self.last
